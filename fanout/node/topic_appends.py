"""Appends of one node to the durable topics' logs: publishes held unacknowledged until their append is durable.

Strategy: the broker routes a publish on a durable topic live at once and hands it over as an
:class:`fanout.mqtt.hooks.IngestTicket` with ``routed=True`` (the same deferred acknowledgement as ingest:
``complete_publish`` / ``reject_publish``, the packet id held in the connection's ``pending_ingest``). Here:

1. :meth:`TopicAppends.add` matches the topic (:class:`fanout.topics.matcher.DurableTopics`), makes one
   :class:`fanout.topics.records.AppendItem` per durable topic it goes to, and queues each on the shard that
   holds its partition;
2. :meth:`TopicAppends.take` hands the actor one batch per shard that has no ``topic_append`` call in flight, or
   already ``full_batch`` items and fewer than :data:`MAX_CALLS_PER_SHARD` calls in flight (what arrives
   meanwhile makes the next, so the batches grow with the load). The dispatcher writes ONE WriteBatch per call
   (concurrent calls join one group commit), replicated before it answers, and applies the next call's while
   the replicas acknowledge the previous one; calls to one shard start in the order they were made, so a
   partition's entries keep the order of the publishes. ``full_batch`` is :data:`FULL_BATCH` (16) over the direct
   channels, where a call costs about what one or two appends do: without a second call, the appends that
   arrive while a call is out wait for its whole round trip (commit, the replica's ack, the reply) instead of
   about one apply, and a few paho-like clients (32 in flight each: 128 on one shard, 64 per shard on two) never
   fill a bigger batch (measured again on one shard: 8, 16 or 32 items, 2 or 3 calls, all within noise).
   Over Ray calls (``cluster.direct_channels = false``, ~1.8 ms of CPU per call) it is
   :data:`FULL_BATCH_RAY` (128);
3. :meth:`TopicAppends.done` settles the call's tickets: a ticket is acknowledged (PUBACK for QoS 1, PUBREC for
   QoS 2) when every shard call it was part of succeeded, else refused (MQTT 5: negative PUBACK/PUBREC, 0x97 for
   a full store, else 0x80; 3.1.1: the connection is closed without PUBACK, the client resends after
   reconnecting). Nothing is acknowledged that is not durable. The acknowledgements of one connection go out in
   the order it published (MQTT-4.6.0-2), whichever shard answers first.

Bound: ``fanout.max_pending_appends`` tickets and ``fanout.max_pending_append_bytes`` payload bytes held by the
node. Holding the acknowledgements is the back-pressure (a client's in-flight window fills, MQTT 5's Receive
Maximum too); past the bound a QoS 1/2 publish is refused at once as above and a QoS 0 one is routed but not
appended; both are counted (``appends_refused`` in ``fanout status``, ``$SYS/fanout/appends/refused``) and
logged once per second.
"""
from __future__ import annotations

import time
from collections import deque
from typing import Any, Protocol

import structlog

from fanout.mqtt.hooks import IngestTicket
from fanout.mqtt.reason_codes import ReasonCode as RC
from fanout.node.ingest_rounds import _unavailable
from fanout.topics.matcher import DurableTopics
from fanout.topics.records import AppendItem, kept_properties

log = structlog.get_logger(__name__)

REFUSED_LOG_INTERVAL_S = 1.0
MAX_CALLS_PER_SHARD = 2  # a second call while one is in flight only for a full batch: see take()
# (2, not 4: the dispatcher merges concurrent calls into one commit anyway; with Ray calls topics_bench window 256
# spent ~4% less CPU per message, 11-15k msg/s instead of 9-11k in interleaved runs; over the direct channels at
# window 32 with FULL_BATCH 16, 4 calls gave 18.4k / 19.5k msg/s against 18.9k / 19.4k with 2)
FULL_BATCH = 16  # items, over the direct channels (see the module docstring; 4 made commits too small: docs/topics.md)
FULL_BATCH_RAY = 128  # items, when the calls are Ray calls


