"""ControllerSource's calls to the shards (no Ray started: the calls and their answers are stood in for): a primary
replaced during a read or a commit is asked once more, on the handles the controller gives then; a second failure
is raised, not retried without end."""
from __future__ import annotations

import pytest
import ray

from cluster.cli.consume import ControllerSource


class Shards(ControllerSource):
    """The calls recorded; each wait fails while ``fail`` > 0 (with ``error``), then answers."""

    def __init__(self, fail: int, error: BaseException) -> None:
        super().__init__(controller=None)
        self.fail, self.error, self.calls, self.handle_fetches = fail, error, [], 0

    def _call(self, method, items, partition_of):
        if self._dispatchers is None:
            self.handle_fetches += 1
            self._dispatchers = ["d0"]
        self.calls.append(method)
        # one shard: its answer is one result per request for a read, the count committed for a commit
        return {0: list(range(len(items)))}, [[(i, "page") for i in items] if method == "topic_read" else len(items)]

    def _get(self, refs):
        if self.fail:
            self.fail -= 1
            raise self.error
        return refs


REPLACED = ray.exceptions.RayActorError()


@pytest.mark.parametrize("op", ["read", "commit"])
def test_a_replaced_primary_is_asked_once_more_on_fresh_handles(op):
    src = Shards(fail=1, error=REPLACED)
    got = getattr(src, op)([("t", 0, 0, 5), ("t", 0, 5, 5)])
    assert got == ([(("t", 0, 0, 5), "page"), (("t", 0, 5, 5), "page")] if op == "read" else 2)
    assert src.calls == ["topic_" + op] * 2 and src.handle_fetches == 2


@pytest.mark.parametrize("op", ["read", "commit"])
def test_a_second_failure_is_raised(op):
    src = Shards(fail=5, error=REPLACED)
    with pytest.raises(ray.exceptions.RayActorError):
        getattr(src, op)([("t", 0, 0, 5)])
    assert src.calls == ["topic_" + op] * 2


def test_a_timed_out_read_is_asked_again_but_a_timed_out_commit_is_raised():
    timeout = ray.exceptions.GetTimeoutError()
    assert Shards(fail=1, error=timeout).read([("t", 0, 0, 1)]) == [(("t", 0, 0, 1), "page")]
    with pytest.raises(ray.exceptions.GetTimeoutError):
        Shards(fail=1, error=timeout).commit([("t", "g", 0, 1)])
