"""DispatcherCore: everything one Dispatcher decides, minus Ray and asyncio.

Strategy: the Dispatcher actor only moves batches (Ray calls, the writer thread, the tick); the decisions
live here so they are unit-testable with a real ``ShardStore`` and no cluster. The core composes:

- :class:`fanout.dispatcher.machine.VinDispatcher`, the per-VIN state machine (its public hooks cover
  what a real node adds: a send the node could not hand over, the filtering of VINs worth a store read);
- :class:`fanout.dispatcher.rows.TickRows`: every next-row question of an event batch (or of a slice of
  a new batch) answered from ONE read transaction;
- :class:`fanout.dispatcher.takeover.TakeoverRegistry`: two live connections of one client id on
  different nodes -> the older one is kicked;
- :class:`fanout.dispatcher.blobs.BlobCache`: known data ids and blob contents read locally;
- :class:`fanout.dispatcher.output.TickOutput`: a tick's :class:`fanout.records.Delivery` orders and
  kicks per node, and the deletes to write;
- :mod:`fanout.dispatcher.ingest_batch`: the write batches of ingest and the head-first policy;
- :class:`fanout.dispatcher.lifecycle.RequestLifecycle`: ttl expiry at pick time, cancels, request status.

Writes are only ever :class:`storage.WriteBatch` objects returned to the caller, which applies them on the
shard's single writer: the acks of a tick in one batch, a round of blobs in one batch, a round of
triggers in one batch (two for a big trigger, head first). That keeps every mutation shippable by the
replication layer.
"""
from __future__ import annotations

import time
from typing import Any, Iterator

import structlog

from fanout.dispatcher import introspection
from fanout.dispatcher.blobs import BlobCache
from fanout.dispatcher.ingest_batch import HEAD_WRITE_VINS, IngestJob, blob_batch, ingest_batch
from fanout.dispatcher.lifecycle import RequestLifecycle
from fanout.dispatcher.machine import VinDispatcher
from fanout.dispatcher.output import TickOutput
from fanout.dispatcher.rows import TickRows
from fanout.dispatcher.state import Delete
from fanout.dispatcher.takeover import TakeoverRegistry
from fanout.dispatcher.topic_groups import DispatcherGroups
from fanout.mqtt.hooks import DeliverStatus
from fanout.records import (
    CONFLICT_PREFIX, EV_ACK, EV_CONNECT, EV_DISCONNECT, EV_FAILED, EV_HEARTBEAT, EV_SUBSCRIBED, EV_SYNC, DeliverBatch,
    DeliveryProps, split_vins,
)
from fanout.topics.groups_records import EV_GROUP_FIRST
from fanout.trigger import conflict_reason
from storage import WriteBatch
from storage.keys import VIN_RE

log = structlog.get_logger(__name__)

DISPATCH_SLICE = 2000  # VINs of a new batch dispatched per event-loop turn (the tick ships in between)


