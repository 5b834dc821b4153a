"""The consumer groups of one dispatcher's shard: events in, sends and commits out (no I/O of its own).

Strategy: the dispatcher owning store shard ``s`` owns partitions ``p`` with ``p % shards == s`` of every
durable topic, and keeps here one :class:`fanout.topics.groups.GroupCore` per (topic, group) with members.
It reads its own store (``ShardReader``: ``topic_specs``, ``topic_bounds``, ``topic_committed``,
``topic_read``; local LMDB reads, microseconds) but never writes: :meth:`take_commits` returns the
``topic_commit`` ops the dispatcher puts in ONE WriteBatch per tick.

- Joins and leaves come from every node (each node sends them to every dispatcher); a join names the
  shared subscription's inner filter, which names the durable topic(s) with that filter. A group with
  no commits in a partition starts where the first join's ``start`` says (latest by default).
- :meth:`poll` learns each group partition's log end (``topic_bounds``; the append path needs not know
  about groups), and offsets pruned below a group's position count as consumed.
- :meth:`drain` asks each group what to send and reads those entries, queued per node as
  :class:`fanout.topics.groups_records.GroupSend` tuples for the node's next ``deliver`` call.
- Bounds: ``max_groups`` (topic, group) pairs per shard and ``max_members`` per group; a join past
  either is refused (counted in ``refused``, logged once per pair).
"""
from __future__ import annotations

from typing import Any

import structlog

from fanout.topics.groups import GroupCore, parse_start
from fanout.topics.groups_records import (
    EV_GROUP_ACK, EV_GROUP_FAILED, EV_GROUP_JOIN, EV_GROUP_LEAVE, GroupSend,
)

log = structlog.get_logger(__name__)

READ_BYTES = 4 << 20  # at most this much payload read for one group partition per drain


