"""ShardStore on real LMDB files: batch verbs, read verbs, atomicity, map growth, reopen."""
from __future__ import annotations

import hashlib

import lmdb
import pytest

from storage import (
    BatchFormatError,
    FencedError,
    SequenceError,
    ShardStore,
    StoreClosedError,
    StoreError,
    StoreFullError,
    WriteBatch,
    shard_dir,
)
from storage import batch as B
from storage import tables

T0 = 1_700_000_000_000


def dump(store: ShardStore) -> dict[str, list[dict]]:
    out = {}
    for db in tables.ALL_DBS:
        rows, cursor = store.scan(db, None, 7)
        while cursor is not None:
            more, cursor = store.scan(db, cursor, 7)
            rows += more
        out[db] = rows
    return out


def test_enqueue_is_idempotent_per_request_vin_and_data(store):
    r1 = store.apply(WriteBatch().enqueue_many(["V2", "V1", "V3"], T0, "req", "d1"))
    assert r1.seq == 1 and r1.counts == {"enqueue_new": 3, "enqueue_dup": 0}
    # retried trigger (even with a later ts) queues nothing new
    r2 = store.apply(WriteBatch().enqueue_many(["V1", "V3", "V4"], T0 + 5, "req", "d1"))
    assert r2.counts == {"enqueue_new": 1, "enqueue_dup": 2}
    assert store.pending_count() == 4
    assert [r.ts_ms for r in store.next_rows("V1", limit=5)] == [T0]
    # a VIN listed twice in one op counts once
    r3 = store.apply(WriteBatch().enqueue_many(["V9", "V9"], T0, "req2", "d1"))
    assert r3.counts == {"enqueue_new": 1, "enqueue_dup": 1}
    assert store.get_req("req", "V4")["ts_ms"] == T0 + 5


def test_enqueue_dup_after_delivery_and_requeue_with_other_data(store):
    store.apply(WriteBatch().enqueue("V1", T0, "req", "d1"))
    store.apply(WriteBatch().ack("V1", T0, "req", T0 + 10))
    assert store.apply(WriteBatch().enqueue("V1", T0 + 20, "req", "d1")).counts["enqueue_dup"] == 1
    assert store.next_rows("V1") == []
    # same request id re-used with another blob is queued again, reqs follows the new data id
    res = store.apply(WriteBatch().enqueue("V1", T0 + 30, "req", "d2").enqueue("V1", T0 + 30, "req", "d2"))
    assert res.counts == {"enqueue_new": 1, "enqueue_dup": 1}
    assert [(r.ts_ms, r.data_id) for r in store.next_rows("V1", 5)] == [(T0 + 30, "d2")]
    assert store.get_req("req", "V1")["data_id"] == "d2"
    assert store.get_req("req", "V1")["status"] == "pending"


def test_enqueue_mixed_fresh_and_existing_in_one_op(store):
    store.apply(WriteBatch().enqueue_many(["V1", "V2"], T0, "req", "d1"))
    res = store.apply(WriteBatch().enqueue_many(["V3", "V1", "V4", "V3"], T0, "req", "d1"))
    assert res.counts == {"enqueue_new": 2, "enqueue_dup": 2}
    assert store.pending_count() == 4


def test_enqueue_requeue_fresh_and_in_op_duplicates_together(store):
    store.apply(WriteBatch().enqueue_many(["V1", "V2", "V4"], T0, "req", "d1"))
    res = store.apply(WriteBatch().enqueue_many(["V3", "V1", "V2", "V1", "V3"], T0 + 1, "req", "d2"))
    assert res.counts == {"enqueue_new": 3, "enqueue_dup": 2}
    assert [(r.data_id, r.ts_ms) for r in store.next_rows("V1", 5)] == [("d1", T0), ("d2", T0 + 1)]
    assert [r.data_id for r in store.next_rows("V3", 5)] == ["d2"]
    assert {r["vin"]: r["data_id"] for r in store.request_rows("req")} == {"V1": "d2", "V2": "d2", "V3": "d2", "V4": "d1"}


def test_consecutive_enqueue_calls_coalesce():
    b = WriteBatch()
    for vin in ("A", "B", "C"):
        b.enqueue(vin, T0, "r", "d")
    b.enqueue("D", T0, "r2", "d")
    assert len(b.ops) == 2 and len(b) == 4
    assert b.counts() == {"enqueue": 4}


