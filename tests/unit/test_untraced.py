"""actors.untraced: an actor's own calls and its channel handlers skip the tracing shim Ray puts on every method
(the class is made an actor class by ``ray.remote``, as in production; no Ray runtime needed)."""
from __future__ import annotations

import asyncio

import ray

from actors.untraced import plain, unwrap_private_methods


class _Callee:
    def __init__(self) -> None:
        unwrap_private_methods(self)
        self.seen: list = []

    def _hot(self, x):
        self.seen.append(x)
        return x + 1

    async def handler(self, x):
        return self._hot(x)


def _instance():
    modified = ray.remote(num_cpus=0)(_Callee).__ray_metadata__.modified_class  # what the actor process runs
    assert hasattr(modified._hot, "__wrapped__") and hasattr(modified.handler, "__wrapped__")  # Ray's shims
    return modified()


def test_private_methods_are_bound_plain_on_the_instance_public_ones_stay_wrapped_on_the_class():
    obj = _instance()
    assert not hasattr(obj._hot, "__wrapped__") and obj._hot(1) == 2
    assert "handler" not in vars(obj)  # Ray's remote calls still find the class's (wrapped) method
    assert hasattr(type(obj).handler, "__wrapped__")


def test_plain_handler_runs_the_method_itself():
    obj = _instance()
    h = plain(obj, "handler")
    assert not hasattr(h, "__wrapped__")
    assert asyncio.run(h(41)) == 42 and obj.seen == [41]
