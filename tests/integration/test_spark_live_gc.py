"""GC through the live cluster: dispatchers export their shards, the plan runs on the session's Spark,
and the plan's WriteBatches go to each shard's primary (``Dispatcher.apply_batch``), exactly the path
``Controller.run_gc`` takes (``actors.controller.gc_target``). The Controller itself is not asked to
run the cycle here: it would start a second Spark JVM in its own process.
"""
from __future__ import annotations

import time

import ray

from fanout.records import join_vins
from storage import shard_of
from storage.jobs.cycle import run_gc_cycle

from .fanout_harness import Vehicle, fanout_config, publish_batch, running_cluster, wait_until

DAY = 86_400_000
YOUNG_VINS = [f"YNG{i}" for i in range(6)]
OLD_VINS = [f"OLD{i}" for i in range(6)]


def test_gc_through_the_live_cluster_keeps_young_pending_rows_and_removes_old_ones(ray_local, spark, tmp_path):
    from actors.controller import gc_target

    cfg = fanout_config(tmp_path)
    with running_cluster(cfg) as cluster:
        shards = cluster.info["shards"]
        dispatchers = ray.get(cluster.controller.handles.remote())["dispatchers"]
        publish_batch(cluster.port, YOUNG_VINS, "young-req", data_id="d-young", blob=b"YOUNG")  # now, over MQTT
        old_ts = int(time.time() * 1000) - 30 * DAY  # a request queued a month ago, before the retention
        for k, d in enumerate(dispatchers):
            mine = [v for v in OLD_VINS if shard_of(v, shards) == k]
            ray.get(d.put_blobs.remote([("d-old", b"OLD", old_ts)]))
            assert ray.get(d.ingest.remote([("old-req", "d-old", join_vins(mine), old_ts, 0)])) == [{"vins": len(mine)}]
        assert sum(cluster.inspect("vin", v)["pending_rows"] for v in YOUNG_VINS + OLD_VINS) == 12

        summary = run_gc_cycle(gc_target(dispatchers), config=cfg, spark=spark)

        assert summary.planned == {"delete_ids/expired": 6, "delete_reqs/expired": 6, "delete_blob/expired": shards}
        assert summary.deleted == 12 + shards and summary.skipped == 0 and not summary.refused
        assert sorted(summary.exported) == list(range(shards))
        assert [cluster.inspect("vin", v)["pending_rows"] for v in OLD_VINS] == [0] * 6
        assert [cluster.inspect("vin", v)["pending_rows"] for v in YOUNG_VINS] == [1] * 6
        assert cluster.inspect("request", "old-req")["rows"] == 0
        assert cluster.inspect("data", "d-old")["present_on_shards"] == 0
        assert cluster.inspect("data", "d-young")["present_on_shards"] == shards

        # the young deliveries still go out; the old ones are gone for good
        young, old = Vehicle(cluster.port, YOUNG_VINS[0]), Vehicle(cluster.port, OLD_VINS[0])
        try:
            young.heartbeat()
            old.heartbeat()
            msg = young.next_message(timeout=15)
            assert msg.topic == f"agent/{YOUNG_VINS[0]}/proxy/request/young-req" and msg.payload == b"YOUNG"
            old.no_message(within=1.0)
            wait_until(lambda: cluster.inspect("vin", YOUNG_VINS[0])["pending_rows"] == 0, 10, "the young row acked")
        finally:
            young.close()
            old.close()

        again = run_gc_cycle(gc_target(dispatchers), config=cfg, spark=spark)  # nothing left to collect
        assert again.planned == {} and again.deleted == 0