def test_blob_dedup_refreshes_ts_only(store):
    store.apply(WriteBatch().put_blob("d1", b"payload", T0))
    before = store.get_meta("d1")
    assert before == {"data_id": "d1", "ts_ms": T0, "size": 7, "sha1": hashlib.sha1(b"payload").hexdigest()}
    res = store.apply(WriteBatch().put_blob("d1", b"payload", T0 + 100))
    assert res.counts == {"blob_refreshed": 1}
    assert store.get_meta("d1")["ts_ms"] == T0 + 100
    assert store.get_blob("d1") == b"payload"
    # an older time never moves ts back; other content replaces the blob
    store.apply(WriteBatch().put_blob("d1", b"payload", T0 + 1))
    assert store.get_meta("d1")["ts_ms"] == T0 + 100
    assert store.apply(WriteBatch().put_blob("d1", b"other", T0 + 200)).counts == {"blob_replaced": 1}
    assert store.get_blob("d1") == b"other" and store.get_meta("d1")["size"] == 5
    store.apply(WriteBatch().touch_meta("d1", T0 + 300).touch_meta("nope", T0))
    assert store.get_meta("d1")["ts_ms"] == T0 + 300


def test_blob_dedup_does_not_rewrite_the_data_table(store, monkeypatch):
    from storage import batch_apply as apply_mod

    store.apply(WriteBatch().put_blob("d1", b"x" * 10_000, T0))
    names = {id(handle): name for name, handle in store._dbs._asdict().items()}
    written: list[str] = []

    class SpyTxn:
        def __init__(self, txn):
            self._txn = txn

        def put(self, key, value, *args, db=None, **kwargs):
            written.append(names[id(db)])
            return self._txn.put(key, value, *args, db=db, **kwargs)

        def __getattr__(self, name):
            return getattr(self._txn, name)

    real = apply_mod._HANDLERS[B.PUT_BLOB]
    monkeypatch.setitem(apply_mod._HANDLERS, B.PUT_BLOB, lambda txn, dbs, op, *rest: real(SpyTxn(txn), dbs, op, *rest))
    store.apply(WriteBatch().put_blob("d1", b"x" * 10_000, T0 + 1))
    assert written == ["meta"]
    store.apply(WriteBatch().put_blob("d1", b"y" * 10_000, T0 + 2))
    assert written == ["meta", "data", "meta"]


def test_next_rows_oldest_first_and_no_prefix_leak(store):
    b = WriteBatch()
    b.enqueue("A1", T0 + 2, "r-b", "d")
    b.enqueue("A1", T0 + 1, "r-z", "d")
    b.enqueue("A1", T0 + 2, "r-a", "d")
    b.enqueue("A10", T0, "r-0", "d")
    b.enqueue("A", T0, "r-0", "d")
    b.enqueue("A2", T0 - 5, "r-0", "d")
    store.apply(b)
    rows = store.next_rows("A1", limit=10)
    assert [(r.ts_ms, r.request_id) for r in rows] == [(T0 + 1, "r-z"), (T0 + 2, "r-a"), (T0 + 2, "r-b")]
    assert {r.vin for r in rows} == {"A1"}
    assert [r.vin for r in store.next_rows("A10", 10)] == ["A10"]
    assert store.next_rows("A1", limit=1)[0].request_id == "r-z"
    after = store.next_rows("A1", limit=2, after_key=rows[0].key)
    assert [r.request_id for r in after] == ["r-a", "r-b"]
    assert store.next_rows("A1", after_key=rows[-1].key) == []
    assert store.next_rows("NOPE") == []
    assert store.pending_count("A1") == 3 and store.pending_count("A") == 1 and store.pending_count() == 6
    many = store.next_rows_many(["A1", "A10", "NOPE"], limit=1)
    assert set(many) == {"A1", "A10"} and many["A1"][0].request_id == "r-z"
    with pytest.raises(ValueError):
        store.next_rows("A1", after_key=store.next_rows("A10")[0].key)


