"""GC over exported snapshots with real Spark (the session-scoped ``spark`` fixture).

One known two-shard data set (``build``) covers every rule of ``storage.jobs.plan``; the plan is
computed once per module (dedup on) and once with dedup off, then applied to freshly rebuilt,
identical stores (same batches, same seqs), so each test starts from the exported state.
"""
from __future__ import annotations

import contextlib
import hashlib
import io
import json

import pyarrow.dataset as ds
import pytest

from fanout.config import load_config
from storage import ShardStore, WriteBatch
from storage.jobs import plan_apply as A
from storage.jobs import plan as P
from storage.jobs.cycle import run_gc_cycle
from storage.jobs.export import export_shard
from tests.unit.test_request_stats import counters, recount

DAY = 86_400_000
NOW = 400 * DAY
RETENTION = 7 * DAY
CUTOFF = NOW - RETENTION
OLD = CUTOFF - 1  # older than retention
EDGE = CUTOFF  # exactly the retention: kept
YOUNG = NOW - 3_600_000
SAME = hashlib.sha1(b"SAME").hexdigest()


def build(data_dir) -> dict[int, ShardStore]:
    """Two shards with every case: expired, edge, orphan, duplicate, content duplicate, protected blob."""
    s0 = ShardStore(data_dir / "shard-0", 0, sync=False)
    s1 = ShardStore(data_dir / "shard-1", 1, sync=False)
    # rows enqueued before their blob exists do not refresh its meta.ts: b-kept stays OLD
    s0.apply(WriteBatch().enqueue("V-KEEP", YOUNG, "r-keep", "b-kept"))
    s0.apply(WriteBatch().enqueue("V-DX", OLD, "r-dx", "b-young"))
    s0.apply(WriteBatch().enqueue("V-DX", OLD - 1, "r-dx", "b-kept"))  # request id re-used with another blob
    s0.apply(WriteBatch().put_blob("b-old", b"OLD", OLD).put_blob("b-young", b"SAME", YOUNG + 10)
             .put_blob("b-twin", b"SAME", YOUNG - 10).put_blob("b-kept", b"KEPT", OLD))
    s0.apply(WriteBatch().enqueue("V-EXP", OLD, "r-exp", "b-old").enqueue("V-ACK", OLD, "r-ack", "b-old"))
    s0.apply(WriteBatch().ack("V-ACK", OLD, "r-ack", OLD + 5))
    s0.apply(WriteBatch().enqueue("V-EDGE", EDGE, "r-edge", "b-young"))
    s0.apply(WriteBatch().enqueue("V-ORPH", YOUNG, "r-orph", "b-gone"))
    for ts, did in ((YOUNG - 300, "b-young"), (YOUNG - 200, "b-twin"), (YOUNG - 100, "b-young")):
        s0.apply(WriteBatch().enqueue("V-DUP", ts, "r-dup", did))  # request id re-used: 2 rows b-young
    s0.apply(WriteBatch().enqueue("V-DX", YOUNG, "r-dx", "b-young"))  # its only live row: no duplicate
    s0.apply(WriteBatch().enqueue("V-TWIN", YOUNG, "r-twin", "b-twin"))
    s1.apply(WriteBatch().put_blob("b-old", b"OLD", OLD).put_blob("b1", b"ONE", YOUNG))
    s1.apply(WriteBatch().enqueue_many(["U1"], OLD, "r1", "b1").enqueue_many(["U2"], YOUNG, "r1", "b1"))
    return {0: s0, 1: s1}


def pending_by_vin(store: ShardStore) -> dict[str, dict[str, int]]:
    """Per VIN: its pending reqs rows (each VIN of ``build`` has rows of one request at most queued)."""
    out: dict[str, dict[str, int]] = {}
    for c in store.request_counters_all():
        for row in store.request_rows(c["request_id"]):
            out.setdefault(row["vin"], {"pending": 0})["pending"] += row["status"] == "pending"
    return out


def _ids(reason, vin, ts, rid, did):
    return ("delete_ids", reason, vin, ts, rid, did, None, None)


