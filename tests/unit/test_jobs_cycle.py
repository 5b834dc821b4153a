"""GC cycle orchestration (``storage.jobs.cycle``) with real LMDB and a stand-in for the Spark plan.

The stand-in plans "delete every ids row older than the cutoff" from the export with pyarrow and
writes it exactly as ``compute_plan`` does (per shard, accumulating ``_plan.json``), so these tests
cover export, pipelining, watermark refusal, dry runs and the summary without a JVM.
"""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from fanout.config import load_config
from storage import ShardStore, WriteBatch
from storage.jobs import cycle as C
from storage.jobs import plan as P
from storage.jobs.export import read_watermarks, table_dir

DAY = 86_400_000
NOW = 100 * DAY
OLD, YOUNG = NOW - 8 * DAY, NOW - DAY


def fake_compute_plan(spark, export_dir, plan_dir, *, now_ms, retention_ms, dedup_content=False, shards=None,
                      plan_id=None):
    """Plan "delete the ids rows older than the cutoff" shard by shard, written like ``compute_plan``."""
    assert spark == "SPARK"
    marks = read_watermarks(export_dir)
    if plan_id is None:
        shutil.rmtree(plan_dir, ignore_errors=True)
        info = P.PlanInfo(plan_id="plan-1", plan_dir=str(plan_dir), export_dir=str(export_dir), now_ms=now_ms,
                          cutoff_ms=now_ms - retention_ms, retention_ms=retention_ms, dedup_content=dedup_content)
    else:
        info = P.read_plan(plan_dir)
    for k in shards:
        rows = [r for r in pq.read_table(table_dir(export_dir, "ids", k)).to_pylist()
                if r["ts_ms"] < now_ms - retention_ms]
        actions = [{"phase": 1, "op": P.OP_DELETE_IDS, "reason": "expired", "vin": r["vin"], "ts_ms": r["ts_ms"],
                    "request_id": r["request_id"], "data_id": r["data_id"], "new_data_id": None, "status": None}
                   for r in rows]
        dest = Path(plan_dir) / P.ACTIONS / f"shard={k}"
        dest.mkdir(parents=True)
        pq.write_table(pa.Table.from_pylist(actions, schema=ACTION_SCHEMA), dest / "part-00000.parquet")
        info.watermarks[k] = marks[k]
        info.counts[k] = {"delete_ids/expired": len(actions)} if actions else {}
        info.content_dup_groups[k] = 0
    (Path(plan_dir) / P.PLAN_FILE).write_text(json.dumps(info.as_dict()))
    return info


ACTION_SCHEMA = pa.schema([("phase", pa.int32()), ("op", pa.string()), ("reason", pa.string()), ("vin", pa.string()),
                           ("ts_ms", pa.int64()), ("request_id", pa.string()), ("data_id", pa.string()),
                           ("new_data_id", pa.string()), ("status", pa.string())])


@pytest.fixture
def data_dir(tmp_path, monkeypatch):
    monkeypatch.setattr(C, "compute_plan", fake_compute_plan)
    for k in (0, 1):
        with ShardStore(tmp_path / "data" / f"shard-{k}", k, sync=False) as s:
            s.apply(WriteBatch().put_blob("d", b"x", YOUNG))
            s.apply(WriteBatch().enqueue_many([f"O{k}{i}" for i in range(3)], OLD, "old", "d"))
            s.apply(WriteBatch().enqueue_many([f"Y{k}{i}" for i in range(2)], YOUNG, "young", "d"))
    return tmp_path / "data"


CFG = load_config(None, env={}, overrides={"fanout": {"data_retention": "7d"}})


def pending(data_dir) -> dict[int, int]:
    out = {}
    for k in (0, 1):
        with ShardStore(data_dir / f"shard-{k}", k, sync=False) as s:
            out[k] = s.pending_count()
    return out


@pytest.mark.parametrize("pipeline", [True, False])
def test_cycle_on_a_data_dir_exports_plans_and_applies_every_shard(data_dir, pipeline):
    seen = []
    summary = C.run_gc_cycle(data_dir, config=CFG, now_ms=NOW, spark="SPARK", pipeline=pipeline,
                             progress=lambda *a: seen.append(a))
    assert pending(data_dir) == {0: 2, 1: 2}
    assert summary.planned == {"delete_ids/expired": 6} and summary.deleted == 6 and not summary.refused
    assert summary.shards == [0, 1] and summary.plan_id == "plan-1" and summary.cutoff_ms == NOW - 7 * DAY
    assert {k: e["applied_seq"] for k, e in summary.exported.items()} == {0: 3, 1: 3}
    assert summary.exported_rows == 2 * (5 + 5 + 1 + 1)  # ids, reqs, meta, the receipts catalog row
    assert ("export", 2, 2) in seen and ("plan", 2, 2) in seen and seen[-1][0] == "apply"
    assert seen[-1][1] == 6 and set(summary.stage_s) == {"export", "spark", "plan", "apply", "total"}
    assert json.loads((data_dir / "export" / C.SUMMARY_FILE).read_text())["deleted"] == 6


def test_dry_run_deletes_nothing(data_dir):
    summary = C.run_gc_cycle(data_dir, config=CFG, now_ms=NOW, spark="SPARK", dry_run=True)
    assert summary.planned == {"delete_ids/expired": 6} and summary.applied == {} and summary.deleted == 0
    assert pending(data_dir) == {0: 5, 1: 5} and "apply" not in summary.stage_s


def test_shard_behind_its_watermark_is_refused(data_dir):
    stores = C.open_shards(data_dir, sync=False)
    try:
        local = C.LocalShards(stores)
        target = C.FunctionTarget([0, 1], export=local.export, apply=local.apply,
                                  applied_seq=lambda k: 0 if k == 1 else local.applied_seq(k))  # shard 1 restored?
        summary = C.run_gc_cycle(target, config=CFG, now_ms=NOW, spark="SPARK", work_dir=data_dir / "w")
        assert stores[0].pending_count() == 2 and stores[1].pending_count() == 5
        assert list(summary.refused) == [1] and "below the plan's watermark 3" in summary.refused[1]
        assert summary.deleted == 3
    finally:
        for s in stores.values():
            s.close()


def test_spark_start_failure_is_raised(data_dir, monkeypatch):
    import storage.jobs.spark as S

    def no_java(config):
        raise RuntimeError("Java gateway process exited")

    monkeypatch.setattr(S, "get_spark", no_java)
    with pytest.raises(RuntimeError, match="Java gateway"):
        C.run_gc_cycle(data_dir, config=CFG, now_ms=NOW)
    assert pending(data_dir) == {0: 5, 1: 5}
    with pytest.raises(FileNotFoundError):
        C.run_gc_cycle(data_dir / "nope", config=CFG, now_ms=NOW, spark="SPARK")
