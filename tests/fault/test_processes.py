"""Kill -9 of single processes on a 3-node cluster (one Ray cluster for the module), and a whole-cluster restart.

- A replica killed mid-ingest is restarted by Ray and caught up by its primary: its tables equal the
  primary's, table by table.
- A connection node killed with vehicles on it: they reconnect to another node and receive everything pending.
- The whole fanout cluster stopped and started again from its data directories (after a failover, so the
  layout file has to bring the promoted directory back as the primary): pending rows and the unacknowledged
  in-flight message survive and are delivered.
"""
from __future__ import annotations

import threading

import pytest
import ray

from tests.integration.fanout_harness import Vehicle, running_cluster

from .harness import (
    Fleet, Publisher, actor_pid, fault_config, handles, kill9, port_of, replication, request_rows,
    three_node_ray, wait_until,
)


@pytest.fixture(scope="module")
def ray3():
    with three_node_ray() as cluster:
        yield cluster


def _digests_equal(fanout, shard: int) -> tuple[dict, dict] | None:
    """(primary, replica) table digests of ``shard`` once they are equal, else None."""
    from storage.replication_protocol import table_digests

    h = handles(fanout)
    primary = ray.get(h["dispatchers"][shard].__ray_call__.remote(lambda self: table_digests(self.store)), timeout=60)
    reps = list(h["replicas"][shard].values())
    replica = ray.get(reps[0].digests.remote(), timeout=60)
    return (primary, replica) if primary == replica else None


def test_replica_killed_mid_ingest_catches_up_to_identical_tables(ray3, tmp_path):
    """Invariant: after a kill -9 and Ray's restart, the replica catches up and every replicated table is
    byte-identical to the primary's (and the same applied seq); no acknowledged trigger is missing."""
    with running_cluster(fault_config(tmp_path)) as fanout:
        shard = 0
        rep_handle = next(iter(handles(fanout)["replicas"][shard].values()))
        pub = Publisher(port_of(fanout))
        done = threading.Event()

        def ingest() -> None:
            try:
                for t in range(40):
                    pub.trigger(f"rk-{t:03d}", [f"RK{t:03d}{j:04d}" for j in range(500)])
            finally:
                done.set()

        worker = threading.Thread(target=ingest, daemon=True)
        try:
            worker.start()
            wait_until(lambda: len(pub.acked) >= 10 or done.is_set(), 120, "a quarter of the ingest")
            old_pid = ray.get(rep_handle.ready.remote(), timeout=30)["pid"]
            kill9(old_pid)
            assert done.wait(180), "ingest stalled after the replica kill"
            assert len(pub.acked) == 40
            new_pid = wait_until(lambda: _pid_if_back(rep_handle, old_pid), 60, "the replica restarted by Ray")
            assert new_pid != old_pid
            wait_until(lambda: all(r["in_sync"] and r["lag"] == 0 for r in replication(fanout)[shard]["replicas"]),
                       60, "the replica back in sync")
            primary, replica = wait_until(lambda: _digests_equal(fanout, shard), 30, "identical tables")
            assert primary["ids"].split(":")[0] != "0", "the shard holds rows"
            for rid in pub.acked:
                assert request_rows(fanout, rid) == 500, rid
        finally:
            pub.close()
            worker.join(10)


def _pid_if_back(handle, old_pid: int) -> int | None:
    try:
        pid = ray.get(handle.ready.remote(), timeout=5)["pid"]
    except Exception:
        return None
    return pid if pid != old_pid else None


def test_connection_node_killed_vehicles_reconnect_elsewhere_and_get_everything_pending(ray3, tmp_path):
    """Invariant: rows pending for vehicles whose node died are all delivered after they reconnect to another
    node (the one that was in flight again); nothing pending is lost with the node's in-memory state."""
    with running_cluster(fault_config(tmp_path)) as fanout:
        h = handles(fanout)
        head = ray3.head_node.node_id
        victim = next(n for n in fanout.nodes if n["ray_node_id"] != head)
        vins = [f"CNK{i:03d}" for i in range(6)]
        held = [Vehicle(int(victim["port"]), v, manual_ack=True) for v in vins]  # hold the first message unacked
        pub = Publisher(port_of(fanout, head))
        fleet = None
        try:
            for t in range(3):
                pub.trigger(f"cn-{t}", vins)
            for car in held:
                car.next_message(30)  # one in flight each, never acked
            kill9(actor_pid(h["nodes"][victim["node_id"]]))
            for car in held:
                car.client.loop_stop()
            fleet = Fleet(port_of(fanout, head), vins)
            try:
                wait_until(lambda: fleet.has_all(pub.acked), 60, "everything pending delivered on the other node")
            except AssertionError as exc:
                raise AssertionError(f"{exc}; got {fleet.got}; {fanout.inspect('vin', vins[0])}") from None
        finally:
            pub.close()
            if fleet is not None:
                fleet.close()
            for car in held:
                car.close()


def test_whole_cluster_restarts_from_its_data_directories(ray3, tmp_path):
    """Invariant: after a failover and a full stop/start over the same data directories, every pending row
    (and the message that was in flight, unacknowledged) is delivered; the promoted replica's directory
    is reopened as that shard's primary under the same epoch."""
    cfg = fault_config(tmp_path)
    vins = [f"RS{i:03d}" for i in range(6)]
    with running_cluster(cfg) as fanout:
        held = [Vehicle(port_of(fanout), v, manual_ack=True) for v in vins]
        pub = Publisher(port_of(fanout))
        try:
            pub.trigger("rs-0", vins)
            for car in held:
                car.next_message(30)  # in flight, never acked
            ray.get(fanout.controller.failover.remote(1), timeout=60)
            pub.trigger("rs-1", vins)  # after the failover: written on the promoted primary
            before = replication(fanout)
        finally:
            pub.close()
            for car in held:
                car.close()
    assert before[1]["epoch"] == 2 and "replica-1-" in before[1]["primary"]["path"]
    with running_cluster(cfg) as fanout:
        after = replication(fanout)
        assert [(s["epoch"], s["primary"]["path"]) for s in after] == [(s["epoch"], s["primary"]["path"]) for s in before]
        for rid in ("rs-0", "rs-1"):
            assert request_rows(fanout, rid) == len(vins)
        fleet = Fleet(port_of(fanout), vins)
        try:
            wait_until(lambda: fleet.has_all(["rs-0", "rs-1"]), 60, "pending and in-flight rows after the restart")
        finally:
            fleet.close()