EXPECTED: dict[int, set[tuple]] = {
    0: {
        _ids("duplicate", "V-DUP", YOUNG - 200, "r-dup", "b-twin"),  # same content as the t-300 row
        ("repoint_ids", "content_duplicate", "V-TWIN", YOUNG, "r-twin", "b-twin", "b-young", None),
        _ids("expired", "V-DX", OLD, "r-dx", "b-young"),
        _ids("expired", "V-DX", OLD - 1, "r-dx", "b-kept"),
        _ids("expired", "V-EXP", OLD, "r-exp", "b-old"),
        _ids("orphan", "V-ORPH", YOUNG, "r-orph", "b-gone"),
        _ids("duplicate", "V-DUP", YOUNG - 100, "r-dup", "b-young"),
        ("delete_reqs", "expired", "V-ACK", OLD, "r-ack", "b-old", None, "delivered"),
        ("delete_reqs", "expired", "V-EXP", OLD, "r-exp", "b-old", None, "pending"),
        ("delete_blob", "expired", None, OLD, None, "b-old", None, None),
        ("delete_blob", "content_duplicate", None, YOUNG, None, "b-twin", None, None),  # ts refreshed by V-TWIN
    },
    1: {
        _ids("expired", "U1", OLD, "r1", "b1"),
        ("delete_reqs", "expired", "U1", OLD, "r1", "b1", None, "pending"),
        ("delete_blob", "expired", None, OLD, None, "b-old", None, None),
    },
}
NO_DEDUP = {k: {a for a in v if a[1] != "content_duplicate" and a[5] != "b-twin"} for k, v in EXPECTED.items()}


def actions(plan_dir, shard) -> list[tuple]:
    files = A.plan_files(plan_dir, shard)
    rows = ds.dataset([str(f) for f in files], format="parquet").to_table().to_pylist() if files else []
    return [tuple(r[c] for c in ("op", "reason", "vin", "ts_ms", "request_id", "data_id", "new_data_id", "status"))
            for r in rows]


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    root = tmp_path_factory.mktemp("gc")
    stores = build(root / "data")
    infos = {k: export_shard(s, root / "export") for k, s in stores.items()}
    for s in stores.values():
        s.close()
    return root, infos


@pytest.fixture(scope="module")
def planned(spark, exported):
    root, _ = exported
    info = P.compute_plan(spark, root / "export", root / "plan", now_ms=NOW, retention_ms=RETENTION,
                          dedup_content=True)
    return root / "plan", info


@pytest.fixture
def fresh(tmp_path):
    stores = build(tmp_path / "data")
    yield stores
    for s in stores.values():
        s.close()


def test_known_snapshot_gives_the_exact_plan(planned, exported):
    plan_dir, info = planned
    _, infos = exported
    for shard in (0, 1):
        got = actions(plan_dir, shard)
        assert len(got) == len(set(got)) and set(got) == EXPECTED[shard], shard
        codes = [op[0] for batch in A.plan_batches(plan_dir, shard) for op in batch.ops[:-1]]
        phase = {14: 0, 6: 1, 19: 1, 8: 2, 10: 3}  # repoints, ids (settle_ids_if: expired, orphan), reqs, blobs
        assert codes == sorted(codes, key=phase.__getitem__) and 19 in codes
        assert info.watermarks[shard]["applied_seq"] == infos[shard].applied_seq
    assert info.counts[0] == {"repoint_ids/content_duplicate": 1, "delete_ids/expired": 3, "delete_ids/orphan": 1,
                              "delete_ids/duplicate": 2, "delete_reqs/expired": 2, "delete_blob/expired": 1,
                              "delete_blob/content_duplicate": 1}
    assert info.content_dup_groups == {0: 1, 1: 0} and info.cutoff_ms == CUTOFF
    dups = ds.dataset(str(plan_dir / P.CONTENT_DUPS), format="parquet", partitioning="hive").to_table().to_pylist()
    assert sorted((d["shard"], d["data_id"], d["canonical_data_id"], d["sha1"], d["members"]) for d in dups) == [
        (0, "b-twin", "b-young", SAME, 2), (0, "b-young", "b-young", SAME, 2)]
    assert P.read_plan(plan_dir) == info


def test_without_dedup_content_duplicates_are_only_reported(spark, exported, tmp_path):
    root, _ = exported
    info = P.compute_plan(spark, root / "export", tmp_path / "plan", now_ms=NOW, retention_ms=RETENTION)
    for shard in (0, 1):
        assert set(actions(tmp_path / "plan", shard)) == NO_DEDUP[shard]
    assert info.content_dup_groups == {0: 1, 1: 0} and not info.dedup_content


