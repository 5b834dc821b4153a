"""A dispatcher killed under a live cluster: Ray restarts it, it reopens its shard and the node resyncs.

Own cluster (the kill would disturb the other modules' shared one). Delivery stays at-least-once: rows
whose PUBACK was not yet committed when the process died are delivered again.
"""
from __future__ import annotations

import os
import signal

import pytest
import ray

from .fanout_harness import Vehicle, fanout_config, publish_batch, running_cluster, wait_until


@pytest.fixture(scope="module")
def fanout(ray_local, tmp_path_factory):
    with running_cluster(fanout_config(tmp_path_factory.mktemp("restart"))) as cluster:
        yield cluster


def test_killed_dispatcher_restarts_and_connected_vehicles_keep_receiving(fanout):
    cars = [Vehicle(fanout.port, f"RST{i}") for i in range(6)]
    try:
        publish_batch(fanout.port, [c.client_id for c in cars], "rst-1")
        for car in cars:
            car.next_message()
        wait_until(lambda: fanout.inspect("request", "rst-1")["by_status"] == {"delivered": 6}, 15, "rst-1 acked")
        before = {s["shard"]: s["incarnation"] for s in fanout.status()["shards"]}
        dispatcher = ray.get(fanout.controller.handles.remote())["dispatchers"][0]
        pid = ray.get(dispatcher.__ray_call__.remote(lambda self: os.getpid()))
        os.kill(pid, signal.SIGKILL)
        publish_batch(fanout.port, [c.client_id for c in cars], "rst-2")  # retried on the restarted actor
        for car in cars:
            topics = []
            while not topics or topics[-1] != f"agent/{car.client_id}/proxy/request/rst-2":
                topics.append(car.next_message(30).topic)
        after = {s["shard"]: s["incarnation"] for s in fanout.status()["shards"]}
        assert after[0] != before[0] and after[1] == before[1]
        wait_until(lambda: fanout.inspect("request", "rst-2")["by_status"] == {"delivered": 6}, 15, "rst-2 acked")
    finally:
        for car in cars:
            car.close()


def test_node_declared_down_after_a_stall_is_taken_back_and_its_vehicles_served(fanout):
    """A node that missed a health check (declared down: the dispatchers forgot its connections) but
    answers again is taken back: it resends its connections and pending rows reach its vehicles."""
    car = Vehicle(fanout.port, "STALL1")
    try:
        handles = ray.get(fanout.controller.handles.remote())
        node_id = next(iter(handles["nodes"]))
        # what the controller does when check_health times out (a >10 s stall is too slow to stage here)
        ray.get(fanout.controller.__ray_call__.remote(lambda self: self.down.add(node_id)))
        ray.get([d.node_down.remote(node_id) for d in handles["dispatchers"]])
        publish_batch(fanout.port, ["STALL1"], "stall-1")
        msg = car.next_message(30)  # no heartbeat: the resync after the recheck dispatches it
        assert msg.topic == "agent/STALL1/proxy/request/stall-1"
        assert node_id not in ray.get(fanout.controller.__ray_call__.remote(lambda self: set(self.down)))
    finally:
        car.close()
