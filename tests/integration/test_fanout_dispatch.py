"""End to end on one local Ray: the dispatch triggers seen by real MQTT clients (paho, raw sockets).

One fanout cluster (controller, 2 dispatchers, 1 connection node, MQTT on a free loopback port) serves
the whole module; every test uses its own VINs and request ids.
"""
from __future__ import annotations

import pytest
import ray

from fanout.records import ConnectEvent, SubscribedEvent, pack_batch
from storage.keys import shard_of

from .fanout_harness import (
    Puback, Publish, RawClient, Vehicle, fanout_config, platform, publish_batch, running_cluster, trigger_payload,
    wait_until,
)


@pytest.fixture(scope="module")
def fanout(ray_local, tmp_path_factory):
    with running_cluster(fanout_config(tmp_path_factory.mktemp("dispatch"))) as cluster:
        yield cluster


def pending_of(fanout, vin: str) -> int:
    return fanout.inspect("vin", vin)["pending_rows"]


def test_realtime_dispatch_to_subscribed_vehicles(fanout):
    vins = [f"RT{i:03d}" for i in range(5)]
    cars = [Vehicle(fanout.port, vin) for vin in vins]
    try:
        publish_batch(fanout.port, vins, "rt-1", data_id="rt-blob", blob=b"firmware-1")
        for car in cars:
            msg = car.next_message()
            assert (msg.topic, msg.payload, msg.qos) == (f"agent/{car.client_id}/proxy/request/rt-1", b"firmware-1", 1)
        for car in cars:
            car.no_message(0.3)
        wait_until(lambda: fanout.inspect("request", "rt-1")["by_status"] == {"delivered": 5}, 15,
                   "all five rows acknowledged")
        assert all(pending_of(fanout, v) == 0 for v in vins)
    finally:
        for car in cars:
            car.close()


def test_late_subscriber_gets_the_batch_on_heartbeat(fanout):
    publish_batch(fanout.port, ["LATE1"], "late-1")
    car = Vehicle(fanout.port, "LATE1")
    try:
        car.no_message(1.0)  # connect and subscribe are no triggers
        car.heartbeat("online")
        assert car.next_message().topic == "agent/LATE1/proxy/request/late-1"
    finally:
        car.close()


def test_persistent_session_reconnect_gets_nothing_until_heartbeat(fanout):
    car = Vehicle(fanout.port, "PERS1", clean=False)
    car.close()  # clean DISCONNECT, session (and its subscription) kept
    publish_batch(fanout.port, ["PERS1"], "pers-1")
    car = Vehicle(fanout.port, "PERS1", clean=False, subscribe=None)
    try:
        assert car.session_present
        car.no_message(1.0)
        car.heartbeat()
        assert car.next_message().topic == "agent/PERS1/proxy/request/pers-1"
    finally:
        car.close()


def test_killed_before_puback_clean_session_gets_it_again_after_heartbeat(fanout):
    car = RawClient(fanout.port, "KILL1")
    car.subscribe("agent/KILL1/proxy/request/+")
    publish_batch(fanout.port, ["KILL1"], "kill-1")
    first = car.expect(Publish)
    assert first.topic == "agent/KILL1/proxy/request/kill-1" and not first.dup
    car.kill()  # no PUBACK
    car = RawClient(fanout.port, "KILL1")
    try:
        car.subscribe("agent/KILL1/proxy/request/+")
        car.quiet(0.5)
        car.publish("ecp/KILL1/heartbeat", b"", pid=7)
        got = [car.expect(Puback, 10), car.expect(Publish, 10)]
        again = got[1]
        assert again.topic == "agent/KILL1/proxy/request/kill-1" and again.payload == b"BLOB"
        car.send(Puback(again.packet_id))
        wait_until(lambda: pending_of(fanout, "KILL1") == 0, 10, "the row of KILL1 deleted after PUBACK")
    finally:
        car.disconnect()


