"""The dispatcher's consumer groups (thin: the logic is :mod:`fanout.topics.groups_shard`).

What the dispatcher calls, each from its own small method: :meth:`DispatcherGroups.on_event` for the
group events of a node's batch, :meth:`tick` (learn appends, plan and read sends) from its drain,
:meth:`take` for a node's ``deliver`` call, and :meth:`commit_batch` once per tick: ONE ``WriteBatch`` with
one ``topic_commit`` op per (topic, group, partition) whose position moved.
"""
from __future__ import annotations

from typing import Any

from fanout.request_control import decode_topic_ack
from fanout.topics.groups_shard import ShardGroups
from storage.batch import WriteBatch


def group_bounds(config: Any) -> dict[str, int]:
    """The consumer-group bounds from config (``fanout.topic_group_*``), defaults without config."""
    if config is None:
        return {}
    f = config.fanout
    return {"max_inflight": f.topic_group_inflight, "max_groups": f.topic_groups, "max_members": f.topic_group_members}


class DispatcherGroups(ShardGroups):
    """:class:`ShardGroups` plus the dispatcher's tick verbs."""

    def tick(self) -> int:
        """Learn the log ends of the served partitions and queue what goes out now; returns how many."""
        if not self.active:
            return 0
        self.poll()
        return self.drain()

    @property
    def has_work(self) -> bool:
        """Sends queued for some node, or commits to write."""
        return bool(self._out) or any(ps.committed > ps.written for g in self.groups.values()
                                      for ps in g.iter_partitions())

    def commit_batch(self, now_ms: int) -> tuple[WriteBatch, list[tuple[str, str, int, int]]] | None:
        """One WriteBatch of this tick's commits (and the commits, for :meth:`commits_failed`), or None."""
        items = self.take_commits()
        if not items:
            return None
        batch = WriteBatch()
        for topic, group, partition, offset in items:
            batch.topic_commit(topic, group, partition, offset, now_ms)
        return batch, items

    def topic_info(self, topic: str) -> dict | None:
        """A topic-info op: the topic's filter and partition count from shard 0's catalog (other shards: None)."""
        if self.shard != 0:
            return None
        spec = self.store.topic_specs().get(topic)
        return None if spec is None else {"filter": spec.filter, "partitions": spec.partitions or self.shards}

    def explicit_commit(self, op: str, now_ms: int) -> tuple[WriteBatch | None, dict | None]:
        """A topic-ack op (:mod:`fanout.request_control`): the batch to write and no answer yet, or no batch
        and the answer (None: the partition lives in another shard; ``{"error"}``: unknown topic/partition).
        A commit past the log's end is clamped to its last offset."""
        topic, group, partition, upto = decode_topic_ack(op)
        if partition % self.shards != self.shard:
            return None, None
        spec = self.store.topic_specs().get(topic)
        if spec is None or partition >= (spec.partitions or self.shards):
            return None, {"error": f"no durable topic {topic!r} with partition {partition}"}
        _low, high = self.store.topic_bounds(topic, partition)
        upto = min(upto, high - 1)
        if upto < 0:
            return None, self.explicit_committed(op)
        return WriteBatch().topic_commit(topic, group, partition, upto, now_ms), None

    def explicit_committed(self, op: str) -> dict:
        """After the batch of :meth:`explicit_commit` is durable: the group (if served here) moves, and the
        answer is the group's stored position."""
        topic, group, partition, upto = decode_topic_ack(op)
        g = self.groups.get((topic, group))
        committed = self.store.topic_committed(topic, group, partition)
        if g is not None and committed is not None:
            g.commit_external(partition, committed)
        return {"committed": committed}


__all__ = ["DispatcherGroups", "group_bounds"]
