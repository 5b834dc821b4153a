"""Snapshot export to Parquet (``storage.jobs.export``) with real LMDB stores; no Spark."""
from __future__ import annotations

import json
from contextlib import contextmanager

import pyarrow.parquet as pq
import pytest

from storage import ShardStore, WriteBatch
from storage.errors import SnapshotInvalidatedError
from storage.jobs import export as E

T0 = 1_700_000_000_000


@pytest.fixture
def store(make_store):
    return make_store(3)


def _read(out, table, shard=3):
    return pq.read_table(E.table_dir(out, table, shard) / E.PART_FILE).to_pylist()


def test_export_writes_exact_rows_and_watermark(store, tmp_path):
    store.apply(WriteBatch().put_blob("d1", b"blob-1", T0).put_blob("dé", b"xyz", T0 + 1))
    store.apply(WriteBatch().enqueue_many(["VIN10", "VIN1", "V"], T0 + 5, "req-ü", "d1"))
    store.apply(WriteBatch().enqueue("VIN1", 2**62, "r2", "dé"))
    store.apply(WriteBatch().ack("VIN10", T0 + 5, "req-ü", T0 + 905))
    out = tmp_path / "export"
    info = E.export_shard(store, out, row_group_rows=2)

    assert info.shard == 3 and info.applied_seq == store.applied_seq == 4 and info.attempts == 1
    # the ack wrote one receipt; the catalog holds the implicit receipts topic
    assert info.rows == {"ids": 3, "reqs": 4, "meta": 2, "topics": 1, "topic_log": 1, "topic_offsets": 0}
    assert info.total_rows == 11
    assert info.as_dict()["rows"] == info.rows
    assert _read(out, "ids") == [  # key order: vin, then ts, then request_id ("VIN1" < "VIN10")
        {"vin": "V", "ts_ms": T0 + 5, "request_id": "req-ü", "data_id": "d1", "maybe_dup": True},
        {"vin": "VIN1", "ts_ms": T0 + 5, "request_id": "req-ü", "data_id": "d1", "maybe_dup": True},
        {"vin": "VIN1", "ts_ms": 2**62, "request_id": "r2", "data_id": "dé", "maybe_dup": True},
    ]  # chunks of 2 rows: every VIN here is first or last in its chunk
    assert _read(out, "reqs") == [
        {"request_id": "r2", "vin": "VIN1", "ts_ms": 2**62, "data_id": "dé", "status": "pending", "delivered_ts_ms": None},
        {"request_id": "req-ü", "vin": "V", "ts_ms": T0 + 5, "data_id": "d1", "status": "pending", "delivered_ts_ms": None},
        {"request_id": "req-ü", "vin": "VIN1", "ts_ms": T0 + 5, "data_id": "d1", "status": "pending", "delivered_ts_ms": None},
        {"request_id": "req-ü", "vin": "VIN10", "ts_ms": T0 + 5, "data_id": "d1", "status": "delivered",
         "delivered_ts_ms": T0 + 905},
    ]
    import hashlib

    assert _read(out, "meta") == [  # the first enqueue refreshed d1's ts
        {"data_id": "d1", "ts_ms": T0 + 5, "size": 6, "sha1": hashlib.sha1(b"blob-1").hexdigest()},
        {"data_id": "dé", "ts_ms": 2**62, "size": 3, "sha1": hashlib.sha1(b"xyz").hexdigest()},
    ]
    mark = json.loads(E.watermark_path(out, 3).read_text())
    assert mark["shard"] == 3 and mark["applied_seq"] == 4 and mark["rows"] == info.rows
    assert mark["exported_at_ms"] == info.exported_at_ms
    assert E.read_watermarks(out) == {3: mark}
    assert pq.ParquetFile(E.table_dir(out, "reqs", 3) / E.PART_FILE).metadata.num_row_groups == 2