class AppendLink(Protocol):
    """The dispatcher call of the append path (a Ray handle in production)."""

    shards: int

    async def topic_append(self, shard: int, items: list[tuple]) -> list[tuple]:
        """Append :class:`AppendItem` tuples in one durable, replicated WriteBatch on ``shard``."""
        ...


class Held:
    """A ticket waiting for its appends.

    A plain class, not a dataclass: compiled (fanout.native), a dataclass keeps the ``__init__`` the dataclasses
    module generates, interpreted (2,080 instructions per Held in callgrind; docs/profile.md, twenty-first round).
    """

    __slots__ = ("ticket", "size", "calls", "error", "done")

    def __init__(self, ticket: IngestTicket, size: int) -> None:
        self.ticket = ticket
        self.size = size
        self.calls = 0  # shard calls it is part of, not answered yet
        self.error: dict | None = None  # the first failure
        self.done = False


class AppendBatch:
    """One ``topic_append`` call: its items and, per item, the ticket it belongs to (a plain class as Held)."""

    __slots__ = ("shard", "items", "owners")

    def __init__(self, shard: int, items: list[tuple], owners: list[Held]) -> None:
        self.shard = shard
        self.items = items
        self.owners = owners

    def __repr__(self) -> str:
        return f"AppendBatch(shard={self.shard}, items={len(self.items)})"


