"""The ``requests`` table (storage.request_stats): counters kept by the writes equal a recount of the rows.

Random sequences of ingest, PUBACK (also late, of a settled row), discard, expiry (per row and of a whole
request), cancel, a ttl, GC deletes of ``reqs`` rows and of ``ids`` rows (``settle_ids_if``) and restarts run against a primary store; every batch
is shipped as bytes to a replica store, as replication does. After each sequence both stores' counters
equal a recount of their ``reqs`` rows, and the replica's tables equal the primary's.
"""
from __future__ import annotations

import tempfile
from collections import Counter

import pytest
from hypothesis import given, settings, strategies as st

from storage import ShardStore, WriteBatch, request_stats, shard_dir, tables
from storage import keys as keys_mod
from storage.keys import ids_key
from storage.replication_protocol import table_digests

T0 = 1_700_000_000_000
VINS = [f"V{i}" for i in range(6)]
REQUESTS = ["r0", "r1", "r2"]
DATA = ["d0", "d1"]


def recount(store: ShardStore) -> dict[str, dict[str, int]]:
    """Per request: the count of each status among its ``reqs`` rows (a scan, which the counters avoid)."""
    out: dict[str, Counter] = {}
    rows, cursor = store.scan(tables.REQS, None, 1000)
    while cursor is not None:
        more, cursor = store.scan(tables.REQS, cursor, 1000)
        rows += more
    for row in rows:
        out.setdefault(row["request_id"], Counter())[row["status"]] += 1
    return {rid: {s: c[s] for s in request_stats.STATUSES} for rid, c in out.items()}


def stranded(store: ShardStore) -> list[tuple[str, str]]:
    """``reqs`` rows still pending while their VIN has no queued row of the request (counted pending forever)."""
    rows, cursor = store.scan(tables.REQS, None, 1000)
    while cursor is not None:
        more, cursor = store.scan(tables.REQS, cursor, 1000)
        rows += more
    return [(r["request_id"], r["vin"]) for r in rows if r["status"] == tables.STATUS_PENDING
            and not any(q.request_id == r["request_id"] for q in store.next_rows(r["vin"], 1000))]


def counters(store: ShardStore) -> dict[str, dict[str, int]]:
    return {c["request_id"]: {s: c[s] for s in request_stats.STATUSES}
            for c in store.request_counters_all() if c["vins"]}


def delivered_times(store: ShardStore, request_id: str) -> list[int]:
    return [r["delivered_ts_ms"] for r in store.request_rows(request_id) if r["status"] == tables.STATUS_DELIVERED]


OPS = st.one_of(
    st.tuples(st.just("ingest"), st.sampled_from(REQUESTS), st.sampled_from(DATA),
              st.lists(st.sampled_from(VINS), min_size=1, max_size=6), st.integers(0, 5)),
    st.tuples(st.just("ack"), st.sampled_from(VINS)),
    st.tuples(st.just("late_ack"), st.sampled_from(REQUESTS), st.sampled_from(VINS)),
    st.tuples(st.just("discard"), st.sampled_from(VINS)),
    st.tuples(st.just("expire_row"), st.sampled_from(VINS)),
    st.tuples(st.just("expire_request"), st.sampled_from(REQUESTS)),
    st.tuples(st.just("cancel"), st.sampled_from(REQUESTS)),
    st.tuples(st.just("ttl"), st.sampled_from(REQUESTS), st.integers(1, 10_000)),
    st.tuples(st.just("gc_reqs"), st.sampled_from(REQUESTS), st.sampled_from(VINS)),
    st.tuples(st.just("gc_ids"), st.sampled_from(VINS), st.sampled_from(["expired", "discarded"])),
    st.tuples(st.just("restart")),
)


