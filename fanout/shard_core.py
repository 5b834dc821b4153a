"""ShardCore: everything one Dispatcher does, minus Ray and asyncio.

Strategy: the Dispatcher actor only moves batches (Ray calls, the writer thread, the tick); the decisions
live here so they are unit-testable with a real ``ShardStore`` and no cluster:

- Dispatch: :class:`fanout.dispatch.VinDispatcher` (its public hooks cover what a real node adds: a
  send the node could not hand over, and the filtering of VINs worth a store read). Reads go through
  :class:`TickRows`: every next-row question of an event batch (or of a slice of a new batch) is
  answered from ONE read transaction and cursor, skipping the acked keys whose delete is still being
  written (Rule 4 of :mod:`fanout.dispatch`) as bytes, and decoding only the row that is sent.
- Takeover registry: the shard of ``crc32(client_id)`` sees every connect of that client id on any node;
  when two nodes report a live connection, the older generation is kicked (queued for the next
  ``deliver`` call to its node).
- Output per node: sends of a tick become ``(vin, generation, row_key, request_id, data_id)`` tuples with
  each blob once (read from the local store through a small cache); failures come back as tuples.
- Writes are only ever :class:`storage.WriteBatch` objects returned to the caller (which applies them
  on the shard's single writer): acks of a tick in one batch, a round of blobs in one batch, a round of
  triggers in one batch. That keeps every mutation shippable by the replication layer.
"""
from __future__ import annotations

import time
from contextlib import contextmanager
from typing import Any, Iterator

import structlog

from fanout.dispatch import Delete, InFlight, VinDispatcher
from storage.keys import VIN_RE
from fanout.mqtt.hooks import DeliverStatus
from fanout.wire import (
    EV_ACK, EV_CONNECT, EV_DISCONNECT, EV_FAILED, EV_HEARTBEAT, EV_SUBSCRIBED, EV_SYNC, VIN_SEPARATOR, split_vins,
)
from storage import WriteBatch
from storage.keys import decode_ids_key

log = structlog.get_logger(__name__)

BLOB_CACHE_BYTES = 64 << 20
INSPECT_ROWS = 20


class TickRows:
    """``PendingRows`` over a ``ShardStore``: inside ``with rows.reading():`` every question of the block
    is answered from ONE read transaction and cursor (:class:`storage.queue_cursor.QueueCursor`); outside,
    each ``next_row`` is its own short read. Only the row returned is decoded: the acked keys skipped
    under Rule 4 are compared as bytes.
    """

    __slots__ = ("_store", "_qc", "reads")

    def __init__(self, store: Any) -> None:
        self._store = store
        self._qc: Any = None
        self.reads = 0

    @contextmanager
    def reading(self) -> Iterator[None]:
        if self._qc is not None:  # nested: the outer block's transaction serves
            yield
            return
        with self._store.queue_cursor() as qc:
            self._qc = qc
            try:
                yield
            finally:
                self._qc = None
                self.reads += qc.reads

    def next_row(self, vin: str, after: bytes | None = None) -> Any:
        qc = self._qc
        if qc is not None:
            return qc.first_row(vin) if after is None else qc.row_after(vin, after)
        self.reads += 1
        rows = self._store.next_rows(vin, limit=1, after_key=after)
        return rows[0] if rows else None

    def next_row_skipping(self, vin: str, skip: set[bytes] | None) -> Any:
        qc = self._qc
        if qc is not None:
            return qc.first_row(vin, skip)
        row = self.next_row(vin)
        while row is not None and skip and row.key in skip:
            row = self.next_row(vin, after=row.key)
        return row


# The pure machine is the dispatcher: node-reported send failures and batch filtering are its public hooks.
FanoutDispatch = VinDispatcher


def _inflight_json(inflight: InFlight | None) -> dict[str, Any] | None:
    if inflight is None:
        return None
    vin, ts_ms, request_id = decode_ids_key(inflight.key)
    return {"request_id": request_id, "ts_ms": ts_ms, "sent_ms": inflight.sent_ms}