def test_apply_leaves_young_rows_and_removes_old(planned, fresh):
    plan_dir, _ = planned
    for store in fresh.values():
        A.apply_plan(store, plan_dir)
    s0, s1 = fresh[0], fresh[1]
    assert {r.vin: (r.ts_ms, r.data_id) for v in ("V-EDGE", "V-KEEP", "V-DX", "V-TWIN")
            for r in s0.next_rows(v)} == {"V-EDGE": (EDGE, "b-young"), "V-KEEP": (YOUNG, "b-kept"),
                                           "V-DX": (YOUNG, "b-young"), "V-TWIN": (YOUNG, "b-young")}
    assert [(r.ts_ms, r.data_id) for r in s0.next_rows("V-DUP", 5)] == [(YOUNG - 300, "b-young")]
    assert s0.next_rows("V-EXP") == s0.next_rows("V-ORPH") == []
    assert [s0.get_blob(d) for d in ("b-old", "b-twin", "b-young", "b-kept")] == [None, None, b"SAME", b"KEPT"]
    assert s0.get_req("r-exp", "V-EXP") is None and s0.get_req("r-ack", "V-ACK") is None
    assert s0.get_req("r-edge", "V-EDGE") is not None
    assert s1.next_rows("U1") == [] and s1.next_rows("U2")[0].data_id == "b1" and s1.get_blob("b-old") is None
    # the counters followed every delete: V-ORPH's row (blob gone) counts discarded, nothing counts pending
    # without a queued row, and each store's counters equal a recount of its reqs rows
    assert s0.get_req("r-orph", "V-ORPH")["status"] == "discarded"
    assert s0.request_counters("r-orph")["discarded"] == 1 and s0.request_counters("r-orph")["pending"] == 0
    assert s0.request_counters("r-exp") is None and s0.request_counters("r-dx")["pending"] == 1
    for store in (s0, s1):
        assert counters(store) == recount(store)
        assert all(s["pending"] == len(store.next_rows(v, 9)) for v, s in pending_by_vin(store).items())


def test_row_requeued_between_export_and_apply_survives_and_second_apply_deletes_nothing(planned, fresh):
    plan_dir, _ = planned
    s0 = fresh[0]
    # after the snapshot: V-EXP queued again (new request, the old blob), V-ORPH's row re-queued with
    # another blob under the same key, V-TWIN acked (its repoint must not re-create it)
    s0.apply(WriteBatch().enqueue("V-EXP", YOUNG + 1, "r-exp2", "b-old"))
    s0.apply(WriteBatch().enqueue("V-ORPH", YOUNG, "r-orph", "b-young"))
    s0.apply(WriteBatch().ack("V-TWIN", YOUNG, "r-twin", YOUNG + 2))
    first = A.apply_plan(s0, plan_dir)
    assert [(r.ts_ms, r.request_id, r.data_id) for r in s0.next_rows("V-EXP", 5)] == [(YOUNG + 1, "r-exp2", "b-old")]
    assert s0.get_blob("b-old") == b"OLD"  # named again: meta.ts moved, the planned delete is skipped
    assert [(r.ts_ms, r.data_id) for r in s0.next_rows("V-ORPH", 5)] == [(YOUNG, "b-young")]
    assert s0.get_req("r-exp", "V-EXP") is None and s0.get_req("r-exp2", "V-EXP")["status"] == "pending"
    assert s0.next_rows("V-TWIN") == []
    assert first.skipped == 3 and first.deleted + first.repointed == 11 - 3
    state = {v: s0.next_rows(v, 9) for v in ("V-EXP", "V-ORPH", "V-DUP", "V-DX", "V-EDGE", "V-KEEP")}
    second = A.apply_plan(s0, plan_dir, resume=False)
    assert second.deleted == second.repointed == 0 and second.skipped == 11
    assert {v: s0.next_rows(v, 9) for v in state} == state
    assert A.apply_plan(s0, plan_dir).batches == 0  # resume: the plan is already complete


def test_gc_cycle_offline_on_a_data_dir(spark, tmp_path):
    stores = build(tmp_path / "data")
    for s in stores.values():
        s.close()
    cfg = load_config(None, env={}, overrides={"gc": {"dedup_content": True}, "fanout": {"data_retention": "7d"}})
    seen: list[tuple[str, int, int]] = []
    summary = run_gc_cycle(tmp_path / "data", config=cfg, now_ms=NOW, spark=spark,
                           progress=lambda *a: seen.append(a))
    assert summary.work_dir == str(tmp_path / "data" / "export")
    assert summary.deleted == 13 and summary.repointed == 1 and summary.skipped == 0 and not summary.refused
    assert summary.planned["delete_ids/expired"] == 4 and summary.content_dup_groups == 1
    assert summary.exported_rows == sum(sum(e["rows"].values()) for e in summary.exported.values())
    assert {"export", "spark", "plan", "apply", "total"} <= set(summary.stage_s)
    assert ("export", 2, 2) in seen and ("apply", 14, 14) in seen and ("plan", 2, 2) in seen
    saved = json.loads((tmp_path / "data" / "export" / "last_gc.json").read_text())
    assert saved["deleted"] == 13 and saved["plan_id"] == summary.plan_id

    from cluster.cli import main  # a second cycle (dry run, through the CLI) finds nothing left to collect

    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        assert main(["gc", "--data-dir", str(tmp_path / "data"), "--now-ms", str(NOW), "--dry-run", "--json"]) == 0
    again = json.loads(buf.getvalue())
    assert again["planned"] == {} and again["deleted"] == 0 and again["exported_rows"] > 0
    assert again["dry_run"] and "apply" not in again["stage_s"] and again["applied"] == {}
