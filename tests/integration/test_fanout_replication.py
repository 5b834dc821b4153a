"""Replication on one machine (the session's local Ray): the replica follows every acknowledged write, status
shows it, the replica's tables equal the primary's, and a requested failover keeps every row deliverable."""
from __future__ import annotations

import pytest
import ray

from cluster.cli.status import replication_table
from storage.replication_protocol import table_digests

from .fanout_harness import Vehicle, fanout_config, publish_batch, running_cluster, wait_until


@pytest.fixture(scope="module")
def fanout(ray_local, tmp_path_factory):
    cfg = fanout_config(tmp_path_factory.mktemp("replication"), replicas=1)
    with running_cluster(cfg.replace("mqtt", sys_interval="0s")) as cluster:
        yield cluster


def _rows(fanout) -> list[dict]:
    return ray.get(fanout.controller.replication.remote(), timeout=30)


def test_acknowledged_batches_are_on_the_replica_and_status_shows_it(fanout):
    publish_batch(fanout.port, [f"REP{i}" for i in range(50)], "rep-1")
    rows = wait_until(lambda: (r := _rows(fanout)) and all(x["replicas"][0]["lag"] == 0 for x in r) and r, 20,
                      "replicas caught up")
    for r in rows:
        assert r["epoch"] == 1 and r["min_acks"] == 0  # one machine: writes do not wait for a replica
        assert r["replicas"][0]["acked_seq"] == r["applied_seq"] > 0 and r["replicas"][0]["in_sync"]
        assert r["primary"]["node"] == "n0" and r["primary"]["alive"]
    status = fanout.status()
    assert [r["shard"] for r in status["replication"]] == [0, 1]
    table = replication_table(rows)
    assert table.splitlines()[1].split()[:2] == ["0", "1"] and "lag=0*" in table
    h = ray.get(fanout.controller.handles.remote(), timeout=30)
    for k, d in enumerate(h["dispatchers"]):
        primary = ray.get(d.__ray_call__.remote(lambda self: table_digests(self.store)), timeout=30)
        replica = ray.get(next(iter(h["replicas"][k].values())).digests.remote(), timeout=30)
        assert primary == replica, f"shard {k}: replica tables differ from the primary's"
        # the batches came over the replica's direct channel (cluster.direct_channels), not Ray calls
        channel = ray.get(next(iter(h["replicas"][k].values())).status.remote(), timeout=30)["channel"]
        assert channel["requests"] > 0 and channel["refused"] == 0


def test_requested_failover_promotes_the_replica_and_rows_stay_deliverable(fanout):
    vins = [f"RFO{i}" for i in range(6)]
    publish_batch(fanout.port, vins, "rfo-1")
    result = ray.get(fanout.controller.failover.remote(0), timeout=60)
    assert result["epoch"] == 2 and result["seconds"] < 30
    rows = _rows(fanout)
    assert rows[0]["epoch"] == 2 and "replica-0-" in rows[0]["primary"]["path"]
    publish_batch(fanout.port, vins, "rfo-2")  # a write on the new primary
    cars = [Vehicle(fanout.port, v) for v in vins]
    try:
        for car in cars:
            car.heartbeat("online")
        for car in cars:
            got = set()
            while got != {"rfo-1", "rfo-2"}:
                got.add(car.next_message(20).topic.rsplit("/", 1)[-1])
        wait_until(lambda: len(_rows(fanout)[0]["replicas"]) == 1 and _rows(fanout)[0]["replicas"][0]["in_sync"], 30,
                   "a new replica for shard 0, caught up by snapshot")
    finally:
        for car in cars:
            car.close()