class ShardCore:
    """The state and decisions of one dispatcher (one shard).

    Args:
        store: the shard's ``ShardStore`` (read here; written only by the caller).
        shard: shard index.
        shards: shard count.
        started_ms: wall-clock start of this dispatcher (default now): rows older than it may have
            been in flight under a predecessor, so their first send goes out with DUP=1.
    """

    def __init__(self, store: Any, shard: int, shards: int, started_ms: int | None = None) -> None:
        self.store = store
        self.shard = shard
        self.shards = shards
        self.rows = TickRows(store)
        self.vd = VinDispatcher(self.rows, started_ms=int(time.time() * 1000) if started_ms is None else started_ms)
        self._clients: dict[str, tuple[str, int]] = {}  # client id -> (node, generation) of the live connection
        self._kicks: dict[str, list[tuple[str, int]]] = {}
        self._sends: dict[str, list[tuple]] = {}
        self._deletes: list[Delete] = []
        self._blobs: dict[str, bytes] = {}
        self._blob_bytes = 0
        self._known: set[str] = set()
        self.events_in = 0
        self.rows_enqueued = 0
        self.commits = 0
        self.takeovers = 0
        self.discarded = 0

    # -- events from nodes -------------------------------------------------------------------------------

    def apply_events(self, node: str, events: list[tuple]) -> None:
        """Apply one node's event batch, in order."""
        vd = self.vd
        self.events_in += len(events)
        synced: list[str] = []
        with self.rows.reading():
            for e in events:
                kind = e[0]
                if kind == EV_ACK:
                    vd.on_puback(e[1], e[2], e[3])
                elif kind == EV_HEARTBEAT:
                    vd.on_heartbeat(e[1], e[2])
                elif kind == EV_CONNECT:
                    _, cid, gen, present, subscribed, key = e
                    if self._register(node, cid, gen) and VIN_RE.fullmatch(cid):
                        vd.on_connect(cid, node, gen, present, key, subscribed=subscribed)
                elif kind == EV_DISCONNECT:
                    _, cid, gen = e
                    self._unregister(node, cid, gen)
                    if VIN_RE.fullmatch(cid):
                        vd.on_disconnect(cid, gen)
                elif kind == EV_SUBSCRIBED:
                    vd.on_subscribe(e[1], e[2], e[3], e[4] if len(e) > 4 else None)
                elif kind == EV_FAILED:
                    vd.on_send_failed(e[1], e[2], e[3])
                elif kind == EV_SYNC:
                    _, cid, gen, subscribed, key = e
                    if self._register(node, cid, gen) and VIN_RE.fullmatch(cid):
                        vd.on_connect(cid, node, gen, True, key, subscribed=subscribed)
                        synced.append(cid)
        if synced:  # after a restart, resynced connections are a trigger: rows may have come meanwhile
            self.dispatch_new(synced)

    def _register(self, node: str, cid: str, gen: int) -> bool:
        """Record a connect; queue a kick for the older of two live connections on different nodes.

        Returns:
            False when this connect is already superseded (it was kicked).
        """
        prev = self._clients.get(cid)
        if prev is not None and prev[0] != node:
            self.takeovers += 1
            if gen < prev[1]:
                self._kicks.setdefault(node, []).append((cid, gen))
                return False
            self._kicks.setdefault(prev[0], []).append((cid, prev[1]))
        if prev is None or gen > prev[1] or prev[0] != node:
            self._clients[cid] = (node, gen)
        return True

    def _unregister(self, node: str, cid: str, gen: int) -> None:
        if self._clients.get(cid) == (node, gen):
            del self._clients[cid]

    def node_down(self, node: str) -> None:
        """A connection node died or restarted: everything connected there is gone."""
        self.vd.on_node_down(node)
        for cid in [c for c, (n, _g) in self._clients.items() if n == node]:
            del self._clients[cid]
        self._sends.pop(node, None)
        self._kicks.pop(node, None)

    # -- ingest --------------------------------------------------------------------------------------------

    def blob_batch(self, items: list[tuple]) -> WriteBatch:
        """One write batch storing ``[(data_id, blob, ts_ms)]`` (a repeated blob refreshes meta.ts only)."""
        batch = WriteBatch()
        for data_id, blob, ts_ms in items:
            batch.put_blob(data_id, blob, ts_ms)
        return batch

    def blobs_stored(self, items: list[tuple]) -> None:
        """After :meth:`blob_batch` was applied: the ids exist, cached contents may be stale."""
        for data_id, _blob, _ts in items:
            self._known.add(data_id)
            old = self._blobs.pop(data_id, None)
            if old is not None:
                self._blob_bytes -= len(old)

    def has_data(self, data_ids: list[str]) -> list[bool]:
        """Whether each data id has a blob on this shard."""
        out = []
        for d in data_ids:
            ok = d in self._known or self.store.get_meta(d) is not None
            if ok:
                self._known.add(d)
            out.append(ok)
        return out

    def ingest_batch(self, items: list[tuple]) -> tuple[WriteBatch, list[Any], list[list[str]]]:
        """Build the write batch of a round of triggers for this shard.

        Args:
            items: ``(request_id, data_id, joined_vins, ts_ms)``.

        Returns:
            ``(batch, results, vin_lists)``: results per item (``{"vins": n}`` or an error string for an
            unknown data id, which writes nothing for that item), and the VIN lists to dispatch once the
            batch is durable.
        """
        batch = WriteBatch()
        results: list[Any] = []
        vin_lists: list[list[str]] = []
        for request_id, data_id, joined, ts_ms in items:
            if not self.has_data([data_id])[0]:
                results.append(f"unknown data_id {data_id!r} on shard {self.shard}")
                continue
            vins = split_vins(joined)
            try:
                batch.enqueue_many(vins, ts_ms, request_id, data_id)
            except ValueError as exc:
                results.append(f"invalid trigger: {exc}")
                continue
            vin_lists.append(vins)
            results.append({"vins": len(vins)})
        return batch, results, vin_lists

    @staticmethod
    def split_head(items: list[tuple], head_vins: int) -> tuple[list[tuple], list[tuple]] | None:
        """Split the first ``head_vins`` VINs of the first item off a round of triggers.

        The head is written (and dispatched) on its own first, so the first deliveries of a big batch
        do not wait for the commit of all of its rows; the platform is acknowledged only after both.

        Args:
            items: ``(request_id, data_id, joined_vins, ts_ms)`` as for :meth:`ingest_batch`.
            head_vins: VINs in the head.

        Returns:
            ``(head_items, rest_items)``, or None when the first item is not much bigger than the head.
        """
        if not items:
            return None
        request_id, data_id, joined, ts_ms = items[0]
        if joined.count(VIN_SEPARATOR) < 2 * head_vins:
            return None
        parts = joined.split(VIN_SEPARATOR, head_vins)
        rest = parts.pop()
        return ([(request_id, data_id, VIN_SEPARATOR.join(parts), ts_ms)],
                [(request_id, data_id, rest, ts_ms), *items[1:]])

    @staticmethod
    def merge_head_result(head: Any, rest: Any) -> Any:
        """The result of an item written as head + rest (:meth:`split_head`)."""
        if isinstance(head, dict) and isinstance(rest, dict):
            return {"vins": head["vins"] + rest["vins"]}
        return rest if not isinstance(rest, dict) else head

    def applied(self, counts: dict[str, int]) -> None:
        """Counters of one commit (``ShardStore.apply`` result), for stats."""
        self.rows_enqueued += counts.get("enqueue_new", 0)
        self.commits += 1

    def ingested(self, vin_lists: list[list[str]]) -> int:
        """After :meth:`ingest_batch` was applied: trigger "new batch" dispatch.

        Returns:
            How many VINs were ready to receive (a send was attempted).
        """
        return sum(self.dispatch_new(vins) for vins in vin_lists)

    def dispatch_new(self, vins: list[str]) -> int:
        """"New batch" trigger for some VINs whose rows are durable (callers may split a big list).

        Returns:
            How many of them were ready to receive.
        """
        ready = self.vd.ready_vins(vins)
        if ready:
            with self.rows.reading():
                self.vd.on_batch(ready)
        return len(ready)

    def forget_data(self) -> None:
        """Blobs may have been deleted (GC batch applied): drop the caches."""
        self._known.clear()
        self._blobs.clear()
        self._blob_bytes = 0

    # -- the tick -------------------------------------------------------------------------------------------

    @property
    def has_work(self) -> bool:
        """Something is queued: actions to drain, sends or kicks to ship, deletes to write."""
        return self.vd.has_actions or bool(self._sends or self._kicks or self._deletes)

    def drain(self, now_ms: int) -> None:
        """Move the machine's queued actions into per-node send lists and the delete list."""
        for _ in range(3):  # a missing blob discards its row and may queue the next one
            if not self.vd.has_actions:
                return
            plan = self.vd.drain_actions(now_ms)
            self._deletes.extend(plan.deletes)
            for node, sends in plan.sends.items():
                out = self._sends.setdefault(node, [])
                for s in sends:
                    row = s.row
                    if self._blob(row.data_id) is None:
                        log.warning("fanout row without blob discarded", vin=s.vin, request_id=row.request_id,
                                    data_id=row.data_id, shard=self.shard)
                        self.discarded += 1
                        self.vd.discard_row(s.vin, row.key)
                        continue
                    out.append((s.vin, s.generation, row.key, row.request_id, row.data_id, s.dup))
                if not out:
                    del self._sends[node]

    def _blob(self, data_id: str) -> bytes | None:
        blob = self._blobs.get(data_id)
        if blob is None:
            blob = self.store.get_blob(data_id)
            if blob is None:
                return None
            if self._blob_bytes + len(blob) > BLOB_CACHE_BYTES:
                self._blobs.clear()
                self._blob_bytes = 0
            self._blobs[data_id] = blob
            self._blob_bytes += len(blob)
        return blob

    def nodes_with_output(self) -> list[str]:
        """Nodes with sends or kicks queued."""
        return list({*self._sends, *self._kicks})

    def take_node_batch(self, node: str, limit: int | None = None) -> tuple[list[tuple], dict[str, bytes], list[tuple]]:
        """The ``deliver`` arguments for ``node``: sends, their blobs (each once) and kicks.

        Args:
            node: the destination.
            limit: at most this many sends (the rest stay queued, oldest first); None = all.
        """
        queued = self._sends.pop(node, [])
        if limit is not None and len(queued) > limit:
            sends, self._sends[node] = queued[:limit], queued[limit:]
        else:
            sends = queued
        kicks = self._kicks.pop(node, [])
        payloads: dict[str, bytes] = {}
        for s in sends:
            d = s[4]
            if d not in payloads:
                payloads[d] = self._blob(d) or b""
        return sends, payloads, kicks

    def take_deletes(self, now_ms: int) -> tuple[WriteBatch, list[Delete]] | None:
        """One write batch acknowledging every acked row queued so far (``ids`` deleted, ``reqs`` delivered)."""
        if not self._deletes:
            return None
        deletes, self._deletes = self._deletes, []
        return WriteBatch().ack_rows([d.key for d in deletes], now_ms), deletes

    def requeue_deletes(self, deletes: list[Delete]) -> None:
        """A delete batch failed to apply: put its deletes back in front (retried with the next batch)."""
        self._deletes[:0] = deletes

    def deletes_applied(self, deletes: list[Delete]) -> None:
        """The delete batch is durable."""
        self.vd.on_deleted(deletes)

    def delivery_failures(self, node: str, failures: list[tuple]) -> None:
        """The node's answer to a ``deliver`` call: clear in-flight state of what it could not send."""
        vd = self.vd
        for vin, gen, key, status in failures:
            if status == DeliverStatus.NOT_CONNECTED:
                vd.on_disconnect(vin, gen)
            else:
                vd.on_send_failed(vin, gen, key, unsubscribed=status == DeliverStatus.NOT_SUBSCRIBED)

    def call_failed(self, node: str, sends: list[tuple]) -> None:
        """A ``deliver`` call raised (not a dead node): its rows stay pending, in-flight state is cleared."""
        for vin, gen, key, _rid, _did in sends:
            self.vd.on_send_failed(vin, gen, key)

    # -- introspection -----------------------------------------------------------------------------------------

    def stats(self) -> dict[str, Any]:
        """Counters for ``fanout status`` and ``$SYS/fanout/...``."""
        st = self.vd.stats()
        ss = self.store.stats()
        entries = ss["entries"]
        return {
            "shard": self.shard,
            "pending_rows": entries["ids"],
            "requests_rows": entries["reqs"],
            "data_blobs": entries["data"],
            "in_flight": st.inflight,
            "connected": st.connected,
            "vehicles": st.vehicles,
            "sent": st.sent,
            "delivered": st.delivered,
            "stale_events": st.stale_events,
            "events": self.events_in,
            "rows_enqueued": self.rows_enqueued,
            "commits": self.commits,
            "takeovers": self.takeovers,
            "clients": len(self._clients),
            "applied_seq": ss["applied_seq"],
            "used_bytes": ss["used_bytes"],
        }

    def inspect_vin(self, vin: str) -> dict[str, Any]:
        """Dispatch state and pending rows of one VIN."""
        vs = self.vd.vehicle(vin)
        rows = self.store.next_rows(vin, limit=INSPECT_ROWS)
        state = None
        if vs is not None:
            state = {"node": vs.node, "generation": vs.generation, "subscribed": vs.subscribed,
                     "inflight": _inflight_json(vs.inflight), "resumed_inflight": vs.resumed_inflight}
        client = self._clients.get(vin)
        return {
            "vin": vin, "shard": self.shard, "state": state,
            "connection": None if client is None else {"node": client[0], "generation": client[1]},
            "pending_rows": self.store.pending_count(vin),
            "rows": [{"ts_ms": r.ts_ms, "request_id": r.request_id, "data_id": r.data_id} for r in rows],
        }

    def inspect_request(self, request_id: str, limit: int = 1000) -> dict[str, Any]:
        """``reqs`` rows of one request on this shard: counts per status and a sample."""
        rows = self.store.request_rows(request_id, limit=limit)
        by_status: dict[str, int] = {}
        for r in rows:
            by_status[r["status"]] = by_status.get(r["status"], 0) + 1
        return {"shard": self.shard, "rows": len(rows), "by_status": by_status, "truncated": len(rows) >= limit,
                "sample": rows[:INSPECT_ROWS]}

    def inspect_data(self, data_id: str) -> dict[str, Any] | None:
        """Meta of one blob on this shard, or None."""
        return self.store.get_meta(data_id)


class LocalShardLink:
    """The edge's shard link over in-process ShardCores: what the Dispatcher actor does for blobs and
    ingest, minus Ray and replication (unit tests and the Ray-free benchmark drive the edge with it).

    Args:
        cores: one ShardCore per shard, index = shard.
    """

    def __init__(self, cores: list[ShardCore]) -> None:
        self.cores = cores
        self.shards = len(cores)

    async def put_blobs(self, shard: int, items: list[tuple]) -> list[None]:
        core = self.cores[shard]
        core.store.apply(core.blob_batch(items))
        core.blobs_stored(items)
        return [None] * len(items)

    async def has_data(self, shard: int, data_ids: list[str]) -> list[bool]:
        return self.cores[shard].has_data(data_ids)

    async def ingest(self, shard: int, items: list[tuple]) -> list[Any]:
        core = self.cores[shard]
        batch, results, vin_lists = core.ingest_batch(items)
        if batch:
            core.applied(core.store.apply(batch).counts)
        core.ingested(vin_lists)
        return results


__all__ = ["ShardCore", "FanoutDispatch", "LocalShardLink", "TickRows"]
