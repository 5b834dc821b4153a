"""Several listener processes on one Ray node (``mqtt.listeners_per_node = 2``) sharing one port.

Why it exists: one process holds at most RLIMIT_NOFILE connections (20,000 on this machine, hard), so
100,000 vehicles on one machine need several listeners; SO_REUSEPORT lets them share the port and the
kernel spreads new connections over them. Each listener is a connection node of its own, so what
crosses listeners (deliveries, plain publishes, takeover) takes the cross-node paths.
"""
from __future__ import annotations

import pytest

from .fanout_harness import (
    RawClient, Vehicle, connections_by_node, fanout_config, publish_batch, running_cluster, spread_over_listeners,
    wait_until,
)

pytestmark = pytest.mark.timeout(180)


@pytest.fixture(scope="module")
def fanout(ray_local, tmp_path_factory):
    cfg = fanout_config(tmp_path_factory.mktemp("listeners")).replace("mqtt", listeners_per_node=2)
    with running_cluster(cfg) as cluster:
        yield cluster


def test_two_listeners_share_the_port(fanout):
    nodes = fanout.nodes
    assert len(nodes) == 2 and len({n["port"] for n in nodes}) == 1
    assert len({n["ray_node_id"] for n in nodes}) == 1  # one machine, two processes


def test_vehicles_spread_over_listeners_and_all_get_the_batch(fanout):
    vins: list[str] = []
    cars: list[Vehicle] = []

    def add() -> None:
        vins.append(f"LST{len(cars):03d}")
        cars.append(Vehicle(fanout.port, vins[-1]))

    try:
        by_node = spread_over_listeners(fanout, cars, add, at_least=16)
        assert len(by_node) == 2 and all(n > 0 for n in by_node.values()), by_node
        publish_batch(fanout.port, vins, "lst-1", data_id="lst-blob", blob=b"fw")
        for car in cars:
            msg = car.next_message()
            assert (msg.topic, msg.payload) == (f"agent/{car.client_id}/proxy/request/lst-1", b"fw")
        wait_until(lambda: fanout.inspect("request", "lst-1")["by_status"] == {"delivered": len(vins)}, 20,
                   "every row acknowledged")
        for car in cars:
            car.no_message(0.2)
    finally:
        for car in cars:
            car.close()


def test_publish_reaches_subscribers_on_every_listener(fanout):
    """Subscriptions reach the other listeners by route announcements (every 50 ms, one Ray call), so
    a publish right after a SUBACK may not be forwarded yet; once routes have converged, every
    subscriber gets every publish, whichever listener it is on."""
    subs = [Vehicle(fanout.port, f"news-sub-{i}", subscribe="fleet/news") for i in range(8)]
    try:
        by_node = wait_until(lambda: (c := connections_by_node(fanout)) and sum(c.values()) >= len(subs) and c,
                             15, "subscribers connected")
        pub = RawClient(fanout.port, "news-pub")
        try:
            def everyone_got_one() -> bool:
                pub.publish("fleet/news", b"warm-up", pid=None, qos=0)
                return all(s.received for s in subs)

            wait_until(everyone_got_one, 20, "routes to every listener", interval=0.2)
            pub.publish("fleet/news", b"hello", pid=None, qos=0)
            for s in subs:  # after the warm-ups still on their way
                while (payload := s.next_message().payload) == b"warm-up":
                    pass
                assert payload == b"hello", by_node
        finally:
            pub.disconnect()
    finally:
        for s in subs:
            s.close()


def test_takeover_across_listeners_closes_the_old_connection(fanout):
    """The same client id connects 6 times; whichever listener each lands on, only the newest stays."""
    clients = []
    try:
        for _ in range(6):
            clients.append(RawClient(fanout.port, "TAKE-LST"))
        for old in clients[:-1]:
            assert old.recv(20) is None, "an older connection of the client id must be closed by the takeover"
        clients[-1].quiet(0.5)  # the newest stays connected
        assert not clients[-1].closed
    finally:
        for c in clients:
            c.kill()


def test_mqtt5_properties_cross_listeners(fanout):
    """An MQTT 5 publish forwarded to the other listener (another connection node) keeps its User Properties
    (in order), Content Type, Correlation Data and its Message Expiry Interval."""
    from .test_mqtt5_clients import Paho5, opts, pub_props

    subs: list[Paho5] = []
    pub = Paho5("props-pub")

    def add() -> None:
        sub = Paho5(f"props-sub-{len(subs)}")
        subs.append(sub)
        sub.connect(fanout.port)
        assert sub.subscribe(("fleet/props", opts(1))) == [1]

    try:
        by_node = spread_over_listeners(fanout, subs, add, at_least=8)  # a CI run once saw all 8 on one listener
        assert len(by_node) == 2 and all(n > 0 for n in by_node.values()), by_node
        pub.connect(fanout.port)
        got: dict[str, object] = {}

        def everyone_got_one() -> bool:
            pub.publish("fleet/props", b"warm-up", 0)
            for s in subs:
                while not s.messages.empty():
                    got[s.client_id] = s.messages.get()
            return len(got) == len(subs)

        wait_until(everyone_got_one, 20, "routes to every listener", interval=0.2)
        props = pub_props(UserProperty=[("trace", "t-1"), ("campaign", "c9")], ContentType="application/json",
                          CorrelationData=b"\x01\x02", MessageExpiryInterval=60)
        assert pub.publish("fleet/props", b"{}", 1, properties=props) == 0
        for s in subs:  # after the warm-ups still on their way
            while (msg := s.get(timeout=10)).payload == b"warm-up":
                pass
            p = msg.properties
            assert msg.payload == b"{}" and p.UserProperty == [("trace", "t-1"), ("campaign", "c9")], by_node
            assert (p.ContentType, p.CorrelationData) == ("application/json", b"\x01\x02")
            assert 55 <= p.MessageExpiryInterval <= 60
    finally:
        for c in (*subs, pub):
            c.close()
