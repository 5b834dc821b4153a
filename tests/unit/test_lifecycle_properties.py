"""DispatcherCore over a real ShardStore driven by random sequences of ingest (some with a ttl), vehicles coming
and going, PUBACKs, cancels, time passing, the GC expiry sweep and restarts (hypothesis).

Invariants: the store's per-request counters equal a recount of the ``reqs`` rows; no row of a request is
handed to a node after its cancel started (even when a later trigger names it again: a cancel is final), nor
at or after its expiry time; each (request, VIN) outcome has exactly one receipt in the ``receipts`` topic; a
replica fed every batch's bytes holds the same tables (receipts included) as the primary.
"""
from __future__ import annotations

import json
import tempfile
from collections import defaultdict

from hypothesis import example, given, settings, strategies as st

from fanout.dispatcher.core import DispatcherCore
from fanout.records import (
    AckEvent, BlobItem, ConnectEvent, DisconnectEvent, HeartbeatEvent, IngestItem, SubscribedEvent, join_vins,
)
from storage import ShardStore, WriteBatch, request_stats, tables, topics
from storage.replication_protocol import Ack, ReplicaApplier, table_digests

from .test_request_stats import recount

VINS = ["V0", "V1", "V2"]
REQUESTS = ["r0", "r1", "r2"]

OPS = st.one_of(
    st.tuples(st.just("ingest"), st.sampled_from(REQUESTS), st.lists(st.sampled_from(VINS), min_size=1, max_size=3),
              st.sampled_from([0, 0, 50, 300])),
    st.tuples(st.just("online"), st.sampled_from(VINS)),
    st.tuples(st.just("offline"), st.sampled_from(VINS)),
    st.tuples(st.just("heartbeat"), st.sampled_from(VINS)),
    st.tuples(st.just("puback"), st.sampled_from(VINS)),
    st.tuples(st.just("cancel"), st.sampled_from(REQUESTS)),
    st.tuples(st.just("wait"), st.integers(1, 200)),
    st.tuples(st.just("sweep")),
    st.tuples(st.just("restart")),
)