def test_resumed_session_redelivers_once_with_dup_and_heartbeat_does_not_redispatch(fanout):
    car = RawClient(fanout.port, "RESUME1", clean=False)
    car.subscribe("agent/RESUME1/proxy/request/+")
    publish_batch(fanout.port, ["RESUME1"], "resume-1")
    first = car.expect(Publish)
    assert not first.dup
    car.kill()  # killed before PUBACK: the session keeps the unacked message
    car = RawClient(fanout.port, "RESUME1", clean=False)
    try:
        assert car.session_present
        again = car.expect(Publish)
        assert (again.topic, again.dup, again.packet_id) == ("agent/RESUME1/proxy/request/resume-1", True, first.packet_id)
        car.publish("ecp/RESUME1/online", b"", pid=9)
        assert car.expect(Puback).packet_id == 9
        car.publish("ecp/RESUME1/heartbeat", b"", pid=10)
        assert car.expect(Puback).packet_id == 10
        car.quiet(1.0)  # exactly one PUBLISH: the heartbeats did not send it again
        car.send(Puback(again.packet_id))
        wait_until(lambda: pending_of(fanout, "RESUME1") == 0, 10, "the row of RESUME1 deleted")
        state = fanout.inspect("vin", "RESUME1")["state"]
        assert state["inflight"] is None and state["subscribed"]
    finally:
        car.disconnect()


def test_several_requests_arrive_oldest_first_one_at_a_time(fanout):
    car = RawClient(fanout.port, "SEQ1")
    car.subscribe("agent/SEQ1/proxy/request/+")
    p = platform(fanout.port, "platform-seq")
    try:
        p.publish("$SDV-FANOUT/data/seq-blob", b"S", pid=1)
        assert p.expect(Puback).packet_id == 1
        # request ids deliberately not in lexical order: delivery follows publish order
        for pid, rid in enumerate(("seq-c", "seq-a", "seq-b"), start=2):
            p.publish("$SDV-FANOUT/trigger", trigger_payload(["SEQ1"], rid, "seq-blob"), pid=pid)
        assert [p.expect(Puback).packet_id for _ in range(3)] == [2, 3, 4]
        got = []
        for _ in range(3):
            msg = car.expect(Publish)
            got.append(msg.topic.rsplit("/", 1)[1])
            car.quiet(0.4)  # the next one waits for this PUBACK
            car.send(Puback(msg.packet_id))
        assert got == ["seq-c", "seq-a", "seq-b"]
        wait_until(lambda: pending_of(fanout, "SEQ1") == 0, 10, "all SEQ1 rows deleted")
    finally:
        p.disconnect()
        car.disconnect()


def test_unsubscribed_vehicle_is_not_sent_and_gets_it_after_subscribe_and_heartbeat(fanout):
    car = RawClient(fanout.port, "UNSUB1")
    try:
        publish_batch(fanout.port, ["UNSUB1"], "unsub-1")
        car.publish("ecp/UNSUB1/heartbeat", b"", pid=3)
        assert car.expect(Puback).packet_id == 3
        car.quiet(0.5)  # connected but not subscribed: nothing
        car.subscribe("agent/UNSUB1/#")
        car.publish("ecp/UNSUB1/heartbeat", b"", pid=4)
        assert car.expect(Puback).packet_id == 4
        assert car.expect(Publish).topic == "agent/UNSUB1/proxy/request/unsub-1"
    finally:
        car.disconnect()


@ray.remote(num_cpus=0)
class FailingNode:
    """A connection node whose ``deliver`` raises an ordinary exception (not a dead actor)."""

    def __init__(self) -> None:
        self.calls = 0

    async def deliver(self, *args: object) -> list:
        self.calls += 1
        raise RuntimeError("deliver failed on purpose")

    async def call_count(self) -> int:
        return self.calls


def test_a_failing_deliver_call_clears_in_flight_so_the_row_is_sent_again(fanout):
    handles = ray.get(fanout.controller.handles.remote())
    vin = "CALLFAIL1"
    dispatcher = handles["dispatchers"][shard_of(vin, len(handles["dispatchers"]))]
    bad = FailingNode.remote()
    ray.get(dispatcher.set_nodes.remote({**handles["nodes"], "bad": bad}))
    try:
        # the dispatcher believes vin is connected and subscribed on node "bad"
        ray.get(dispatcher.events.remote("bad", pack_batch([
            ConnectEvent.build(vin, 1, False, False, None), SubscribedEvent.build(vin, 1, True, None)])))
        publish_batch(fanout.port, [vin], "callfail-1")
        wait_until(lambda: ray.get(bad.call_count.remote()) >= 1, 15, "a deliver call to the failing node")
        # call_failed cleared the in-flight row: it stays pending for the next trigger
        wait_until(lambda: fanout.inspect("vin", vin)["state"]["inflight"] is None, 10, "in-flight state cleared")
        assert pending_of(fanout, vin) == 1
    finally:
        ray.get(dispatcher.set_nodes.remote(handles["nodes"]))  # "bad" is down: its connection is forgotten