def test_ack_deletes_row_and_marks_delivered(store):
    store.apply(WriteBatch().enqueue_many(["V1", "V2"], T0, "req", "d1"))
    res = store.apply(WriteBatch().ack("V1", T0, "req", T0 + 50).ack("V1", T0, "req", T0 + 60))
    assert res.counts == {"ack_deleted": 1, "ack_missing": 1}
    assert store.next_rows("V1") == []
    req = store.get_req("req", "V1")
    assert req["status"] == "delivered" and req["data_id"] == "d1" and req["ts_ms"] == T0
    assert req["delivered_ts_ms"] == T0 + 60
    assert [r["status"] for r in store.request_rows("req")] == ["delivered", "pending"]
    assert store.get_req("req", "V9") is None


def test_guarded_deletes(store):
    store.apply(WriteBatch().put_blob("d1", b"a", T0).put_blob("d2", b"b", T0).enqueue("V1", T0, "r", "d1"))
    b = (
        WriteBatch()
        .delete_blob_if("d1", T0 - 1)  # stale plan: skipped
        .delete_blob_if("d2", T0)
        .delete_ids_if("V1", T0, "r", "other")  # row changed: skipped
        .delete_reqs_if("r", "V1", T0, "delivered")  # status differs: skipped
    )
    assert store.apply(b).counts == {"guard_skipped": 3, "deleted": 1}
    assert store.get_blob("d1") == b"a" and store.get_blob("d2") is None and store.get_meta("d2") is None
    b = WriteBatch().delete_ids_if("V1", T0, "r", "d1").delete_reqs_if("r", "V1", T0, "pending").delete_blob("d1")
    assert store.apply(b).counts == {"deleted": 3}
    assert store.pending_count() == 0 and store.get_req("r", "V1") is None and store.get_blob("d1") is None
    b = WriteBatch().delete_ids("V1", T0, "r").delete_reqs("r", "V1").delete_blob("d1")
    assert store.apply(b).counts == {"delete_missing": 3}


def test_retained_and_metrics(store):
    long_topic = "t/" + "x" * 600
    b = WriteBatch().put_retained("a/b", b"1", 1, T0).put_retained(long_topic, b"2", 0, T0)
    b.put_metric("$SYS/broker/clients/connected", 5, T0).put_metric("uptime", 1.5, T0)
    store.apply(b)
    assert sorted(r["topic"] for r in store.get_retained_all()) == sorted(["a/b", long_topic])
    store.apply(WriteBatch().delete_retained(long_topic).put_metric("uptime", 2.5, T0 + 1))
    assert store.get_retained_all() == [{"topic": "a/b", "payload": b"1", "qos": 1, "ts_ms": T0}]
    assert {m["name"]: m["value"] for m in store.get_metrics_all()} == {
        "$SYS/broker/clients/connected": 5,
        "uptime": 2.5,
    }


def test_applied_seq_bumps_in_same_txn_and_failed_batch_leaves_nothing(store):
    store.apply(WriteBatch().enqueue("V1", T0, "r", "d"))
    before = dump(store)
    bad = WriteBatch().enqueue("V2", T0, "r", "d").put_blob("d9", b"x", T0)
    bad.ops.append((99, "bogus"))  # raises after two ops ran inside the transaction
    with pytest.raises(BatchFormatError):
        store.apply(bad)
    assert store.applied_seq == 1
    assert dump(store) == before
    malformed = WriteBatch().put_metric("m", 1, T0)
    malformed.ops.append((B.ACK, "V1"))
    with pytest.raises(BatchFormatError, match="ack"):
        store.apply(malformed)
    assert store.applied_seq == 1 and dump(store) == before


def test_seq_and_epoch_rules(store):
    assert store.apply(WriteBatch(), seq=1, epoch=3).seq == 1
    assert store.epoch == 3
    with pytest.raises(SequenceError):
        store.apply(WriteBatch(), seq=3)
    with pytest.raises(SequenceError):
        store.apply(WriteBatch(), seq=1)
    with pytest.raises(FencedError) as info:
        store.apply(WriteBatch().enqueue("V", T0, "r", "d"), epoch=2)
    assert info.value.known_epoch == 3
    assert store.applied_seq == 1 and store.pending_count() == 0
    store.set_epoch(3)
    store.set_epoch(5)
    with pytest.raises(FencedError):
        store.set_epoch(4)
    assert store.apply(WriteBatch()).epoch == 5


