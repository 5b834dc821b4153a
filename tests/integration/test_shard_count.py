"""The shard count a cluster starts with: ``fanout.dispatchers = 0`` takes the data directory's, else sizes by the CPUs.

Why: a VIN's shard is ``shard_of(VIN, shards)``, so an existing store must start again with its own count whatever
the cluster's CPUs say now; before, a store created with another count than the CPUs' refused to start until
``fanout.dispatchers`` was set by hand. Own clusters (each test starts and stops its own on one data directory).
"""
from __future__ import annotations

import pytest

from storage.keys import shard_of

from .fanout_harness import Vehicle, fanout_config, publish_batch, running_cluster

pytestmark = pytest.mark.timeout(240)

VINS = [f"SHC{i:03d}" for i in range(9)]


def test_auto_count_restarts_a_store_with_its_own_shards_and_loses_no_row(ray_local, tmp_path):
    """Three shards made by hand; a start asking for 2 is refused; the next start with ``dispatchers = 0`` (the
    session's Ray has 2 CPUs, which alone would give 1 shard, and gave 2 by the old rule) opens those three, and
    the rows queued in each reach their vehicles."""
    assert len({shard_of(v, 3) for v in VINS}) == 3  # every shard holds rows
    with running_cluster(fanout_config(tmp_path, dispatchers=3)) as cluster:
        publish_batch(cluster.port, VINS, "shc-1")  # no vehicle connected: the rows wait in the store
        assert cluster.status()["shard_count"] == {"shards": 3, "source": "fanout.dispatchers"}
    # another count by hand is refused before anything is placed, naming both and the way out
    with pytest.raises(RuntimeError, match=r"layout\.json describes 3 shards, fanout\.dispatchers asks for 2 \(set "
                                           r"it to 0 to take the stored count"):
        with running_cluster(fanout_config(tmp_path, dispatchers=2)):
            pass
    with running_cluster(fanout_config(tmp_path, dispatchers=0)) as cluster:
        assert cluster.status()["shard_count"] == {"shards": 3, "source": "layout.json"}
        cars = [Vehicle(cluster.port, vin) for vin in VINS]
        try:
            for car in cars:
                car.heartbeat("online")  # what asks for rows queued before the vehicle came (the contract)
            for car in cars:
                assert car.next_message(30).topic == f"agent/{car.client_id}/proxy/request/shc-1"
        finally:
            for car in cars:
                car.close()


def test_a_new_store_gets_one_shard_per_one_plus_replicas_cpus_left_by_the_listener(ray_local, tmp_path):
    with running_cluster(fanout_config(tmp_path, dispatchers=0, replicas=1)) as cluster:
        status = cluster.status()
        assert status["shard_count"] == {"shards": 1, "source": "cpus", "cpus": 2, "listener_processes": 1,
                                         "replicas": 1}
        assert len(status["shards"]) == 1
