"""The node's event-batching policy: bulk events (PUBACKs, heartbeats) wait for a batch or a deadline,
presence events after a shorter wait; what ConnectionNode._flush runs."""
from __future__ import annotations

from fanout.mqtt.packets import Puback, Publish
from fanout.node.event_batching import (EVENTS_BATCH, EVENTS_MAX_WAIT_S, HEARTBEAT_MAX_WAIT_S, PRESENCE_MAX_WAIT_S,
                                        EventBatching)

from .test_node_core import Client, Cluster, publish_batch, vehicle


def test_bulk_events_wait_for_the_deadline_counted_from_the_first_look():
    b = EventBatching(batch=3, max_wait_s=0.010)
    assert b.wait(1.000, False, lambda: 1) == 0.010
    assert abs(b.wait(1.004, False, lambda: 2) - 0.006) < 1e-9
    assert b.wait(1.010, False, lambda: 2) == 0.0
    b.shipped(1.010, remaining=False)
    assert b.wait(2.0, False, lambda: 1) == 0.010  # a new wait starts with the next event


def test_a_full_batch_ships_at_once_an_urgent_event_after_the_presence_wait():
    b = EventBatching(batch=3, max_wait_s=0.010, presence_wait_s=0.004)
    assert b.wait(1.0, False, lambda: 3) == 0.0
    b.shipped(1.0, remaining=False)
    assert abs(b.wait(2.000, True, lambda: 1) - 0.004) < 1e-9  # a connect: shorter wait than bulk events
    assert abs(b.wait(2.003, True, lambda: 1) - 0.001) < 1e-9
    assert b.wait(2.004, True, lambda: 1) == 0.0
    assert b.wait(2.004, True, lambda: 3) == 0.0  # a full batch does not wait either
    b.shipped(2.004, remaining=False)
    assert abs(b.wait(3.0, False, lambda: 1) - 0.010) < 1e-9
    assert abs(b.wait(3.002, True, lambda: 2) - 0.002) < 1e-9  # a connect queued behind acks: 4 ms from the first
    assert EventBatching(max_wait_s=0.002, presence_wait_s=0.005).presence_wait_s == 0.002  # never longer


def test_heartbeats_alone_wait_longer_than_acks():
    b = EventBatching(batch=3, max_wait_s=0.010, presence_wait_s=0.005, heartbeat_wait_s=0.050)
    assert abs(b.wait(1.000, False, lambda: 1, heartbeats_only=True) - 0.050) < 1e-9
    assert abs(b.wait(1.020, False, lambda: 2, heartbeats_only=True) - 0.030) < 1e-9
    assert b.wait(1.020, False, lambda: 2, heartbeats_only=False) == 0.0  # an ack came: the 10 ms wait applies
    b.shipped(1.020, remaining=False)
    assert b.wait(2.0, False, lambda: 3, heartbeats_only=True) == 0.0  # a full batch ships at once
    assert abs(b.wait(2.0, True, lambda: 1, heartbeats_only=True) - 0.005) < 1e-9  # presence wins
    assert EventBatching(max_wait_s=0.020, heartbeat_wait_s=0.001).heartbeat_wait_s == 0.020  # never shorter


def test_events_left_for_a_busy_dispatcher_are_due_when_the_call_returned_late():
    b = EventBatching(batch=3, max_wait_s=0.010, presence_wait_s=0.005)
    b.wait(1.0, True, lambda: 1)
    b.shipped(1.0, remaining=True)  # one shard busy: its events count as waiting since the shipping
    assert b.wait(1.006, True, lambda: 1) == 0.0  # its call took longer than the presence wait


def test_events_left_for_a_busy_dispatcher_wait_from_the_shipping_time():
    b = EventBatching(batch=3, max_wait_s=0.010)
    b.wait(1.0, False, lambda: 1)
    b.shipped(1.5, remaining=True)
    assert abs(b.wait(1.505, False, lambda: 1) - 0.005) < 1e-9


async def test_node_core_presence_is_urgent_acks_and_heartbeats_wait(tmp_path):
    c = Cluster(tmp_path)
    try:
        edge = c.edge
        assert edge.events_wait(0.0) is None  # nothing queued
        car = Client(c, "V1")
        assert edge.events_wait(0.0) == PRESENCE_MAX_WAIT_S  # a connect waits for a few more
        assert edge.events_wait(PRESENCE_MAX_WAIT_S) == 0.0
        edge.take_events(now_s=PRESENCE_MAX_WAIT_S)
        for _ in range(3):
            car.send(Publish("ecp/V1/heartbeat", b"", 0, False, False, None))
        assert edge.events_wait(1.0) == HEARTBEAT_MAX_WAIT_S  # heartbeats alone wait for a batch, longest
        assert edge.events_wait(1.0 + HEARTBEAT_MAX_WAIT_S) == 0.0
        edge.batching.batch = 3
        edge.take_events(now_s=2.0)
        for _ in range(3):
            car.send(Publish("ecp/V1/heartbeat", b"", 0, False, False, None))
        assert edge.events_wait(3.0) == 0.0  # a full batch ships at once
        assert EventBatching().batch == EVENTS_BATCH  # the production default
    finally:
        c.close()


async def test_node_core_a_queued_puback_shortens_the_heartbeat_wait(tmp_path):
    c = Cluster(tmp_path)
    try:
        car = vehicle(c, "V1")
        await c.pump()
        await publish_batch(c, ["V1"])
        pubs = car.publishes()
        assert len(pubs) == 1
        edge = c.edge
        edge.take_events(now_s=0.0)
        car.send(Publish("ecp/V1/heartbeat", b"", 0, False, False, None))
        assert edge.events_wait(1.0) == HEARTBEAT_MAX_WAIT_S
        car.send(Puback(pubs[0].packet_id))
        assert edge.acks_queued
        assert edge.events_wait(1.0 + EVENTS_MAX_WAIT_S) == 0.0  # the ack is due after the bulk wait
        edge.take_events(now_s=2.0)
        assert not edge.acks_queued
    finally:
        c.close()