def test_map_grows_from_tiny_map_on_map_full(tmp_path):
    # grow_ahead off: the MapFullError -> abort -> double -> retry path does all the work
    store = ShardStore(tmp_path / "s", 0, map_size_bytes=64 << 10, sync=False, grow_ahead=False)
    vins = [f"VIN{i:08d}" for i in range(20_000)]
    res = store.apply(WriteBatch().enqueue_many(vins, T0, "req", "d").put_blob("d", b"z" * 300_000, T0))
    assert res.counts["enqueue_new"] == 20_000
    stats = store.stats()
    assert stats["map_size_bytes"] > 64 << 10 and stats["entries"]["ids"] == 20_000
    assert store.applied_seq == 1
    store.close()


def test_map_grows_ahead_of_a_big_batch(tmp_path):
    store = ShardStore(tmp_path / "s", 0, map_size_bytes=64 << 10, sync=False)
    vins = [f"VIN{i:08d}" for i in range(20_000)]
    store.apply(WriteBatch().enqueue_many(vins, T0, "req", "d"))
    assert store.pending_count() == 20_000
    store.close()


def test_store_full_error_at_max_map_size(tmp_path):
    store = ShardStore(tmp_path / "s", 0, map_size_bytes=64 << 10, max_map_size_bytes=256 << 10, sync=False)
    store.apply(WriteBatch().put_blob("small", b"x", T0))
    with pytest.raises(StoreFullError) as info:
        store.apply(WriteBatch().put_blob("big", b"y" * (1 << 20), T0))
    message = str(info.value)
    assert str(tmp_path / "s") in message and "max_map_size_bytes 262144" in message
    assert store.applied_seq == 1 and store.get_blob("big") is None
    store.apply(WriteBatch().put_blob("small2", b"x", T0))  # still usable
    assert store.applied_seq == 2
    store.close()


def test_reopen_preserves_everything(tmp_path):
    path = shard_dir(tmp_path, 3)
    store = ShardStore(path, 3)
    store.apply(
        WriteBatch()
        .put_blob("d1", b"blob", T0)
        .enqueue_many(["V1", "V2"], T0, "req", "d1")
        .put_retained("r/t", b"p", 1, T0)
        .put_metric("m", 7, T0),
        epoch=4,
    )
    store.apply(WriteBatch().ack("V1", T0, "req", T0 + 1))
    before = dump(store)
    with pytest.raises(StoreError, match="already open"):
        ShardStore(path, 3)
    store.close()
    store.close()
    with pytest.raises(StoreClosedError):
        store.get_blob("d1")
    with ShardStore(path, 3) as again:
        assert dump(again) == before
        assert again.applied_seq == 2 and again.epoch == 4
    with ShardStore(path, 3, readonly=True) as ro:
        assert ro.get_blob("d1") == b"blob"
        with pytest.raises(StoreError, match="read-only"):
            ro.apply(WriteBatch())
    with pytest.raises(StoreError, match="holds shard 3"):
        ShardStore(path, 4)


def test_missing_keys_return_none(store):
    assert store.get_blob("x") is None and store.get_meta("x") is None
    assert store.get_req("r", "V") is None and store.request_rows("r") == []
    assert store.get_retained_all() == [] and store.applied_seq == 0 and store.epoch == 0


def test_scan_is_incremental_and_complete(store):
    vins = [f"V{i:03d}" for i in range(25)]
    store.apply(WriteBatch().enqueue_many(vins, T0, "req", "d"))
    seen, cursor, steps = [], None, 0
    while True:
        rows, cursor = store.scan("ids", cursor, 10)
        seen += [r["vin"] for r in rows]
        steps += 1
        if cursor is None:
            break
    assert seen == vins and steps == 3
    with pytest.raises(ValueError):
        store.scan("nope")


def test_snapshot_view_is_consistent_and_streams(store):
    store.apply(WriteBatch().enqueue_many([f"V{i}" for i in range(30)], T0, "req", "d"))
    with store.snapshot_view() as view:
        store.apply(WriteBatch().enqueue("LATE", T0, "req", "d"))
        assert view.applied_seq == 1
        chunks = list(view.chunks("ids", chunk_rows=8))
        assert [len(c) for c in chunks] == [8, 8, 8, 6]
        assert view.count("reqs") == 30
        assert all(r["vin"] != "LATE" for r in view.rows("reqs"))
        assert list(chunks[0][0]) == list(tables.ROW_FIELDS["ids"])
    assert store.pending_count() == 31


