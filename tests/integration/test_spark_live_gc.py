"""GC through the live cluster: dispatchers export their shards, the plan runs on the session's Spark,
and the plan's WriteBatches go to each shard's primary (``Dispatcher.apply_batch``), exactly the path
``Controller.run_gc`` takes (``actors.controller.gc_target``). The Controller itself is not asked to
run the cycle here: it would start a second Spark JVM in its own process.
"""
from __future__ import annotations

import time

import ray

from fanout.records import BlobItem, IngestItem, join_vins
from storage import WriteBatch, shard_of
from storage.jobs.cycle import run_gc_cycle

from .fanout_harness import Vehicle, fanout_config, publish_batch, running_cluster, wait_until

DAY = 86_400_000
YOUNG_VINS = [f"YNG{i}" for i in range(6)]
OLD_VINS = [f"OLD{i}" for i in range(6)]
GONE_VINS = [f"GON{i}" for i in range(4)]  # young rows whose blob is gone: GC counts them discarded


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
            ray.get(d.put_blobs.remote([BlobItem.build("d-old", b"OLD", old_ts)]))
            assert ray.get(d.ingest.remote([IngestItem.build("old-req", "d-old", join_vins(mine), old_ts)])) == [{"vins": len(mine)}]
            gone = [v for v in GONE_VINS if shard_of(v, shards) == k]
            ray.get(d.put_blobs.remote([BlobItem.build("d-gone", b"GONE", old_ts + 29 * DAY)]))
            assert ray.get(d.ingest.remote([IngestItem.build("gone-req", "d-gone", join_vins(gone), old_ts + 29 * DAY)])) == [
                {"vins": len(gone)}]
            ray.get(d.apply_batch.remote(WriteBatch().delete_blob("d-gone").to_bytes()))
        assert sum(cluster.inspect("vin", v)["pending_rows"] for v in YOUNG_VINS + OLD_VINS + GONE_VINS) == 16
        assert ray.get(cluster.controller.request_status.remote("gone-req"))["pending"] == 4

        summary = run_gc_cycle(gc_target(dispatchers), config=cfg, spark=spark)

        assert summary.planned == {"delete_ids/expired": 6, "delete_ids/orphan": 4, "delete_reqs/expired": 6,
                                   "delete_blob/expired": shards}
        assert summary.deleted == 16 + shards and summary.skipped == 0 and not summary.refused
        # the counters moved with the rows, on the primaries: the orphans count discarded, the old request
        # left with its rows (retention), nothing counts pending without a queued row
        gone_status = ray.get(cluster.controller.request_status.remote("gone-req"))
        assert (gone_status["vins"], gone_status["pending"], gone_status["discarded"]) == (4, 0, 4)
        assert ray.get(cluster.controller.request_status.remote("old-req")) is None
        assert ray.get(cluster.controller.request_status.remote("young-req"))["pending"] == 6
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
