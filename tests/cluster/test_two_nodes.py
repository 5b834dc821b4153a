"""Two Ray nodes on one machine (``ray.cluster_utils.Cluster``), one connection node each.

This module needs its own Ray cluster, so it cannot share the session's ``ray_local`` instance. With
``pytest tests`` it runs first (``tests/cluster`` sorts before ``tests/integration``) and ``ray_local``
starts afterwards; if Ray is already initialised (another order), the fixture shuts it down and, at the
end, starts it again exactly as ``tests/conftest.py`` does so that later tests keep working.
"""
from __future__ import annotations

import time

import pytest
import ray

from actors.ray_observability import quiet_system_config
from tests.integration.fanout_harness import (
    Publish, RawClient, Vehicle, fanout_config, init_session_ray, publish_batch, running_cluster, wait_until,
)


@pytest.fixture(scope="module")
def two_nodes(tmp_path_factory):
    from ray.cluster_utils import Cluster

    had_session_ray = ray.is_initialized()
    if had_session_ray:
        ray.shutdown()
    node_args = {"num_cpus": 1, "resources": {"fanout_node": 1}, "object_store_memory": 80 * 1024 * 1024}
    cluster = Cluster(initialize_head=True,
                      head_node_args={**node_args, "include_dashboard": False,
                                      "_system_config": quiet_system_config()})
    try:
        cluster.add_node(**node_args)
        ray.init(address=cluster.address, log_to_driver=False, configure_logging=False)
        cluster.wait_for_nodes()
        cfg = fanout_config(tmp_path_factory.mktemp("two-nodes"))
        with running_cluster(cfg) as fanout:
            nodes = fanout.nodes
            assert len(nodes) == 2, nodes
            assert nodes[0]["ray_node_id"] != nodes[1]["ray_node_id"]
            yield fanout
    finally:
        ray.shutdown()
        cluster.shutdown()
        if had_session_ray:
            init_session_ray()  # give the session its Ray back


def ports(fanout) -> tuple[int, int]:
    a, b = fanout.nodes
    return a["port"], b["port"]


def test_vehicle_on_node_b_receives_a_batch_published_on_node_a(two_nodes):
    port_a, port_b = ports(two_nodes)
    assert port_a != port_b
    cars = [Vehicle(port_b, f"TWO{i}") for i in range(4)]
    try:
        publish_batch(port_a, [c.client_id for c in cars], "two-1", blob=b"cross-node")
        for car in cars:
            msg = car.next_message(20)
            assert (msg.topic, msg.payload) == (f"agent/{car.client_id}/proxy/request/two-1", b"cross-node")
        wait_until(lambda: two_nodes.inspect("request", "two-1")["by_status"] == {"delivered": 4}, 20,
                   "four rows acknowledged through node B")
    finally:
        for car in cars:
            car.close()


def test_client_id_takeover_across_nodes_closes_the_old_connection(two_nodes):
    port_a, port_b = ports(two_nodes)
    old = RawClient(port_a, "TAKE1")
    old.subscribe("agent/TAKE1/proxy/request/+")
    new = RawClient(port_b, "TAKE1")
    try:
        assert old.recv(20) is None, "the connection on node A must be closed by the takeover on node B"
        new.subscribe("agent/TAKE1/proxy/request/+")
        publish_batch(port_a, ["TAKE1"], "take-1")
        new.publish("ecp/TAKE1/heartbeat", b"", pid=5)
        got = [new.recv(20), new.recv(20)]
        pubs = [p for p in got if isinstance(p, Publish)]
        assert [p.topic for p in pubs] == ["agent/TAKE1/proxy/request/take-1"]
        assert two_nodes.inspect("vin", "TAKE1")["connection"]["node"] == "n1"
    finally:
        new.disconnect()


def test_publish_on_node_a_reaches_a_subscriber_on_node_b(two_nodes):
    port_a, port_b = ports(two_nodes)
    sub = RawClient(port_b, "chat-sub")
    sub.subscribe("chat/#")
    pub = RawClient(port_a, "chat-pub")
    try:
        deadline = time.monotonic() + 20
        received = None
        while received is None and time.monotonic() < deadline:  # until node B's route reached node A
            pub.publish("chat/room1", b"hello", qos=0)
            try:
                received = sub.recv(0.3)
            except AssertionError:
                continue
        assert isinstance(received, Publish) and (received.topic, received.payload) == ("chat/room1", b"hello")
        # retained messages are mirrored to every node, subscribed there or not
        pub.send(Publish("cfg/fleet", b"v2", 1, True, False, 3))
        late = None

        def retained_on_b():
            nonlocal late
            late = RawClient(port_b, "cfg-reader")
            late.subscribe("cfg/#")
            try:
                msg = late.recv(0.5)
            except AssertionError:
                msg = None
            if msg is None or not msg.retain:  # not there yet, or the live copy arrived while subscribing
                late.disconnect()
                return None
            return msg

        msg = wait_until(retained_on_b, 20, "the retained message mirrored to node B")
        assert (msg.topic, msg.payload, msg.retain) == ("cfg/fleet", b"v2", True)
        late.disconnect()
    finally:
        pub.disconnect()
        sub.disconnect()
