"""Durable topics' retention in a whole GC cycle with real Spark (the session-scoped ``spark`` fixture): export,
plan (``storage.jobs.topic_plan``), guarded apply; the plan counts the unconsumed entries it drops."""
from __future__ import annotations

from fanout.config import load_config
from storage import ShardStore, WriteBatch
from storage.jobs import plan as P
from storage.jobs.cycle import run_gc_cycle
from storage.jobs.export import export_shard
from storage.topics import TopicSpec

DAY = 86_400_000
NOW = 300 * DAY
OLD = NOW - 2 * DAY  # past the 1-day retention of "resp"
YOUNG = NOW - 3_600_000
ANCIENT = NOW - 8 * DAY  # past the receipts' 7 days


def entries(n: int, size: int = 10, vin: str = "V1") -> list[tuple]:
    return [(f"ecp/{vin}/response", vin, 1, bytes(size), None) for _ in range(n)]


def build(root) -> dict[int, ShardStore]:
    """Shard 0: ``resp`` p0 has 5 old + 3 young entries, groups g (at 2) and h (at 6); ``big`` (no age limit,
    2,500 bytes) has 5 entries of ~1 KB; two receipts, one past the receipts' retention. Shard 1: ``resp`` p1,
    young only."""
    stores = {k: ShardStore(root / f"shard-{k}", k, sync=False) for k in (0, 1)}
    resp = TopicSpec.build("resp", "ecp/+/response", retention_ms=DAY)
    big = TopicSpec.build("big", "big/#", retention_bytes=2_500)
    for store in stores.values():
        store.apply(WriteBatch().create_topic(resp, OLD).create_topic(big, OLD))
    s0 = stores[0]
    s0.apply(WriteBatch().topic_append("resp", 0, OLD, entries(5)).topic_append("big", 0, OLD, entries(5, 1000)))
    s0.apply(WriteBatch().topic_append("resp", 0, YOUNG, entries(3)))
    s0.apply(WriteBatch().topic_commit("resp", "g", 0, 2, YOUNG).topic_commit("resp", "h", 0, 6, YOUNG))
    s0.apply(WriteBatch().put_blob("d", b"B", ANCIENT).enqueue_many(["V1", "V2"], ANCIENT, "r", "d"))
    s0.apply(WriteBatch().ack("V1", ANCIENT, "r", ANCIENT + 1))
    s0.apply(WriteBatch().ack("V2", ANCIENT, "r", YOUNG))
    stores[1].apply(WriteBatch().topic_append("resp", 1, YOUNG, entries(4)))
    return stores


def test_retention_prunes_by_age_and_bytes_and_reports_dropped_unconsumed(spark, tmp_path):
    stores = build(tmp_path / "data")
    for store in stores.values():
        export_shard(store, tmp_path / "export")
    info = P.compute_plan(spark, tmp_path / "export", tmp_path / "plan", now_ms=NOW, retention_ms=30 * DAY)
    # resp p0: offsets 0-4 past the day (3 and 4 were not acknowledged by g); big: 3 oldest over 2,500 bytes;
    # receipts: the ancient one
    assert info.topic_retention[0]["partitions"] == 3 and info.topic_retention[0]["entries"] == 5 + 3 + 1
    assert info.topic_retention[0]["dropped_unconsumed"] == 2
    assert info.topic_retention[1] == {"partitions": 0, "entries": 0, "bytes": 0, "dropped_unconsumed": 0}
    assert info.counts[0]["topic_prune_if/retention"] == 3 and "topic_prune_if/retention" not in info.counts[1]
    stores[0].apply(WriteBatch().topic_append("resp", 0, NOW, entries(1)))  # after the snapshot: stays
    cfg = load_config(None, env={}, overrides={"fanout": {"data_retention": "30d"}})
    summary = run_gc_cycle(stores, config=cfg, now_ms=NOW, spark=spark, work_dir=tmp_path / "cycle")
    assert summary.topic_retention == {"partitions": 3, "entries": 9, "bytes": summary.topic_retention["bytes"],
                                       "dropped_unconsumed": 2}
    assert summary.topic_retention["bytes"] > 3 * 1000 + 5 * 10
    s0, s1 = stores[0], stores[1]
    assert s0.topic_bounds("resp", 0) == (5, 9) and s0.topic_bounds("big", 0) == (3, 5)
    assert s0.topic_bounds("receipts", 0) == (1, 2) and s1.topic_bounds("resp", 1) == (0, 4)
    assert [e.offset for e in s0.topic_read("resp", 0, 0, 100)] == [5, 6, 7, 8]
    assert s0.topic_committed("resp", "g", 0) == 2  # a group's position is its own: retention does not move it
    assert s0.apply(WriteBatch().topic_append("resp", 0, NOW, entries(1))).topic_offsets == [("resp", 0, 9, 9)]
    again = run_gc_cycle(stores, config=cfg, now_ms=NOW, spark=spark, work_dir=tmp_path / "cycle")
    assert again.topic_retention["entries"] == 0 and s0.topic_bounds("resp", 0) == (5, 10)
    for store in stores.values():
        store.close()