class DispatcherCore:
    """The state and decisions of one dispatcher (one shard).

    Args:
        store: the shard's ``ShardStore`` (read here; written only by the caller).
        shard: shard index.
        shards: shard count.
        started_ms: wall-clock start of this dispatcher (default now): rows older than it may have
            been in flight under a predecessor, so their first send goes out with DUP=1.
    """

    def __init__(self, store: Any, shard: int, shards: int, started_ms: int | None = None,
                 group_bounds: dict[str, int] | None = None) -> None:
        self.store = store
        self.shard = shard
        self.shards = shards
        self.rows = TickRows(store)
        self.vd = VinDispatcher(self.rows, started_ms=int(time.time() * 1000) if started_ms is None else started_ms)
        self.registry = TakeoverRegistry()
        self.blobs = BlobCache(store)
        self.output = TickOutput()
        self.lifecycle = RequestLifecycle(store)
        self.topic_groups = DispatcherGroups(store, shard, shards, **(group_bounds or {}))  # durable-topic consumer groups
        self.events_in = 0
        self.rows_enqueued = 0
        self.commits = 0
        self.discarded = 0
        self.too_large = 0  # rows discarded because the vehicle's Maximum Packet Size is below their message

    # -- events from nodes -------------------------------------------------------------------------------

    def apply_events(self, node: str, events: list[tuple]) -> None:
        """Apply one node's batch of :mod:`fanout.records` events, in order."""
        vd = self.vd
        self.events_in += len(events)
        synced: list[str] = []
        group_events: list[tuple] = []
        with self.rows.reading():
            for e in events:
                kind = e[0]
                if kind == EV_ACK:
                    _, cid, gen, key = e
                    vd.on_puback(cid, gen, key)
                elif kind == EV_HEARTBEAT:
                    _, cid, gen = e
                    vd.on_heartbeat(cid, gen)
                elif kind == EV_CONNECT:
                    _, cid, gen, present, subscribed, key = e
                    if self._connect(node, cid, gen):
                        vd.on_connect(cid, node, gen, present, key, subscribed=subscribed)
                elif kind == EV_DISCONNECT:
                    _, cid, gen = e
                    self.registry.unregister(node, cid, gen)
                    if VIN_RE.fullmatch(cid):
                        vd.on_disconnect(cid, gen)
                elif kind == EV_SUBSCRIBED:
                    _, cid, gen, subscribed, at_us = e
                    vd.on_subscribe(cid, gen, subscribed, at_us)
                elif kind == EV_FAILED:
                    _, cid, gen, key, too_large = e
                    if too_large:
                        self._too_large(cid, gen, key)
                    else:
                        vd.on_send_failed(cid, gen, key)
                elif kind == EV_SYNC:
                    _, cid, gen, subscribed, key = e
                    if self._connect(node, cid, gen):
                        vd.on_connect(cid, node, gen, True, key, subscribed=subscribed)
                        synced.append(cid)
                elif kind >= EV_GROUP_FIRST:
                    group_events.append(e)  # applied after this read block: they read the store themselves
        for e in group_events:
            self.topic_groups.on_event(node, e)
        if synced:  # after a restart, resynced connections are a trigger: rows may have come meanwhile
            self.dispatch_new(synced)

    def _connect(self, node: str, cid: str, gen: int) -> bool:
        """Register a connect (or resync) of ``cid`` on ``node`` and queue the kicks it causes.

        The live connection of ``cid`` on another node is kicked (takeover). So is, for a vehicle, the
        connection its last unacknowledged row was handed to, if on another node: that session is left
        behind and would resend the row should the vehicle come back there, even after the row was
        acknowledged here (a kick also drops the fanout messages of the session left behind, live or
        not; see :meth:`fanout.node.core.NodeCore.kick`).

        Returns:
            Whether the dispatch machine takes the connect: a vehicle, and not superseded.
        """
        accepted, kick = self.registry.register(node, cid, gen)
        if kick is not None:
            self.output.kick(kick[0], cid, kick[1])
        if not accepted or not VIN_RE.fullmatch(cid):
            return False
        holder = self.vd.session_holder(cid)
        if holder is not None and holder[0] != node and holder != kick:
            self.output.kick(holder[0], cid, holder[1])
        return True

    def node_down(self, node: str) -> None:
        """A connection node died or restarted: everything connected there is gone."""
        self.vd.on_node_down(node)
        self.registry.node_down(node)
        self.output.node_down(node)
        self.topic_groups.node_down(node)

    # -- ingest --------------------------------------------------------------------------------------------

    def blob_batch(self, items: list[tuple]) -> WriteBatch:
        """One write batch storing :class:`fanout.records.BlobItem` items."""
        return blob_batch(items)

    def blobs_stored(self, items: list[tuple]) -> None:
        """After :meth:`blob_batch` was applied: the ids exist, cached contents may be stale."""
        self.blobs.stored(item[0] for item in items)

    def has_data(self, data_ids: list[str]) -> list[bool]:
        """Whether each data id has a blob on this shard."""
        return self.blobs.has_data(data_ids)

    def ingest_batch(self, items: list[tuple]) -> tuple[WriteBatch, list[Any], list[list[str]]]:
        """The write batch of a round of :class:`fanout.records.IngestItem` (see
        :func:`fanout.dispatcher.ingest_batch.ingest_batch`)."""
        self.lifecycle.ingested(items)
        return ingest_batch(items, self.blobs.has_data, self.shard)

    def ingest_job(self, items: list[tuple], head_vins: int = HEAD_WRITE_VINS) -> IngestJob:
        """The writes of one ``ingest`` call, head first for a big trigger (:class:`IngestJob`); an item
        that conflicts with what the shard holds is refused whole (:data:`fanout.records.CONFLICT_PREFIX`)."""
        refused = {i: CONFLICT_PREFIX + c for i, c in enumerate(self.trigger_conflicts(items)) if c is not None}
        return IngestJob(items, self.ingest_batch, head_vins, refused)

    def requests_in_use(self, request_ids: list[str]) -> list[bool]:
        """Whether this shard holds ``reqs`` rows of each request id (one cursor seek each)."""
        return [bool(self.store.request_rows(rid, limit=1)) for rid in request_ids]

    def trigger_conflicts(self, items: list[tuple]) -> list[str | None]:
        """Per :class:`fanout.records.IngestItem`: None, or why its request id may not queue its VINs.

        A conflict is a VIN that the same request id already queued with another data id, on this shard
        or in an earlier item of ``items``. A request id this shard has never seen costs one seek.
        """
        out: list[str | None] = []
        earlier: dict[str, list[tuple[str, str]]] = {}  # request id -> (data id, joined VINs) accepted before
        for request_id, data_id, joined, _ts, _ttl, _props in items:
            reason = None
            before = earlier.get(request_id)
            if before is not None or self.store.request_rows(request_id, limit=1):
                vins = split_vins(joined)
                hit = self.store.request_conflict(request_id, data_id, vins)
                for other, other_joined in before or ():
                    if hit is not None:
                        break
                    common = set(vins).intersection(split_vins(other_joined)) if other != data_id else ()
                    if common:
                        hit = (min(common), other)
                if hit is not None:
                    reason = conflict_reason(request_id, data_id, *hit)
            out.append(reason)
            if reason is None:
                earlier.setdefault(request_id, []).append((data_id, joined))
        return out

    def applied(self, counts: dict[str, int]) -> None:
        """Counters of one commit (``ShardStore.apply`` result), for stats."""
        self.rows_enqueued += counts.get("enqueue_new", 0)
        self.commits += 1

    def dispatch_new(self, vins: list[str]) -> int:
        """"New batch" trigger for some VINs whose rows are durable.

        Returns:
            How many of them were ready to receive (a send was attempted).
        """
        ready = self.vd.ready_vins(vins)
        if ready:
            with self.rows.reading():
                self.vd.on_batch(ready)
        return len(ready)

    def dispatch_slices(self, vin_lists: list[list[str]]) -> Iterator[tuple[int, bool]]:
        """"New batch" trigger for the VIN lists of a durable write, :data:`DISPATCH_SLICE` VINs at a time.

        Yields:
            ``(ready, give_way)`` per slice: the VINs that were ready, and whether the caller should let
            its event loop run (ship the first sends) before the next slice (a list bigger than a slice).
        """
        for vins in vin_lists:
            big = len(vins) > DISPATCH_SLICE
            for i in range(0, len(vins), DISPATCH_SLICE):
                yield self.dispatch_new(vins[i:i + DISPATCH_SLICE]), big

    def forget_data(self) -> None:
        """Blobs may have been deleted (GC batch applied): drop the caches."""
        self.blobs.forget()

    # -- the tick -------------------------------------------------------------------------------------------

    @property
    def has_work(self) -> bool:
        """Something is queued: actions to drain, deliveries or kicks to ship, deletes to write."""
        return self.vd.has_actions or self.output.has_work or self.topic_groups.has_work

    def drain(self, now_ms: int) -> None:
        """Move the machine's queued actions into per-node delivery lists and the delete list."""
        self.topic_groups.tick()
        vd = self.vd
        out = self.output
        blob = self.blobs.get
        life = self.lifecycle
        for _ in range(3):  # a missing blob discards its row and may queue the next one
            if not vd.has_actions:
                return
            plan = vd.drain_actions(now_ms)
            out.deletes.extend(plan.deletes)
            expires, cancelling = life.expires, life.cancelling  # both empty unless a ttl or a cancel exists
            present: set[str] = set()  # data ids whose blob this drain found (one look-up per data id)
            for node, sends in plan.sends.items():
                queue = out.deliveries_to(node)
                append = queue.append
                for s in sends:
                    row = s.row
                    if expires or cancelling:
                        if life.held_back(row.request_id, s.vin):
                            vd.on_send_failed(s.vin, s.generation, row.key)  # sent again after the cancel, if pending
                            continue
                        if life.expired(row.request_id, now_ms):
                            life.expired_rows += 1
                            vd.discard_row(s.vin, row.key, expired=True)
                            continue
                    data_id = row.data_id
                    if data_id in present:  # the common case: a Delivery tuple (fanout.records) built inline
                        append((s.vin, s.generation, row.key, row.request_id, data_id, s.dup))
                        continue
                    if blob(data_id) is not None:
                        present.add(data_id)
                        append((s.vin, s.generation, row.key, row.request_id, data_id, s.dup))
                        continue
                    log.warning("fanout row without blob discarded", vin=s.vin, request_id=row.request_id,
                                data_id=data_id, shard=self.shard)
                    self.discarded += 1
                    vd.discard_row(s.vin, row.key)
                out.prune(node)

    def nodes_with_output(self) -> list[str]:
        """Nodes with deliveries or kicks queued."""
        nodes = self.output.nodes()
        return nodes + [n for n in self.topic_groups.nodes() if n not in nodes]

    def take_node_batch(self, node: str, limit: int | None = None) -> tuple:
        """The :class:`fanout.records.DeliverBatch` wire tuple for ``node``: deliveries, their blobs (each
        once), kicks, and the MQTT 5 properties of the deliveries (None when none has any).

        Args:
            node: the destination.
            limit: at most this many deliveries (the rest stay queued, oldest first); None = all.
        """
        sends, kicks = self.output.take(node, limit)
        payloads: dict[str, bytes] = {}
        blob = self.blobs.get
        for _vin, _gen, _key, _rid, data_id, _dup in sends:
            if data_id not in payloads:
                payloads[data_id] = blob(data_id) or b""
        batch = DeliverBatch.build(sends, payloads, kicks, self._delivery_props(sends, payloads))
        groups = self.topic_groups.take(node)
        return (*batch, groups) if groups else batch  # the optional fifth field (fanout.topics.groups_records)

    def _delivery_props(self, sends: list[tuple], payloads: dict[str, bytes]) -> tuple | None:
        """The :class:`fanout.records.DeliveryProps` of ``sends``: built once per batch; the per-delivery
        lookups run only when a request of the shard has a ttl or User Properties. None when nothing of
        the batch has a property."""
        life = self.lifecycle
        expires, users = life.expires, life.user_properties
        types = self.blobs.content_types(payloads)
        if not (expires or users or types):
            return None
        ttl: dict[str, int] = {}
        props: dict[str, tuple] = {}
        if expires or users:
            for _vin, _gen, _key, request_id, _did, _dup in sends:
                at = expires.get(request_id)
                if at is not None:
                    ttl[request_id] = at
                pairs = users.get(request_id)
                if pairs is not None:
                    props[request_id] = pairs
        return DeliveryProps.build(ttl, props, types) if ttl or props or types else None

    def take_deletes(self, now_ms: int) -> tuple[WriteBatch, list[Delete]] | None:
        """One write batch finishing every row queued so far: ``ids`` deleted, ``reqs`` marked delivered
        (acknowledged) or discarded (dropped undelivered, its blob gone)."""
        if not self.output.deletes:
            return None
        deletes = self.output.take_deletes()
        life = self.lifecycle
        batch = WriteBatch().ack_rows([d.key for d in deletes if not (d.discarded or d.expired)], now_ms)
        if self.discarded:
            batch.discard_rows([d.key for d in deletes if d.discarded], now_ms)
        if life.expired_rows:
            batch.expire_rows([d.key for d in deletes if d.expired], now_ms)
        return batch, deletes

    def requeue_deletes(self, deletes: list[Delete]) -> None:
        """A delete batch failed to apply: put its deletes back in front (retried with the next batch)."""
        self.output.requeue_deletes(deletes)

    def deletes_applied(self, deletes: list[Delete]) -> None:
        """The delete batch is durable."""
        self.vd.on_deleted(deletes)

    def delivery_failures(self, node: str, failures: list[tuple]) -> None:
        """The node's answer to a ``deliver`` call (:class:`fanout.records.DeliveryFailure` tuples): clear
        the in-flight state of what it could not hand over."""
        vd = self.vd
        for vin, gen, key, status in failures:
            if status == DeliverStatus.NOT_CONNECTED:
                vd.on_disconnect(vin, gen)
            elif status == DeliverStatus.TOO_LARGE:
                self._too_large(vin, gen, key)
            else:
                vd.on_send_failed(vin, gen, key, unsubscribed=status == DeliverStatus.NOT_SUBSCRIBED)

    def _too_large(self, vin: str, generation: int, row_key: bytes) -> None:
        """The vehicle's connection cannot take the row's message (MQTT 5 Maximum Packet Size): resending it
        on every heartbeat would block every later row of the vehicle, so the row is discarded (its request
        counts it as discarded) and the next one is sent."""
        if self.vd.discard_inflight(vin, generation, row_key):
            self.discarded += 1
            self.too_large += 1
            log.warning("fanout row too large for the vehicle discarded", vin=vin, row_key=row_key, shard=self.shard)

    def call_failed(self, node: str, sends: list[tuple]) -> None:
        """A ``deliver`` call raised (not a dead node): its rows stay pending, in-flight state is cleared.

        Args:
            node: the destination of the call.
            sends: the call's :class:`fanout.records.Delivery` tuples.
        """
        for vin, gen, key, _rid, _did, _dup in sends:
            self.vd.on_send_failed(vin, gen, key)

    # -- request lifecycle -------------------------------------------------------------------------------------

    def begin_cancel(self, request_id: str, now_ms: int) -> WriteBatch:
        """Stop delivering ``request_id`` at once (queued deliveries dropped); the batch to write (see
        :class:`fanout.dispatcher.lifecycle.RequestLifecycle`). Call :meth:`end_cancel` after it."""
        batch = self.lifecycle.begin_cancel(request_id, now_ms)
        for vin, gen, key in self.output.drop_request(request_id):
            self.lifecycle.held.add(vin)
            self.vd.on_send_failed(vin, gen, key)
        return batch

    def end_cancel(self, request_id: str) -> int:
        """The cancel batch is durable (or failed): the vehicles held back get their next row. Returns how
        many were ready."""
        return self.dispatch_new(self.lifecycle.end_cancel(request_id))

    def request_status(self, request_id: str) -> dict[str, Any] | None:
        """This shard's counters of ``request_id`` with its rows in flight, or None."""
        return self.lifecycle.status(request_id, self.vd.inflight_keys())

    def list_requests(self, limit: int) -> list[dict[str, Any]]:
        """This shard's counters of its requests (by request id, at most ``limit``), with rows in flight."""
        return self.lifecycle.list(self.vd.inflight_keys(), limit)

    # -- introspection -----------------------------------------------------------------------------------------

    def stats(self) -> dict[str, Any]:
        """Counters for ``fanout status`` and ``$SYS/fanout/...``."""
        return {**introspection.shard_stats(self), **self.topic_groups.stats()}

    def inspect_vin(self, vin: str) -> dict[str, Any]:
        """Dispatch state and pending rows of one VIN."""
        return introspection.inspect_vin(self, vin)

    def inspect_request(self, request_id: str, limit: int = 1000) -> dict[str, Any]:
        """``reqs`` rows of one request on this shard: counts per status and a sample."""
        return introspection.inspect_request(self, request_id, limit)

    def inspect_data(self, data_id: str) -> dict[str, Any] | None:
        """Meta of one blob on this shard (with the MQTT 5 Content Type of its latest publish), or None."""
        meta = self.store.get_meta(data_id)
        if meta is not None:
            meta["content_type"] = self.store.get_content_type(data_id)
        return meta


__all__ = ["DispatcherCore", "DISPATCH_SLICE"]