def batch_for(store: ShardStore, op: tuple, now: int) -> WriteBatch | None:
    kind = op[0]
    if kind == "ingest":
        _, rid, did, vins, dt = op
        return WriteBatch().enqueue_many(vins, T0 + dt, rid, did)
    if kind in ("ack", "discard", "expire_row"):
        rows = store.next_rows(op[1], limit=1)
        if not rows:
            return None
        b = WriteBatch()
        return {"ack": b.ack_rows, "discard": b.discard_rows, "expire_row": b.expire_rows}[kind]([rows[0].key], now)
    if kind == "late_ack":  # a PUBACK of a row that may already be settled (cancelled, expired, acked)
        req = store.get_req(op[1], op[2])
        return None if req is None else WriteBatch().ack(op[2], req["ts_ms"], op[1], now)
    if kind == "expire_request":
        return WriteBatch().settle_pending(op[1], tables.STATUS_EXPIRED, now)
    if kind == "cancel":
        return WriteBatch().settle_pending(op[1], tables.STATUS_CANCELLED, now)
    if kind == "ttl":
        return WriteBatch().set_expiry(op[1], T0 + op[2])
    if kind == "gc_reqs":
        return WriteBatch().delete_reqs(op[1], op[2])
    if kind == "gc_ids":  # a GC plan's delete of the VIN's oldest row: past retention, or its blob gone
        rows = store.next_rows(op[1], limit=1)
        return None if not rows else WriteBatch().settle_ids_if(op[1], rows[0].ts_ms, rows[0].request_id,
                                                                rows[0].data_id, op[2], now)
    raise AssertionError(kind)


@settings(max_examples=150, deadline=None)
@given(st.lists(OPS, max_size=40))
def test_counters_equal_a_recount_of_the_rows(ops):
    with tempfile.TemporaryDirectory() as tmp:
        primary = ShardStore(shard_dir(tmp, 0), 0, sync=False)
        replica = ShardStore(f"{tmp}/replica", 0, sync=False)
        try:
            for n, op in enumerate(ops):
                if op[0] == "restart":
                    primary.close()
                    primary = ShardStore(shard_dir(tmp, 0), 0, sync=False)
                    continue
                batch = batch_for(primary, op, T0 + 100 + n)
                if batch is None:
                    continue
                result = primary.apply(batch)
                replica.apply(WriteBatch.from_bytes(batch.to_bytes()), seq=result.seq)
            for store in (primary, replica):
                assert counters(store) == recount(store)
                assert not stranded(store)  # GC's ids deletes settled their rows: nothing pending unqueued
                for c in store.request_counters_all():
                    times = delivered_times(store, c["request_id"])
                    if times:
                        assert c["first_delivery_ms"] <= min(times) and c["last_delivery_ms"] >= max(times)
            assert table_digests(replica) == table_digests(primary)
        finally:
            primary.close()
            replica.close()


def test_cancel_removes_pending_rows_and_a_late_puback_is_recorded(store):
    store.apply(WriteBatch().enqueue_many(["A", "B", "C"], T0, "r", "d"))
    store.apply(WriteBatch().ack("A", T0, "r", T0 + 5))
    result = store.apply(WriteBatch().settle_pending("r", tables.STATUS_CANCELLED, T0 + 6))
    assert result.counts["cancelled_rows"] == 2
    assert store.next_rows("B") == [] and store.next_rows("C") == []
    c = store.request_counters("r")
    assert (c["vins"], c["pending"], c["delivered"], c["cancelled"]) == (3, 0, 1, 2)
    assert c["first_delivery_ms"] == c["last_delivery_ms"] == T0 + 5
    # B had its row in flight: its PUBACK arrives after the cancel and is recorded
    store.apply(WriteBatch().ack("B", T0, "r", T0 + 9))
    c = store.request_counters("r")
    assert (c["pending"], c["delivered"], c["cancelled"], c["last_delivery_ms"]) == (0, 2, 1, T0 + 9)
    # an expiry or discard after the cancel does not rewrite the settled row
    store.apply(WriteBatch().expire_rows([ids_key("C", T0, "r")], T0 + 10))
    assert store.get_req("r", "C")["status"] == tables.STATUS_CANCELLED


def test_counters_survive_a_reopen_and_the_ttl_is_kept(tmp_path):
    path = shard_dir(tmp_path, 0)
    with ShardStore(path, 0, sync=False) as s:
        s.apply(WriteBatch().set_expiry("r", T0 + 3000).enqueue_many(["A", "B"], T0, "r", "d"))
        s.apply(WriteBatch().expire_rows([ids_key("A", T0, "r")], T0 + 4000))
    with ShardStore(path, 0, sync=False) as s:
        c = s.request_counters("r")
        assert (c["vins"], c["pending"], c["expired"], c["expires_ms"]) == (2, 1, 1, T0 + 3000)
        assert s.request_counters("unknown") is None