class ShardGroups:
    """See the module docstring.

    Args:
        store: the shard's store (a ``ShardReader``).
        shard, shards: this shard and the shard count (partition ``p`` lives in shard ``p % shards``).
        max_inflight: messages of one group partition in flight at once.
        max_groups: (topic, group) pairs this shard keeps.
        max_members: members of one group.
    """

    def __init__(self, store: Any, shard: int, shards: int, *, max_inflight: int = 256, max_groups: int = 10_000,
                 max_members: int = 1_000) -> None:
        self.store = store
        self.shard = shard
        self.shards = shards
        self.max_inflight = max_inflight
        self.max_groups = max_groups
        self.max_members = max_members
        self.groups: dict[tuple[str, str], GroupCore] = {}
        self._by_filter: dict[str, list[str]] | None = None  # inner filter -> durable topic names
        self._out: dict[str, list[tuple]] = {}
        self.refused = 0
        self.sent = 0
        self.acked = 0

    # -- catalog ----------------------------------------------------------------------------------------------

    def topics_for(self, topic_filter: str) -> list[str]:
        """Durable topics whose filter is ``topic_filter`` (the catalog is re-read for an unknown filter: a
        topic may have been created at run time)."""
        names = self._by_filter.get(topic_filter) if self._by_filter is not None else None
        if names is None:
            by: dict[str, list[str]] = {}
            for name, spec in self.store.topic_specs().items():
                by.setdefault(spec.filter, []).append(name)
            self._by_filter = by
            names = by.get(topic_filter, [])
        return names

    def _partitions(self, topic: str) -> list[int]:
        spec = self.store.topic_specs()[topic]
        n = spec.partitions or self.shards
        return [p for p in range(n) if p % self.shards == self.shard]

    # -- events -----------------------------------------------------------------------------------------------

    def on_event(self, node: str, e: tuple) -> None:
        """Apply one :mod:`fanout.topics.groups_records` event from ``node``."""
        kind = e[0]
        if kind == EV_GROUP_ACK:
            _, cid, gen, topic, group, partition, offset = e
            g = self.groups.get((topic, group))
            if g is not None and g.ack(cid, gen, partition, offset):
                self.acked += 1
        elif kind == EV_GROUP_JOIN:
            _, cid, gen, group, topic_filter, window, start = e
            for topic in self.topics_for(topic_filter):
                self._join(node, cid, gen, topic, group, window, start)
        elif kind == EV_GROUP_LEAVE:
            _, cid, gen, group, topic_filter = e
            for (topic, gname), g in list(self.groups.items()):
                if group is None or (gname == group and topic in self.topics_for(topic_filter)):
                    g.leave(cid, node, gen)
                    self._forget_if_idle(topic, gname)
        elif kind == EV_GROUP_FAILED:
            _, cid, gen, topic, group, partition, offset, evict = e
            g = self.groups.get((topic, group))
            if g is not None:
                g.failed(cid, gen, partition, offset, evict)
                if evict:
                    log.warning("group member evicted: it cannot take this topic's messages", client_id=cid,
                                topic=topic, group=group, partition=partition, offset=offset)

    def _join(self, node: str, cid: str, gen: int, topic: str, group: str, window: int, start: Any) -> None:
        key = (topic, group)
        g = self.groups.get(key)
        if g is None:
            if len(self.groups) >= self.max_groups:
                self._refuse("topics.max_groups", cid, topic, group, limit=self.max_groups)
                return
            try:
                first = parse_start(start)
            except ValueError:
                first = "latest"
            g = self.groups[key] = GroupCore(topic, group, self.max_inflight)
            for p in self._partitions(topic):
                low, high = self.store.topic_bounds(topic, p)
                g.open_partition(p, self.store.topic_committed(topic, group, p), low, high, first)
        elif cid not in g.members and len(g.members) >= self.max_members:
            self._refuse("topics.max_group_members", cid, topic, group, limit=self.max_members)
            return
        # every dispatcher serves the member: each takes its share of the member's window
        g.join(cid, node, gen, max(1, min(window, self.max_inflight) // self.shards))

    def _refuse(self, bound: str, cid: str, topic: str, group: str, **kw: Any) -> None:
        self.refused += 1
        log.warning("consumer group join refused by a bound", bound=bound, client_id=cid, topic=topic, group=group,
                    shard=self.shard, **kw)

    def _forget_if_idle(self, topic: str, group: str) -> None:
        g = self.groups.get((topic, group))
        if g is not None and g.idle:
            del self.groups[(topic, group)]

    def node_down(self, node: str) -> None:
        """Every member connected through ``node`` left (its messages go to the other members)."""
        for (topic, group), g in list(self.groups.items()):
            for cid in g.members_on(node):
                g.leave(cid, node)
            self._forget_if_idle(topic, group)
        self._out.pop(node, None)

    def call_failed(self, sends: list[tuple]) -> None:
        """A ``deliver`` call carrying these :class:`GroupSend` tuples failed: they go again."""
        for cid, gen, topic, group, partition, offset, *_rest in sends:
            g = self.groups.get((topic, group))
            if g is not None:
                g.failed(cid, gen, partition, offset)

    # -- the tick ---------------------------------------------------------------------------------------------

    @property
    def active(self) -> bool:
        """Some group has a member here (worth polling)."""
        return any(g.members for g in self.groups.values())

    def poll(self) -> None:
        """Learn each member-served partition's log bounds (new appends; retention's pruning)."""
        bounds = self.store.topic_bounds
        for g in self.groups.values():
            if not g.members:
                continue
            for ps in g.iter_partitions():
                low, high = bounds(g.topic, ps.partition)
                if high > ps.high:
                    g.appended(ps.partition, high)
                if low > ps.committed + 1:
                    g.skipped(ps.partition, low - 1)

    def drain(self) -> int:
        """Plan every group's sends and read them from the log into the per-node queues; returns how many."""
        n = 0
        read = self.store.topic_read
        build = GroupSend.build
        for g in self.groups.values():
            if not g.members:
                continue
            for s in g.plan():
                m = s.member
                count = s.last - s.first + 1
                entries = read(g.topic, s.partition, s.first, count, READ_BYTES)
                got = entries[-1].offset if entries else s.first - 1
                if entries and entries[0].offset > s.first:  # pruned meanwhile: skipped ones count as consumed
                    g.skipped(s.partition, entries[0].offset - 1)
                out = self._out.setdefault(m.node, [])
                for e in entries:
                    out.append(build(m.client_id, m.generation, g.topic, g.group, s.partition, e.offset, e.ts_ms,
                                     e.mqtt_topic, e.client_id, e.qos, e.payload, e.properties))
                n += len(entries)
                if got < s.last:  # fewer than planned (the byte bound): the rest goes in a later drain
                    g.shorten(s.partition, got + 1)
        self.sent += n
        return n

    def nodes(self) -> list[str]:
        """Nodes with group sends queued."""
        return [node for node, sends in self._out.items() if sends]

    def take(self, node: str) -> list[tuple]:
        """The queued :class:`GroupSend` tuples for ``node`` (offset order per partition)."""
        return self._out.pop(node, [])

    def take_commits(self) -> list[tuple[str, str, int, int]]:
        """``(topic, group, partition, offset)`` per group partition whose position moved since the last call."""
        out = []
        for (topic, group), g in list(self.groups.items()):
            out.extend((topic, group, p, off) for p, off in g.take_commits())
            self._forget_if_idle(topic, group)
        return out

    def commits_failed(self, items: list[tuple[str, str, int, int]]) -> None:
        """The write of these commits failed: hand them out again at the next :meth:`take_commits`."""
        for topic, group, partition, offset in items:
            g = self.groups.get((topic, group))
            ps = g.parts.get(partition) if g is not None else None
            if ps is not None and ps.written >= offset:
                ps.written = offset - 1

    def stats(self) -> dict[str, int]:
        """Counters for ``fanout status``: groups and members served here, messages sent and acknowledged, joins
        refused by a bound."""
        return {"groups": len(self.groups), "group_members": sum(len(g.members) for g in self.groups.values()),
                "group_sent": self.sent, "group_acked": self.acked, "group_refused": self.refused}

    def info(self) -> list[dict[str, Any]]:
        """Per (topic, group): members and per partition committed offset and log end (status, ``$SYS``)."""
        return [{"topic": t, "group": gname, "members": sorted(g.members),
                 "partitions": {p: {"committed": c, "high": h, "lag": h - c - 1} for p, (c, h) in g.lag().items()}}
                for (t, gname), g in self.groups.items()]


__all__ = ["ShardGroups", "READ_BYTES"]