def test_large_table_streams_in_row_groups(store, tmp_path):
    vins = [f"VIN{i:06d}" for i in range(2_500)]
    store.apply(WriteBatch().put_blob("d", b"x", T0).enqueue_many(vins, T0, "r", "d"))
    store.apply(WriteBatch().enqueue_many(vins[:1000], T0 + 1, "r2", "d"))
    info = E.export_shard(store, tmp_path / "x", row_group_rows=1_000)
    meta = pq.ParquetFile(E.table_dir(tmp_path / "x", "ids", 3) / E.PART_FILE).metadata
    assert info.rows["ids"] == 3_500 and meta.num_rows == 3_500 and meta.num_row_groups == 4
    ids = pq.read_table(E.table_dir(tmp_path / "x", "ids", 3)).to_pydict()
    keys = list(zip(ids["vin"], ids["ts_ms"], ids["request_id"]))
    assert keys == sorted(keys) and len(set(keys)) == 3_500


def test_empty_store_exports_empty_files_with_schema(store, tmp_path):
    info = E.export_shard(store, tmp_path / "x")
    assert info.rows == {"ids": 0, "reqs": 0, "meta": 0, "topics": 1, "topic_log": 0, "topic_offsets": 0}
    for table in E.EXPORT_TABLES:
        t = pq.read_table(E.table_dir(tmp_path / "x", table, 3) / E.PART_FILE)
        assert t.num_rows == (table == "topics") and t.schema.equals(E.SCHEMAS[table])  # topics: receipts


def test_export_is_one_read_transaction(store, tmp_path, monkeypatch):
    """A write committed while the export runs is not in it, and the watermark is the seq before it."""
    store.apply(WriteBatch().put_blob("d", b"x", T0).enqueue_many(["A", "B"], T0, "r", "d"))
    original = store.snapshot_view

    @contextmanager
    def view_then_write():
        with original() as view:
            store.apply(WriteBatch().enqueue_many(["C"], T0 + 1, "r", "d"))  # after the view opened
            yield view

    monkeypatch.setattr(store, "snapshot_view", view_then_write)
    info = E.export_shard(store, tmp_path / "x")
    assert info.applied_seq == 1 and store.applied_seq == 2
    assert [r["vin"] for r in _read(tmp_path / "x", "ids")] == ["A", "B"]
    assert [r["ts_ms"] for r in _read(tmp_path / "x", "meta")] == [T0]


def test_reexport_replaces_the_shard_and_invalidated_snapshot_restarts(store, tmp_path, monkeypatch):
    store.apply(WriteBatch().put_blob("d", b"x", T0).enqueue_many(["A", "B"], T0, "r", "d"))
    out = tmp_path / "x"
    E.export_shard(store, out)
    store.apply(WriteBatch().ack("A", T0, "r", T0 + 1))
    real = E._write_table
    calls = {"n": 0}

    def flaky(view, table, *args):
        calls["n"] += 1
        if calls["n"] == 2:  # second table of the first attempt: the map was resized under the view
            raise SnapshotInvalidatedError("resized")
        return real(view, table, *args)

    monkeypatch.setattr(E, "_write_table", flaky)
    info = E.export_shard(store, out)
    assert info.attempts == 2 and info.rows["ids"] == 1 and [r["vin"] for r in _read(out, "ids")] == ["B"]
    assert sorted(p.name for p in E.table_dir(out, "ids", 3).iterdir()) == [E.PART_FILE]

    def always(view, table, *args):
        raise SnapshotInvalidatedError("resized")

    monkeypatch.setattr(E, "_write_table", always)
    with pytest.raises(SnapshotInvalidatedError):
        E.export_shard(store, out, max_attempts=2)
    assert E.read_watermarks(out) == {}  # an incomplete shard has no watermark
    with pytest.raises(ValueError):
        E.export_shard(store, out, row_group_rows=0)


def test_export_shards_reports_progress(tmp_path):
    stores = {k: ShardStore(tmp_path / f"shard-{k}", k, sync=False) for k in (0, 1)}
    try:
        stores[1].apply(WriteBatch().put_blob("d", b"x", T0).enqueue("V", T0, "r", "d"))
        seen = []
        infos = E.export_shards(stores, tmp_path / "x", progress=lambda i: seen.append(i.shard))
        assert seen == [0, 1] and infos[1].rows["ids"] == 1 and infos[0].applied_seq == 0
        assert sorted(E.read_watermarks(tmp_path / "x")) == [0, 1]
    finally:
        for s in stores.values():
            s.close()


