"""The node's event-batching policy: bulk events (PUBACKs, heartbeats) wait for a batch or a deadline,
presence events ship at the next tick; what ConnectionNode._flush runs."""
from __future__ import annotations

from fanout.mqtt.packets import Publish
from fanout.node.event_batching import EVENTS_BATCH, EVENTS_MAX_WAIT_S, EventBatching

from .test_node_core import Client, Cluster


def test_bulk_events_wait_for_the_deadline_counted_from_the_first_look():
    b = EventBatching(batch=3, max_wait_s=0.010)
    assert b.wait(1.000, False, lambda: 1) == 0.010
    assert abs(b.wait(1.004, False, lambda: 2) - 0.006) < 1e-9
    assert b.wait(1.010, False, lambda: 2) == 0.0
    b.shipped(1.010, remaining=False)
    assert b.wait(2.0, False, lambda: 1) == 0.010  # a new wait starts with the next event


def test_a_full_batch_or_an_urgent_event_ships_at_once():
    b = EventBatching(batch=3, max_wait_s=0.010)
    assert b.wait(1.0, False, lambda: 3) == 0.0
    assert b.wait(1.0, True, lambda: 1 / 0) == 0.0  # urgent: the count is not even asked for


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
        assert edge.events_wait(0.0) == 0.0  # a connect ships at the next tick
        edge.take_events(now_s=0.0)
        for _ in range(3):
            car.send(Publish("ecp/V1/heartbeat", b"", 0, False, False, None))
        assert edge.events_wait(1.0) == EVENTS_MAX_WAIT_S  # heartbeats wait for a batch
        assert edge.events_wait(1.0 + EVENTS_MAX_WAIT_S) == 0.0
        edge.batching.batch = 3
        edge.take_events(now_s=2.0)
        for _ in range(3):
            car.send(Publish("ecp/V1/heartbeat", b"", 0, False, False, None))
        assert edge.events_wait(3.0) == 0.0  # a full batch ships at once
        assert EventBatching().batch == EVENTS_BATCH  # the production default
    finally:
        c.close()