class TopicAppends:
    """Append batching of one node; see the module docstring.

    Args:
        topics: the durable topics (shared with the broker's per-publish check).
        max_pending: most tickets held (``fanout.max_pending_appends``).
        max_pending_bytes: most payload bytes held (``fanout.max_pending_append_bytes``).
        full_batch: items that make a batch worth a second call while one is in flight (see the module docstring).
    """

    def __init__(self, topics: DurableTopics, max_pending: int = 10_000, max_pending_bytes: int = 64 << 20,
                 full_batch: int = FULL_BATCH) -> None:
        self.topics = topics
        self.full_batch = full_batch
        self.max_pending = max_pending
        self.max_pending_bytes = max_pending_bytes
        shards = topics.shards
        self._items: list[list[tuple]] = [[] for _ in range(shards)]
        self._owners: list[list[Held]] = [[] for _ in range(shards)]
        self._ready: set[int] = set()
        self._calls = [0] * shards  # topic_append calls in flight per shard
        self._order: dict[tuple[str, int], deque[Held]] = {}
        self.pending = 0
        self.pending_bytes = 0
        self.appended = 0  # messages appended (per durable topic)
        self.refused = 0  # publishes refused by the bound
        self.failed = 0  # publishes whose append call failed
        self._refused_logged = 0.0
        self.settled_waiting = False  # a ticket settled by add() itself: take_settled() has something

    def _room(self, shard: int) -> bool:
        n = self._calls[shard]
        return n == 0 or (n < MAX_CALLS_PER_SHARD and len(self._items[shard]) >= self.full_batch)

    def has_work(self) -> bool:
        """True when some shard has items queued and room for another call."""
        return any(self._room(s) for s in self._ready)

    def add(self, ticket: IngestTicket) -> dict | None:
        """Queue a routed ticket's appends.

        Returns:
            None when queued (or nothing to append: a topic dropped meanwhile, the ticket is then acknowledged
            by :meth:`take_settled`), else the error to refuse it with now (the bound is hit).
        """
        targets = self.topics.targets(ticket.topic, ticket.client_id)
        size = len(ticket.payload)
        held = Held(ticket, size)
        if not targets:  # the topic was dropped since the broker asked: nothing to wait for
            held.done = True
            self.settled_waiting = True
            self._track(held)
            return None
        if self.pending >= self.max_pending or self.pending_bytes + size > self.max_pending_bytes:
            return self._refuse(ticket)
        self.pending += 1
        self.pending_bytes += size
        props = kept_properties(ticket.properties)
        for name, partition, shard in targets:
            self._items[shard].append(AppendItem.build(name, partition, ticket.topic, ticket.client_id, ticket.qos,
                                                       ticket.payload, props))
            self._owners[shard].append(held)
            self._ready.add(shard)
            held.calls += 1
        self._track(held)
        return None

    def _track(self, held: Held) -> None:
        t = held.ticket
        if t.packet_id is not None:  # QoS 0 has no acknowledgement to order
            key = (t.client_id, t.generation)
            q = self._order.get(key)
            if q is None:  # not setdefault: that builds a deque per publish to throw away
                q = self._order[key] = deque()
            q.append(held)

    def _refuse(self, ticket: IngestTicket) -> dict | None:
        self.refused += 1
        now = time.monotonic()
        if now - self._refused_logged >= REFUSED_LOG_INTERVAL_S:
            self._refused_logged = now
            log.warning("durable topic append refused: pending appends bound hit", client_id=ticket.client_id,
                        topic=ticket.topic, qos=ticket.qos, pending=self.pending, pending_bytes=self.pending_bytes,
                        refused_total=self.refused)
        if ticket.packet_id is None:
            return None  # QoS 0: routed, not appended, nothing to answer
        return {"error": "unavailable", "field": None, "reason": "too many publishes waiting for their append",
                "request_id": None, "reason_code": int(RC.QUOTA_EXCEEDED)}

    def take(self) -> list[AppendBatch]:
        """One batch per shard with queued items and room for another call (see the module docstring); each is a
        call in flight until :meth:`done` (make the calls in the order returned)."""
        out = []
        calls = self._calls
        for shard in sorted(self._ready):
            if not self._room(shard):
                continue
            out.append(AppendBatch(shard, self._items[shard], self._owners[shard]))
            self._items[shard] = []
            self._owners[shard] = []
            self._ready.discard(shard)
            calls[shard] += 1
        return out

    def done(self, batch: AppendBatch, failure: BaseException | None) -> list[tuple[IngestTicket, dict | None]]:
        """A ``topic_append`` call returned (``failure`` None) or failed.

        Returns:
            The tickets now settled, in each connection's publish order: ``(ticket, None)`` to acknowledge,
            ``(ticket, error)`` to refuse.
        """
        self._calls[batch.shard] -= 1
        if failure is not None:
            self.failed += len({id(h) for h in batch.owners})
            log.error("durable topic append failed", shard=batch.shard, items=len(batch.items),
                      error=repr(failure)[:300])
            error = _unavailable(f"shard {batch.shard} append failed: {failure!r}"[:200], failure=failure)
        else:
            self.appended += len(batch.items)
        for held in batch.owners:
            if failure is not None and held.error is None:
                held.error = error
            held.calls -= 1
            if held.calls == 0 and not held.done:
                held.done = True
                self.pending -= 1
                self.pending_bytes -= held.size
        return self.take_settled({(h.ticket.client_id, h.ticket.generation) for h in batch.owners})

    def take_settled(self, conns: set[tuple[str, int]] | None = None) -> list[tuple[IngestTicket, dict | None]]:
        """The settled tickets at the head of each connection's order (all connections when ``conns`` is None)."""
        out = []
        order = self._order
        if conns is None:
            self.settled_waiting = False
        for conn in (list(order) if conns is None else conns):
            q = order.get(conn)
            while q and q[0].done:
                h = q.popleft()
                out.append((h.ticket, h.error))
            if q is not None and not q:
                del order[conn]
        return out

    def sys_values(self) -> dict[str, int]:
        """This node's ``$SYS/fanout/appends/...`` values (published with its ``$SYS`` tree)."""
        return {"$SYS/fanout/appends/appended": self.appended, "$SYS/fanout/appends/pending": self.pending,
                "$SYS/fanout/appends/refused": self.refused, "$SYS/fanout/appends/failed": self.failed}

    def stats(self) -> dict[str, int]:
        return {"appends": self.appended, "appends_pending": self.pending, "appends_refused": self.refused,
                "appends_failed": self.failed, "append_calls": sum(self._calls),
                "durable_topics": len(self.topics.specs)}


__all__ = ["TopicAppends", "AppendBatch", "AppendLink", "Held"]