def test_merge_over_shards():
    parts = [{"request_id": "r", "vins": 2, "pending": 1, "delivered": 1, "discarded": 0, "expired": 0,
              "cancelled": 0, "first_delivery_ms": 5, "last_delivery_ms": 5, "expires_ms": None},
             {"request_id": "r", "vins": 3, "pending": 0, "delivered": 2, "discarded": 0, "expired": 1,
              "cancelled": 0, "first_delivery_ms": 3, "last_delivery_ms": 9, "expires_ms": 100}]
    m = request_stats.merge(parts)
    assert (m["vins"], m["pending"], m["delivered"], m["expired"]) == (5, 1, 3, 1)
    assert (m["first_delivery_ms"], m["last_delivery_ms"], m["expires_ms"]) == (3, 9, 100)
    assert request_stats.state_of(m) == "active"
    assert request_stats.state_of({**m, "pending": 0}) == "expired"


def test_settle_pending_refuses_other_statuses():
    with pytest.raises(ValueError):
        WriteBatch().settle_pending("r", tables.STATUS_DELIVERED, T0)


def test_request_states_counted_over_shards(tmp_path):
    stores = [ShardStore(shard_dir(tmp_path, k), k, sync=False) for k in range(2)]
    try:
        stores[0].apply(WriteBatch().enqueue_many(["A"], T0, "mixed", "d").enqueue_many(["A"], T0, "gone", "d"))
        stores[1].apply(WriteBatch().enqueue_many(["B"], T0, "mixed", "d").enqueue_many(["B"], T0, "late", "d"))
        stores[0].apply(WriteBatch().ack("A", T0, "mixed", T0 + 1).settle_pending("gone", tables.STATUS_CANCELLED, T0))
        stores[1].apply(WriteBatch().settle_pending("late", tables.STATUS_EXPIRED, T0))
        rows = [s.request_states() for s in stores]
        assert request_stats.count_states(rows) == {"active": 1, "done": 0, "cancelled": 1, "expired": 1}
        stores[1].apply(WriteBatch().ack("B", T0, "mixed", T0 + 2))
        assert request_stats.count_states([s.request_states() for s in stores])["done"] == 1
    finally:
        for s in stores:
            s.close()


def test_a_cancel_is_final_a_later_trigger_naming_the_request_queues_nothing(store):
    store.apply(WriteBatch().enqueue_many(["A"], T0, "r", "d"))
    store.apply(WriteBatch().settle_pending("r", tables.STATUS_CANCELLED, T0 + 1))
    result = store.apply(WriteBatch().enqueue_many(["A", "B"], T0 + 2, "r", "d"))  # a re-send, and a new VIN
    assert result.counts == {"enqueue_cancelled": 2}
    assert store.pending_count() == 0
    c = store.request_counters("r")
    assert (c["vins"], c["cancelled"], c["cancelled_ms"]) == (1, 1, T0 + 1)
    # cancelling on a shard that never saw the request keeps it from queuing there later, too
    store.apply(WriteBatch().settle_pending("elsewhere", tables.STATUS_CANCELLED, T0 + 3))
    assert store.apply(WriteBatch().enqueue_many(["C"], T0 + 4, "elsewhere", "d")).counts == {"enqueue_cancelled": 1}
    assert store.request_counters("elsewhere")["vins"] == 0


# -- the one-time migration of a store written before the counters existed -------------------------------------

def write_pre_counter_store(path, rows: list[tuple[str, str, int, str, str, int | None]], seq: int) -> None:
    """The layout of a store written before the ``requests`` table: ``ids``/``reqs``/``sys`` rows put directly
    with lmdb (no ``requests`` table, no build mark); ``rows`` are (request_id, vin, ts, data_id, status, done)."""
    import lmdb

    path.mkdir(parents=True)
    env = lmdb.open(str(path), max_dbs=12, sync=False)
    dbs = {name: env.open_db(name.encode()) for name in ("data", "meta", "ids", "reqs", "sys", "retained", "metrics")}
    with env.begin(write=True) as txn:
        for rid, vin, ts, did, status, done in rows:
            txn.put(keys_mod.reqs_key(rid, vin), tables.encode_req(ts, did, status, done), db=dbs["reqs"])
            if status == tables.STATUS_PENDING:
                txn.put(keys_mod.ids_key(vin, ts, rid), tables.pack(did), db=dbs["ids"])
        txn.put(tables.SYS_APPLIED_SEQ, tables.pack(seq), db=dbs["sys"])
        txn.put(tables.SYS_SHARD_ID, tables.pack(0), db=dbs["sys"])
    assert b"requests" not in [k for k, _ in env.begin().cursor()]  # the main db lists the named tables
    env.close()


