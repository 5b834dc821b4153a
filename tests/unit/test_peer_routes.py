"""Announced routes: per-vehicle delivery filters widen to one filter; the widening is a superset."""
from __future__ import annotations

import pytest

from fanout.mqtt.topics import topic_matches
from fanout.node.peer_routes import PeerRoutes, delivery_route_generalizer

G = delivery_route_generalizer("agent/{VIN}/proxy/request")


@pytest.mark.parametrize("f, wide", [
    ("agent/VIN1/proxy/request/+", "agent/+/proxy/request/+"),
    ("agent/VIN1/proxy/request/#", "agent/+/proxy/request/#"),
    ("agent/VIN1/proxy/request/r1", "agent/+/proxy/request/r1"),
    ("agent/+/proxy/request/+", "agent/+/proxy/request/+"),
    ("agent/#", "agent/#"),
    ("agent/VIN1/other/+", "agent/VIN1/other/+"),  # not under the prefix's tail
    ("agent/VIN1", "agent/VIN1"),
    ("ecp/VIN1/heartbeat", "ecp/VIN1/heartbeat"),
    ("#", "#"),
])
def test_generalize(f, wide):
    assert G(f) == wide


def test_prefix_ending_with_the_vin_level():
    g = delivery_route_generalizer("cars/{VIN}")
    assert g("cars/V1/+") == "cars/+/+" and g("cars/V1") == "cars/+" and g("cars/#") == "cars/#"


def test_prefix_without_a_whole_vin_level_is_left_alone():
    g = delivery_route_generalizer("x/pre{VIN}/y")
    assert g("x/preV1/y/+") == "x/preV1/y/+"


@pytest.mark.parametrize("topic", ["agent/VIN1/proxy/request/r1", "agent/VIN2/proxy/request/r9",
                                   "agent/VIN1/proxy/request", "agent/VIN1/proxy/request/a/b", "other/x"])
@pytest.mark.parametrize("f", ["agent/VIN1/proxy/request/+", "agent/VIN1/proxy/request/#", "agent/VIN1/proxy/+/r1",
                               "agent/VIN1/#", "agent/+/proxy/request/r1"])
def test_widened_filter_matches_everything_the_original_does(f, topic):
    if topic_matches(f, topic):
        assert topic_matches(G(f), topic)


def test_a_fleet_of_delivery_filters_is_announced_as_one():
    routes = PeerRoutes("n0", generalize=G)
    routes.set_peers(["n0", "n1"])
    filters = [f"agent/V{i:05d}/proxy/request/+" for i in range(10_000)] + ["news/#"]
    added, removed, reset = routes.announcement(10_000, local_filters=filters)
    assert (sorted(added), removed, reset) == (["agent/+/proxy/request/+", "news/#"], [], True)
    assert routes.announcement(20_000, local_filters=filters[5:]) is None  # nothing changed after widening


def test_the_forward_queue_of_a_busy_peer_is_bounded_in_bytes_and_drops_are_counted() -> None:
    routes = PeerRoutes("n0", max_queue_bytes=1000)
    routes.set_peers(["n0", "n1", "n2"])
    routes.update("n1", ["t/#"], [])
    routes.update("n2", ["t/#"], [])
    for _ in range(20):  # n1's call is in flight: its queue grows; n2 is taken every round
        assert routes.forward("t/x", b"p" * 97, 1, False) >= 1  # 100 bytes with the topic
        routes.take_forwards(busy=["n1"])
    queued = routes.take_forwards()
    assert len(queued["n1"]) == 10 and routes.dropped == 10
    # once n1's queue is taken, it is accepted again
    assert routes.forward("t/x", b"p" * 97, 1, False) == 2 and routes.dropped == 10
    # a single publish larger than the bound still goes to an empty queue (one message is never refused)
    routes.take_forwards()
    assert routes.forward("t/x", b"p" * 5000, 1, False) == 2
