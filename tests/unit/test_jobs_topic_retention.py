"""Durable topics' retention in the GC plan, applied to real LMDB stores (``storage.jobs.plan_apply`` reading the
``topic_prunes`` a plan holds; the plans are written by hand as ``storage.jobs.topic_plan`` writes them, no Spark)."""
from __future__ import annotations

import json

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from storage import WriteBatch, tables
from storage.jobs import plan as P
from storage.jobs import plan_apply as A
from storage.jobs import topic_plan as TP

from .test_jobs_plan_apply import ids, write_plan

T0 = 1_700_000_000_000
PRUNE_SCHEMA = pa.schema([("topic", pa.string()), ("partition", pa.int64()), ("below_offset", pa.int64()),
                          ("entries", pa.int64()), ("bytes", pa.int64()), ("dropped_unconsumed", pa.int64())])


def append(store, n, topic="resp", partition=0):
    entries = [(f"ecp/V{i}/response", f"V{i}", 1, b"p%d" % i, None) for i in range(n)]
    return store.apply(WriteBatch().topic_append(topic, partition, T0, entries))


def write_prunes(plan_dir, prunes: dict[int, list[tuple]], watermarks: dict[int, int], actions=None):
    """A plan with ``topic_prunes`` (and optional ``actions``): rows ``(topic, partition, below, entries, bytes,
    dropped)``, counted in ``counts`` and ``topic_retention`` as ``compute_plan`` does."""
    info = write_plan(plan_dir, actions or {k: [] for k in watermarks}, watermarks)
    raw = json.loads((plan_dir / P.PLAN_FILE).read_text())
    for shard, rows in prunes.items():
        dest = plan_dir / TP.TOPIC_PRUNES / f"shard={shard}"
        dest.mkdir(parents=True)
        pq.write_table(pa.Table.from_pylist([dict(zip(TP.PRUNE_COLUMNS, r)) for r in rows], schema=PRUNE_SCHEMA),
                       dest / "part-00000.parquet")
        raw["counts"].setdefault(str(shard), {})[TP.PRUNE_COUNT_KEY] = len(rows)
        raw.setdefault("topic_retention", {})[str(shard)] = TP.prune_stats(plan_dir, shard)
    (plan_dir / P.PLAN_FILE).write_text(json.dumps(raw))
    return info


def test_prunes_apply_below_the_bound_and_keep_what_came_after_the_snapshot(store, tmp_path):
    append(store, 10)
    append(store, 4, partition=1)
    seq = store.applied_seq
    append(store, 2)  # after the snapshot: offsets 10, 11
    write_prunes(tmp_path / "plan", {0: [("resp", 0, 10, 10, 300, 3), ("resp", 1, 2, 2, 60, 0)]}, {0: seq})
    info = A.apply_plan(store, tmp_path / "plan")
    assert info.counts["topic_pruned"] == 12 and info.ops == 2
    assert store.topic_bounds("resp", 0) == (10, 12) and store.topic_bounds("resp", 1) == (2, 4)
    assert [e.offset for e in store.topic_read("resp", 0, 0, 10)] == [10, 11]
    again = A.apply_plan(store, tmp_path / "plan", resume=False)  # a second apply finds nothing
    assert again.counts["topic_pruned"] == 0
    assert append(store, 1).topic_offsets == [("resp", 0, 12, 12)]  # the counter never went back


def test_prunes_come_after_every_action_phase_and_chunk_with_them(store, tmp_path):
    store.apply(WriteBatch().put_blob("d", b"B", T0).enqueue_many(["V1", "V2"], T0 - 10_000, "r", "d"))
    append(store, 5)
    plan = tmp_path / "plan"
    write_prunes(plan, {0: [("resp", 0, 3, 3, 90, 0), ("receipts", 0, 1, 1, 100, 1)]}, {0: store.applied_seq},
                 actions={0: [ids("V1", T0 - 10_000, "r", "d"), ids("V2", T0 - 10_000, "r", "d")]})
    batches = list(A.plan_batches(plan, 0, chunk_ops=3))
    codes = [[op[0] for op in b.ops[:-1]] for b in batches]  # the last op of a batch is the progress marker
    assert codes == [[19, 19, 26], [26]]  # settle_ids_if (the ids deletes), then topic_prune_if
    assert batches[1].ops[0][1:] == ("receipts", 0, 1)
    info = A.apply_plan(store, plan, chunk_ops=3)
    assert info.counts["topic_pruned"] == 3 + 1  # the two settles wrote receipts 0 and 1; offset 0 is pruned
    assert store.topic_bounds("resp", 0) == (3, 5) and store.topic_bounds("receipts", 0) == (1, 2)


def test_a_plan_of_a_shard_behind_the_watermark_is_refused(store, tmp_path):
    append(store, 3)
    write_prunes(tmp_path / "plan", {0: [("resp", 0, 3, 3, 90, 0)]}, {0: store.applied_seq + 1})
    with pytest.raises(A.PlanRefusedError):
        A.apply_plan(store, tmp_path / "plan")
    assert store.topic_bounds("resp", 0) == (0, 3)


def test_plan_info_carries_the_topic_totals(tmp_path):
    plan = tmp_path / "plan"
    write_prunes(plan, {0: [("resp", 0, 10, 10, 300, 3), ("resp", 1, 2, 2, 60, 0)], 1: []}, {0: 1, 1: 1})
    info = P.read_plan(plan)
    assert info.topic_retention[0] == {"partitions": 2, "entries": 12, "bytes": 360, "dropped_unconsumed": 3}
    assert info.topic_retention[1] == dict.fromkeys(TP.STATS, 0) and info.counts[0][TP.PRUNE_COUNT_KEY] == 2
    raw = json.loads((plan / P.PLAN_FILE).read_text())
    del raw["topic_retention"]  # a plan written before topics existed still reads
    (plan / P.PLAN_FILE).write_text(json.dumps(raw))
    assert P.read_plan(plan).topic_retention == {}


def test_the_export_of_a_store_with_topics_lists_their_tables(store, tmp_path):
    from storage.jobs.export import EXPORT_TABLES

    assert {tables.TOPICS, tables.TOPIC_LOG, tables.TOPIC_OFFSETS} <= set(EXPORT_TABLES)
    assert tables.TOPIC_COUNTERS not in EXPORT_TABLES  # the plan never needs them: bounds come from the log