def test_maybe_dup_flags_every_row_that_may_have_a_twin(store, tmp_path):
    """Rows whose (vin, request_id) repeats, and the first/last VIN of each chunk (it may continue)."""
    store.apply(WriteBatch().put_blob("a", b"1", T0).put_blob("b", b"2", T0))
    for vin, ts, rid, did in [("A", 1, "r1", "a"), ("A", 2, "r2", "a"), ("B", 1, "r1", "a"), ("B", 2, "r1", "b"),
                              ("B", 3, "r2", "a"), ("C", 1, "r1", "a"), ("C", 2, "r2", "a"), ("D", 1, "r1", "a"),
                              ("E", 1, "r1", "a"), ("E", 2, "r1", "b")]:
        store.apply(WriteBatch().enqueue(vin, T0 + ts, rid, did))
    flags = {}
    for chunk, expected in ((100, {"A": True, "B": True, "C": False, "D": False, "E": True}),
                            (5, {"A": True, "B": True, "C": True, "D": False, "E": True})):
        E.export_shard(store, tmp_path / str(chunk), row_group_rows=chunk)
        flags = {}
        for row in _read(tmp_path / str(chunk), "ids"):
            flags.setdefault(row["vin"], set()).add((row["request_id"], row["maybe_dup"]))
        got = {vin: any(f for _, f in pairs) for vin, pairs in flags.items()}
        assert got == expected, chunk
    assert flags["B"] == {("r1", True), ("r2", True)}  # chunk 5: B ends the first chunk
    E.export_shard(store, tmp_path / "x", row_group_rows=100)
    b_rows = {(r["request_id"], r["maybe_dup"]) for r in _read(tmp_path / "x", "ids") if r["vin"] == "B"}
    assert b_rows == {("r1", True), ("r2", False)}  # only the repeated request of B is flagged


def test_topic_tables_are_exported_without_payloads_and_with_receipt_fields(store, tmp_path):
    from storage.topics import RECEIPTS, TopicSpec

    store.apply(WriteBatch().put_blob("d", b"B", T0).enqueue_many(["V1", "V2"], T0, "r1", "d")
                .create_topic(TopicSpec.build("resp", "ecp/+/response", retention_ms=60_000), T0))
    store.apply(WriteBatch().ack("V2", T0, "r1", T0 + 9).topic_append(
        "resp", 7, T0 + 3, [("ecp/V1/response", "V1", 1, b"x" * 300, None), ("ecp/V1/response", "V1", 0, b"", None)])
        .topic_commit("resp", "g", 7, 0, T0 + 4))
    out = tmp_path / "x"
    info = E.export_shard(store, out, row_group_rows=1)
    assert info.rows["topic_log"] == 3 and info.rows["topics"] == 2 and info.rows["topic_offsets"] == 1
    log = _read(out, "topic_log")
    assert [(r["topic"], r["partition"], r["offset"], r["ts_ms"]) for r in log] == [
        ("receipts", 3, 0, T0 + 9), ("resp", 7, 0, T0 + 3), ("resp", 7, 1, T0 + 3)]
    assert {k: log[0][k] for k in ("request_id", "vin", "data_id", "status")} == {
        "request_id": "r1", "vin": "V2", "data_id": "d", "status": "delivered"}
    assert log[1]["request_id"] is None and log[1]["size"] > 300 > log[2]["size"]
    assert "payload" not in log[0]
    with store.snapshot_view() as view:
        sizes = [len(v) for _, vs in view.raw_chunks("topic_log") for v in vs]
    assert [r["size"] for r in log] == sizes
    assert _read(out, "topic_offsets") == [{"topic": "resp", "group": "g", "partition": 7, "offset": 0,
                                            "updated_ms": T0 + 4}]
    catalog = {r["name"]: r for r in _read(out, "topics")}
    assert catalog["receipts"]["retention_ms"] == RECEIPTS.retention_ms and catalog["receipts"]["created_ms"] is None
    assert catalog["resp"]["retention_ms"] == 60_000 and catalog["resp"]["created_ms"] == T0