PRE_COUNTER_ROWS = [("old-a", f"A{i}", T0, "d", tables.STATUS_DELIVERED, T0 + 10 * (i + 1)) for i in range(3)] + [
    ("old-a", "A3", T0, "d", tables.STATUS_PENDING, None), ("old-a", "A4", T0, "d", tables.STATUS_DISCARDED, T0 + 99),
    ("old-b", "B0", T0 + 5, "e", tables.STATUS_PENDING, None), ("old-b", "B1", T0 + 5, "e", tables.STATUS_PENDING, None)]


def test_a_store_written_before_the_counters_gets_them_once_at_open(tmp_path):
    from structlog.testing import capture_logs

    path = shard_dir(tmp_path, 0)
    write_pre_counter_store(path, PRE_COUNTER_ROWS, seq=7)
    with capture_logs() as logs, ShardStore(path, 0, sync=False) as s:
        assert counters(s) == recount(s) == {
            "old-a": {"pending": 1, "delivered": 3, "discarded": 1, "expired": 0, "cancelled": 0},
            "old-b": {"pending": 2, "delivered": 0, "discarded": 0, "expired": 0, "cancelled": 0}}
        a = s.request_counters("old-a")
        assert (a["vins"], a["first_delivery_ms"], a["last_delivery_ms"]) == (5, T0 + 10, T0 + 30)
        assert s.applied_seq == 7  # a migration, not a write: no seq of its own
        # from now on the writes keep them
        s.apply(WriteBatch().ack("A3", T0, "old-a", T0 + 50).enqueue_many(["B2"], T0 + 6, "old-b", "e"))
        assert counters(s) == recount(s)
    built = [e for e in logs if e["event"] == "request_counters_built"]
    assert [(e["requests"], e["reqs_rows"]) for e in built] == [(2, 7)]
    # reopened: the mark says built, nothing is recounted (a row changed behind its back stays uncounted)
    import lmdb

    env = lmdb.open(str(path), max_dbs=12, sync=False)
    with env.begin(write=True) as txn:
        txn.put(keys_mod.reqs_key("old-b", "B9"), tables.encode_req(T0, "e", "pending"), db=env.open_db(b"reqs", txn=txn))
    env.close()
    with capture_logs() as logs, ShardStore(path, 0, sync=False) as s:
        assert s.request_counters("old-b")["pending"] == 3 and recount(s)["old-b"]["pending"] == 4
    assert not [e for e in logs if e["event"] == "request_counters_built"]


def test_replicas_of_a_pre_counter_store_build_the_same_counters(tmp_path):
    write_pre_counter_store(tmp_path / "primary", PRE_COUNTER_ROWS, seq=7)
    write_pre_counter_store(tmp_path / "replica", PRE_COUNTER_ROWS, seq=7)
    with ShardStore(tmp_path / "primary", 0, sync=False) as primary, \
            ShardStore(tmp_path / "replica", 0, sync=False) as replica:
        assert table_digests(replica) == table_digests(primary)
        batch = WriteBatch().ack("B0", T0 + 5, "old-b", T0 + 60).settle_pending("old-a", tables.STATUS_CANCELLED, T0 + 70)
        result = primary.apply(batch)
        replica.apply(WriteBatch.from_bytes(batch.to_bytes()), seq=result.seq)
        assert table_digests(replica) == table_digests(primary) and counters(replica) == recount(replica)