class Run:
    """Plays the Dispatcher actor around a core: applies its write batches at once, ships to one node."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.now = 1_000
        self.gen = 0
        self.replica = ReplicaApplier(ShardStore(f"{path}-replica", 0, sync=False))
        self.core = self._open()
        self.online: dict[str, int] = {}  # vin -> generation
        self.inflight: dict[str, bytes] = {}  # vin -> row key handed to the node, not acknowledged
        self.expires: dict[str, int] = {}
        self.cancelled: set[str] = set()

    def apply(self, batch: WriteBatch) -> None:
        """The primary applies the batch, the replica the bytes replication would ship."""
        seq = self.core.store.apply(batch).seq
        assert self.replica.apply(1, seq, batch.to_bytes()) == Ack(seq)

    def _open(self) -> DispatcherCore:
        store = ShardStore(self.path, 0, sync=False)
        core = DispatcherCore(store, 0, 1, started_ms=self.now)
        self.core = core
        if store.get_meta("d") is None:
            self.apply(core.blob_batch([BlobItem.build("d", b"B", 1)]))
        core.blobs_stored([BlobItem.build("d", b"B", 1)])
        return core

    def tick(self) -> None:
        core = self.core
        core.drain(self.now)
        taken = core.take_deletes(self.now)
        if taken is not None:
            self.apply(taken[0])
            core.deletes_applied(taken[1])
        for node in core.nodes_with_output():
            sends, _payloads, _kicks, _props = core.take_node_batch(node)
            for vin, gen, key, request_id, _data_id, _dup in sends:
                assert request_id not in self.cancelled, (request_id, "sent after its cancel")
                assert self.now < self.expires.get(request_id, 1 << 62), (request_id, "sent after its expiry")
                if self.online.get(vin) == gen:
                    self.inflight[vin] = key

    def do(self, op: tuple) -> None:
        core, kind = self.core, op[0]
        if kind == "ingest":
            _, rid, vins, ttl = op
            batch, _results, vin_lists = core.ingest_batch([IngestItem.build(rid, "d", join_vins(vins), self.now, ttl)])
            self.apply(batch)
            if ttl:
                self.expires[rid] = self.now + ttl
            for vl in vin_lists:
                core.dispatch_new(vl)
        elif kind == "online" and op[1] not in self.online:
            self.gen += 1
            self.online[op[1]] = self.gen
            core.apply_events("n0", [ConnectEvent.build(op[1], self.gen, False, False, None),
                                     SubscribedEvent.build(op[1], self.gen, True, None)])
        elif kind == "offline" and op[1] in self.online:
            core.apply_events("n0", [DisconnectEvent.build(op[1], self.online.pop(op[1]))])
            self.inflight.pop(op[1], None)
        elif kind == "heartbeat" and op[1] in self.online:
            core.apply_events("n0", [HeartbeatEvent.build(op[1], self.online[op[1]])])
        elif kind == "puback" and op[1] in self.inflight:
            core.apply_events("n0", [AckEvent.build(op[1], self.online[op[1]], self.inflight.pop(op[1]))])
        elif kind == "cancel":
            self.cancelled.add(op[1])
            self.apply(core.begin_cancel(op[1], self.now))
            core.end_cancel(op[1])
        elif kind == "wait":
            self.now += op[1]
        elif kind == "sweep":
            taken = core.lifecycle.sweep_batch(self.now)
            if taken is not None:
                self.apply(taken[0])
                core.lifecycle.swept(taken[1])
        elif kind == "restart":
            core.store.close()
            self.core = self._open()
            self.online.clear()
            self.inflight.clear()
        self.tick()


@settings(max_examples=120, deadline=None)
@given(st.lists(OPS, max_size=40))
# A request swept at its expiry, then named again by a trigger without a ttl (it was sent at the expiry time).
@example([("ingest", "r2", ["V1"], 50), ("online", "V0"), ("wait", 50), ("sweep",), ("ingest", "r2", ["V0"], 0)])
def test_counters_equal_the_rows_and_nothing_cancelled_or_expired_is_sent(ops):
    with tempfile.TemporaryDirectory() as tmp:
        run = Run(f"{tmp}/shard-0")
        try:
            for op in ops:
                run.do(op)
            store = run.core.store
            kept = {c["request_id"]: {s: c[s] for s in request_stats.STATUSES}
                    for c in store.request_counters_all() if c["vins"]}
            assert kept == recount(store)
            for rid in run.cancelled:
                assert (store.request_counters(rid) or {}).get(tables.STATUS_PENDING, 0) == 0
            check_receipts(store)
            assert table_digests(store) == table_digests(run.replica.store)
        finally:
            run.core.store.close()
            run.replica.store.close()


def check_receipts(store: ShardStore) -> None:
    """One receipt per outcome: none for a pending row (a request's VIN is never queued twice here: one blob);
    for a settled row its statuses are distinct and the last is the row's, with the row's time; only a late
    PUBACK (``delivered`` after ``cancelled``/``expired``) makes a second outcome."""
    low, nxt = store.topic_bounds(topics.RECEIPTS_NAME, 0)
    entries = store.topic_read(topics.RECEIPTS_NAME, 0, 0, 100_000)
    assert low == 0 and [e.offset for e in entries] == list(range(nxt))
    by_row: dict[tuple[str, str], list[dict]] = defaultdict(list)
    for e in entries:
        receipt = json.loads(e.payload)
        assert e.mqtt_topic == topics.RECEIPTS_TOPIC_PREFIX + receipt["vin"] and e.qos == 1 and e.client_id == ""
        assert e.ts_ms == receipt["ts_ms"] and receipt["data_id"] == "d"
        by_row[receipt["request_id"], receipt["vin"]].append(receipt)
    rows = {(r["request_id"], r["vin"]): r for r in store.scan(tables.REQS, limit=100_000)[0]}
    assert set(by_row) <= set(rows)
    for key, row in rows.items():
        statuses = [r["status"] for r in by_row.get(key, [])]
        if row["status"] == tables.STATUS_PENDING:
            assert statuses == [], (key, statuses)
            continue
        assert len(set(statuses)) == len(statuses) and statuses[-1] == row["status"], (key, statuses)
        assert by_row[key][-1]["ts_ms"] == row["delivered_ts_ms"]
        assert statuses[:-1] in ([], [tables.STATUS_CANCELLED], [tables.STATUS_EXPIRED]), (key, statuses)
        if len(statuses) == 2:
            assert statuses[-1] == tables.STATUS_DELIVERED
