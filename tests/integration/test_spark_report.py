"""Delivery report with real Spark (the session-scoped ``spark`` fixture) over a known set of deliveries."""
from __future__ import annotations

import contextlib
import io
import json

import pyarrow.parquet as pq
import pytest

from storage import ShardStore, WriteBatch, shard_of
from storage.keys import ids_key
from storage.jobs.export import export_shard
from storage.jobs.report import REPORT_COLUMNS, compute_report

DAY = 86_400_000
NOW = 500 * DAY
RETENTION = 7 * DAY
T = NOW - DAY  # request A queued a day ago
OLD = NOW - RETENTION - 1


@pytest.fixture(scope="module")
def export_dir(tmp_path_factory):
    """Request A: 12 VINs on two shards, 10 delivered after 100, 200, ... 1000 ms, 2 pending.
    Request B: 3 pending young, 2 pending older than retention, 1 delivered long ago (5 s).
    Request C: 2 VINs on shard 0, one expired by its ttl, one cancelled.
    Request D: 3 VINs on shard 1, one discarded by its dispatcher (blob gone when due), one by GC (an orphan
    row: ``settle_ids_if``), one pending."""
    root = tmp_path_factory.mktemp("report")
    stores = {k: ShardStore(root / "data" / f"shard-{k}", k, sync=False) for k in (0, 1)}
    a_vins = [f"A{i:02d}" for i in range(12)]
    b_young, b_old = ["B0", "B1", "B2"], ["B3", "B4"]
    for k, store in stores.items():
        mine = [v for v in a_vins if shard_of(v, 2) == k]
        store.apply(WriteBatch().put_blob("d", b"x", T).enqueue_many(mine, T, "req-A", "d")
                    .enqueue_many([v for v in b_young if shard_of(v, 2) == k], T, "req-B", "d")
                    .enqueue_many([v for v in b_old + ["B5"] if shard_of(v, 2) == k], OLD, "req-B", "d"))
        acks = WriteBatch()
        for i, vin in enumerate(a_vins[:10]):
            if shard_of(vin, 2) == k:
                acks.ack(vin, T, "req-A", T + 100 * (i + 1))
        if shard_of("B5", 2) == k:
            acks.ack("B5", OLD, "req-B", OLD + 5_000)
        store.apply(acks)
    c_vins = [v for v in ("C0", "C1", "C2", "C3", "C4", "C5") if shard_of(v, 2) == 0][:2]
    stores[0].apply(WriteBatch().set_expiry("req-C", T + 10).enqueue_many(c_vins, T, "req-C", "d"))
    stores[0].apply(WriteBatch().expire_rows([ids_key(c_vins[0], T, "req-C")], T + 20)
                    .settle_pending("req-C", "cancelled", T + 30))
    d_vins = [v for v in ("D0", "D1", "D2", "D3", "D4", "D5", "D6") if shard_of(v, 2) == 1][:3]
    stores[1].apply(WriteBatch().enqueue_many(d_vins, T, "req-D", "d"))
    stores[1].apply(WriteBatch().discard_rows([ids_key(d_vins[0], T, "req-D")], T + 40)
                    .settle_ids_if(d_vins[1], T, "req-D", "d", "discarded", T + 50))
    for store in stores.values():
        export_shard(store, root / "export")
        store.close()
    return root / "export"


EXPECTED = {
    "req-A": {"request_id": "req-A", "queued": 12, "delivered": 10, "pending": 2, "expired": 0,
              "discarded": 0, "cancelled": 0, "p50_ms": 550.0, "p95_ms": 955.0, "p99_ms": 991.0, "first_ts_ms": T, "last_delivered_ts_ms": T + 1000,
              "receipts_delivered": 10, "receipts_expired": 0, "receipts_discarded": 0, "receipts_cancelled": 0},
    "req-B": {"request_id": "req-B", "queued": 6, "delivered": 1, "pending": 3, "expired": 2,
              "discarded": 0, "cancelled": 0, "p50_ms": 5000.0, "p95_ms": 5000.0, "p99_ms": 5000.0, "first_ts_ms": OLD,
              "last_delivered_ts_ms": OLD + 5000,
              "receipts_delivered": 1, "receipts_expired": 0, "receipts_discarded": 0, "receipts_cancelled": 0},
    "req-C": {"request_id": "req-C", "queued": 2, "delivered": 0, "pending": 0, "expired": 1,
              "discarded": 0, "cancelled": 1,
              "p50_ms": None, "p95_ms": None, "p99_ms": None, "first_ts_ms": T, "last_delivered_ts_ms": None,
              "receipts_delivered": 0, "receipts_expired": 1, "receipts_discarded": 0, "receipts_cancelled": 1},
    "req-D": {"request_id": "req-D", "queued": 3, "delivered": 0, "pending": 1, "expired": 0,
              "discarded": 2, "cancelled": 0,
              "p50_ms": None, "p95_ms": None, "p99_ms": None, "first_ts_ms": T, "last_delivered_ts_ms": None,
              "receipts_delivered": 0, "receipts_expired": 0, "receipts_discarded": 2, "receipts_cancelled": 0},
}


def test_report_numbers_for_known_deliveries(spark, export_dir, tmp_path):
    rows = compute_report(spark, export_dir, now_ms=NOW, retention_ms=RETENTION, out_dir=tmp_path)
    assert rows == [EXPECTED["req-A"], EXPECTED["req-B"], EXPECTED["req-C"], EXPECTED["req-D"]]
    written = pq.read_table(tmp_path / "report").to_pylist()
    assert sorted(written, key=lambda r: r["request_id"]) == rows and set(written[0]) == set(REPORT_COLUMNS)


def test_report_of_one_request_through_the_cli(spark, export_dir):
    from cluster.cli import main

    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        code = main(["report", "--export", str(export_dir), "--request", "req-B", "--now-ms", str(NOW), "--json"])
    assert code == 0
    assert [json.loads(line) for line in buf.getvalue().splitlines()] == [EXPECTED["req-B"]]
    with contextlib.redirect_stdout(io.StringIO()):
        assert main(["report", "--export", str(export_dir), "--request", "nope", "--now-ms", str(NOW)]) == 1