def test_a_store_whose_counters_were_kept_rebuilds_to_the_same_values(tmp_path):
    """A store of the first counter release has no build mark: the rebuild writes its counters back unchanged,
    expiry and cancel times included."""
    import lmdb

    path = shard_dir(tmp_path, 0)
    with ShardStore(path, 0, sync=False) as s:
        s.apply(WriteBatch().set_expiry("r", T0 + 500).enqueue_many(["A", "B", "C"], T0, "r", "d"))
        s.apply(WriteBatch().ack("A", T0, "r", T0 + 7).settle_pending("c", tables.STATUS_CANCELLED, T0 + 8))
        before = s.request_counters_all()
    env = lmdb.open(str(path), max_dbs=12, sync=False)
    with env.begin(write=True) as txn:
        assert txn.delete(tables.SYS_REQUESTS_BUILT, db=env.open_db(b"sys", txn=txn))
    env.close()
    with ShardStore(path, 0, sync=False) as s:
        assert s.request_counters_all() == before


def test_one_batch_of_many_outcomes_writes_what_one_batch_per_outcome_writes(tmp_path):
    """A tick's batch settles many rows of many requests (more than the per-transaction caches of
    ``storage.row_outcomes.ApplyTally`` hold): acks, a repeated ack, discards, expiries, a late ack of a settled
    row. Applied as ONE batch it leaves the tables (rows, counters, receipts) exactly as one batch per outcome
    does, every ``reqs`` value is the plain encoding of its fields, and a replica applying the bytes is equal."""
    from storage import row_outcomes

    requests = [f"req{i:05d}" for i in range(row_outcomes.CACHE_MAX + 50)]
    enqueue = WriteBatch()
    for n, rid in enumerate(requests):
        enqueue.enqueue_many(VINS[:4], T0 + n % 7, rid, DATA[n % 2])
    outcomes = WriteBatch()
    for n, rid in enumerate(requests):
        ts = T0 + n % 7
        outcomes.ack_rows([ids_key(VINS[0], ts, rid)], T0 + 500)
        outcomes.ack_rows([ids_key(VINS[0], ts, rid)], T0 + 501)  # a repeated PUBACK: no second receipt
        outcomes.discard_rows([ids_key(VINS[1], ts, rid)], T0 + 500)
        outcomes.expire_rows([ids_key(VINS[2], ts, rid)], T0 + 502)
        outcomes.ack(VINS[2], ts, rid, T0 + 503)  # late PUBACK of the expired row: the vehicle has it
    for n, rid in enumerate(requests):  # the next tick's acks (group commit merges two delete batches)
        outcomes.ack_rows([ids_key(VINS[3], T0 + n % 7, rid)], T0 + 510)
    one = ShardStore(shard_dir(tmp_path / "one", 0), 0, sync=False)
    each = ShardStore(shard_dir(tmp_path / "each", 0), 0, sync=False)
    replica = ShardStore(tmp_path / "replica", 0, sync=False)
    try:
        for store in (one, each):
            store.apply(WriteBatch.from_bytes(enqueue.to_bytes()))
        replica.apply(WriteBatch.from_bytes(enqueue.to_bytes()))
        result = one.apply(WriteBatch.from_bytes(outcomes.to_bytes()))
        assert result.counts["ack_deleted"] == 2 * len(requests)
        assert result.counts["ack_missing"] == 2 * len(requests)
        replica.apply(WriteBatch.from_bytes(outcomes.to_bytes()), seq=result.seq)
        for op in outcomes.ops:
            each.apply(WriteBatch([op]))
        tables_of = {name: {db: d for db, d in table_digests(store).items() if db != "applied_seq"}
                     for name, store in (("one", one), ("each", each), ("replica", replica))}
        assert tables_of["one"] == tables_of["each"] == tables_of["replica"]
        assert counters(one) == recount(one)
        assert counters(one)[requests[0]] == {"pending": 0, "delivered": 3, "discarded": 1, "expired": 0,
                                              "cancelled": 0}
        with one.snapshot_view() as view:
            stored = [(k, v) for ks, vs in view.raw_chunks(tables.REQS) for k, v in zip(ks, vs)]
        assert len(stored) == 4 * len(requests)
        for key, value in stored:
            row = tables.decode_row(tables.REQS, key, value)
            assert value == tables.encode_req(row["ts_ms"], row["data_id"], row["status"], row["delivered_ts_ms"])
    finally:
        for store in (one, each, replica):
            store.close()