def test_snapshot_view_invalidated_by_map_growth(tmp_path):
    from storage import SnapshotInvalidatedError

    store = ShardStore(tmp_path / "s", 0, map_size_bytes=64 << 10, sync=False)
    store.apply(WriteBatch().enqueue("V", T0, "r", "d"))
    with store.snapshot_view() as view:
        store.apply(WriteBatch().put_blob("big", b"q" * 400_000, T0))
        with pytest.raises(SnapshotInvalidatedError):
            view.count("ids")
    assert store.get_blob("big") is not None
    store.close()


def test_batch_builders_validate():
    with pytest.raises(ValueError):
        WriteBatch().enqueue("bad\x00vin", T0, "r", "d")
    with pytest.raises(ValueError):
        WriteBatch().enqueue_many(["ok", ""], T0, "r", "d")
    with pytest.raises(ValueError, match="request_id"):
        WriteBatch().enqueue_many(["ok"], T0, "r\x00", "d")
    with pytest.raises(ValueError):
        WriteBatch().put_blob("d", "not bytes", T0)
    with pytest.raises(ValueError):
        WriteBatch().put_retained("t", b"", 3, T0)
    with pytest.raises(ValueError):
        WriteBatch().put_metric("m", None, T0)


def test_disk_full_becomes_store_full_error(store, monkeypatch):
    import errno

    def disk_full(*args, **kwargs):
        raise lmdb.DiskError("mdb_txn_commit", errno.ENOSPC)

    monkeypatch.setattr(store, "_apply_once", disk_full)
    with pytest.raises(StoreFullError, match="disk full"):
        store.apply(WriteBatch().put_metric("m", 1, T0))

    def os_full(*args, **kwargs):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(store, "_apply_once", os_full)
    with pytest.raises(StoreFullError, match="disk full"):
        store.apply(WriteBatch().put_metric("m", 1, T0))


def test_reads_in_threads_survive_map_growth(tmp_path):
    import threading

    store = ShardStore(tmp_path / "s", 0, map_size_bytes=64 << 10, sync=False, grow_ahead=False)
    store.apply(WriteBatch().enqueue("V0", T0, "r", "d").put_blob("d", b"blob", T0))
    errors: list[BaseException] = []
    stop = threading.Event()

    def reader():
        try:
            while not stop.is_set():
                assert store.next_rows("V0")[0].data_id == "d"
                assert store.get_blob("d") == b"blob"
                store.scan("ids", None, 50)
        except BaseException as exc:  # surfaced below
            errors.append(exc)

    threads = [threading.Thread(target=reader) for _ in range(3)]
    for t in threads:
        t.start()
    try:
        for i in range(12):
            store.apply(WriteBatch().enqueue_many([f"W{i}-{j:05d}" for j in range(1500)], T0, "r", "d"))
    finally:
        stop.set()
        for t in threads:
            t.join()
    assert not errors, errors
    assert store.stats()["map_size_bytes"] > 64 << 10 and store.pending_count() == 1 + 12 * 1500
    store.close()


def test_space_estimate_of_small_ops_is_counted_per_opcode_and_equals_the_per_op_sum():
    """An ack batch (small ops only) is estimated from its opcode counts; the figure is the per-op sum the
    general loop gives (it does once a sized op is in), and a malformed op does not break the estimate."""
    from storage import batch as B
    from storage.keys import ids_key

    acks = WriteBatch().ack_rows([ids_key(f"V{i}", 5, "r1") for i in range(300)], 9).settle_pending("r1", "cancelled", 9)
    per_op = (300 * (B._EST_SMALL_OP + B._EST_RECEIPT) + B._EST_SMALL_OP, 2 * 301)
    assert acks.space_estimate() == per_op
    with_enqueue = WriteBatch(list(acks.ops)).enqueue_many(["A", "B"], 5, "r2", "d1")
    enqueue_only = WriteBatch().enqueue_many(["A", "B"], 5, "r2", "d1").space_estimate()
    assert with_enqueue.space_estimate() == (per_op[0] + enqueue_only[0], per_op[1] + enqueue_only[1])
    assert WriteBatch(list(acks.ops) + [()]).space_estimate() == (per_op[0] + B._EST_SMALL_OP, per_op[1])
