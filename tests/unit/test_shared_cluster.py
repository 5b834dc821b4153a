"""MQTT 5 shared subscriptions across two nodes (fanout.mqtt.shared rules 1-3, fanout.node.peer_routes):
each message of a group reaches exactly one member cluster-wide, whichever node it enters on.

Harness: two node cores with in-memory brokers (test_node_core's ``Cluster``), route announcements and
forwards moved by hand through ``pack_batch`` as on the Ray boundary.
"""
from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fanout.mqtt.packets import Puback, Publish
from fanout.mqtt.packets5 import Puback5, Publish5, Subscribe5, Subscription
from fanout.mqtt.properties import Properties
from fanout.node.peer_routes import PeerRoutes
from fanout.records import Forward, pack_batch, unpack_batch

from .test_node_core import Client, Cluster
from .test_node_mqtt5 import Client5


class TwoNodes:
    """Nodes A and B that know each other; :meth:`announce` and :meth:`ship` move what the actors would."""

    def __init__(self, tmp_path: Path) -> None:
        self.nodes = {n: Cluster(tmp_path / n, node_id=n) for n in ("A", "B")}
        for c in self.nodes.values():
            c.edge.routes.set_peers(["A", "B"])
        self.now_ms = 0

    def close(self) -> None:
        for c in self.nodes.values():
            c.close()

    def announce(self) -> None:
        """One announcement round (each node's filter diff and group table to the other)."""
        self.now_ms += 10_000
        for name, c in self.nodes.items():
            ann = c.edge.route_announcement(self.now_ms)
            if ann is not None:
                for other, peer in self.nodes.items():
                    if other != name:
                        peer.edge.routes.update(name, *ann)

    def ship(self) -> int:
        """Move every queued forward to its node; returns how many forwards moved."""
        moved = 0
        for c in self.nodes.values():
            c.flush()
            for peer, messages in c.edge.routes.take_forwards().items():
                self.nodes[peer].edge.apply_forwards(unpack_batch(pack_batch(messages)))
                self.nodes[peer].flush()
                moved += len(messages)
        return moved


@pytest.fixture
def two(tmp_path):
    nodes = TwoNodes(tmp_path)
    yield nodes
    nodes.close()


def member(c: Cluster, client_id: str, *filters: str) -> Client5:
    m = Client5(c, client_id)
    m.send(Subscribe5(1, tuple(Subscription(f, 1) for f in filters)))
    m.inbox.clear()  # the SUBACK
    return m


def drain(members: list[Client5], got: dict[str, list[bytes]]) -> None:
    """Take every member's PUBLISHes (acknowledging QoS 1 ones, so windows stay open) into ``got``."""
    for m in members:
        for p in m.publishes5():
            got.setdefault(m.conn.client_id, []).append(p.payload)
            if p.qos:
                m.send(Puback5(p.packet_id))


def test_each_message_reaches_one_member_of_each_group_whatever_node_it_enters(two):
    a, b = two.nodes["A"], two.nodes["B"]
    g1 = [member(a, "a1", "$share/g1/jobs/+"), member(a, "a2", "$share/g1/jobs/+"), member(b, "b1", "$share/g1/jobs/+")]
    g2 = [member(b, "b2", "$share/g2/jobs/#")]  # only on B
    plain = Client(b, "plain-3-1-1")
    plain.subscribe("jobs/+")
    two.announce()
    assert a.broker.route_filters() == [] and b.broker.route_filters() == ["jobs/+"]  # groups go as groups
    pubs = {"A": Client5(a, "pa"), "B": Client(b, "pb")}  # an MQTT 5 and a 3.1.1 publisher
    got: dict[str, list[bytes]] = {}
    plain_got: list[bytes] = []
    n = 60
    for i in range(n):
        where = "A" if i % 2 == 0 else "B"
        payload = b"%d" % i
        if where == "A":
            pubs["A"].send(Publish5("jobs/x", payload, 1, False, False, i + 1))
        else:
            pubs["B"].send(Publish("jobs/x", payload, 1, False, False, i + 1))
        two.ship()
        drain(g1 + g2, got)
        for q in plain.publishes():
            plain_got.append(q.payload)
            plain.send(Puback(q.packet_id))
    g1_payloads = Counter(p for m in ("a1", "a2", "b1") for p in got.get(m, []))
    assert g1_payloads == Counter(b"%d" % i for i in range(n))  # each exactly once in the group
    assert Counter(got["b2"]) == Counter(b"%d" % i for i in range(n))
    # weighted by member count: A has 2 of g1's 3 members, B 1 (each origin places 2:1 in turn)
    assert len(got["a1"]) + len(got["a2"]) == 40 and len(got["b1"]) == 20
    assert got["a1"] and got["a2"]
    assert plain_got == [b"%d" % i for i in range(n)]  # the ordinary subscription: every message, as before
    assert a.edge.stats()["shared_orphaned"] == b.edge.stats()["shared_orphaned"] == 0
    # A placed 10 of its 30 g1 messages and all 30 g2 ones on B; B placed 20 of its 30 g1 messages on A
    assert (a.edge.stats()["shared_placed_away"], b.edge.stats()["shared_placed_away"]) == (40, 20)


def test_forwarded_group_message_keeps_properties_and_remaining_expiry(two):
    a, b = two.nodes["A"], two.nodes["B"]
    m = member(b, "b1", "$share/g/telemetry/#")
    two.announce()
    props = Properties(content_type="application/json", user_properties=(("trace", "t-1"),),
                       message_expiry_interval=120)
    Client5(a, "sender").send(Publish5("telemetry/car1", b"{}", 1, False, False, 1, props))
    (fw,) = a.edge.routes.take_forwards()["B"]
    assert fw[5:] == (("$share/g/telemetry/#",), False)  # for that group only
    assert b.edge.apply_forwards([fw]) == 1
    b.flush()
    (p,) = m.publishes5()
    assert (p.properties.content_type, p.properties.user_properties) == ("application/json", (("trace", "t-1"),))
    assert 119 <= p.properties.message_expiry_interval <= 120


def test_a_member_gone_before_the_message_arrives_drops_it_for_that_group_and_counts_it(two):
    a, b = two.nodes["A"], two.nodes["B"]
    only = member(b, "b1", "$share/g/jobs/+")
    two.announce()
    pub = Client5(a, "pa")
    pub.send(Publish5("jobs/x", b"1", 1, False, False, 1))  # placed on B, still in A's queue
    only.drop()  # B's last member leaves before the forward arrives
    assert two.ship() == 1
    assert b.edge.stats()["shared_orphaned"] == 1
    two.announce()  # B no longer has the group: A keeps the next ones (no member anywhere: nothing sent)
    local = member(a, "a1", "$share/g/jobs/+")
    pub.send(Publish5("jobs/x", b"2", 1, False, False, 2))
    assert two.ship() == 0
    assert [p.payload for p in local.publishes5()] == [b"2"]
    assert a.broker.state.shared.groups == {"$share/g/jobs/+": {"a1": 1}}
    two.announce()
    assert b.broker.state.shared.groups == {"$share/g/jobs/+": {}}  # known as A's group only


def test_a_peer_that_leaves_takes_its_groups_with_it(two):
    a, b = two.nodes["A"], two.nodes["B"]
    member(b, "b1", "$share/g/jobs/+")
    two.announce()
    assert "$share/g/jobs/+" in a.broker.state.shared.groups
    a.edge.routes.remove_node("B")
    assert a.broker.state.shared.groups == {}
    Client5(a, "pa").send(Publish5("jobs/x", b"1", 1, False, False, 1))
    assert a.edge.routes.take_forwards() == {}


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(on_a=st.integers(0, 3), on_b=st.integers(1, 3), qos=st.sampled_from([0, 1]),
       origins=st.lists(st.sampled_from("AB"), min_size=1, max_size=40))
def test_property_every_message_reaches_exactly_one_member(tmp_path_factory, on_a, on_b, qos, origins):
    two = TwoNodes(tmp_path_factory.mktemp("two"))
    try:
        members = [member(two.nodes["A"], f"a{i}", "$share/g/s/#") for i in range(on_a)]
        members += [member(two.nodes["B"], f"b{i}", "$share/g/s/#") for i in range(on_b)]
        two.announce()
        pubs = {n: Client5(c, "p" + n) for n, c in two.nodes.items()}
        got: dict[str, list[bytes]] = {}
        for i, where in enumerate(origins):
            pubs[where].send(Publish5("s/t", b"%d" % i, qos, False, False, i + 1 if qos else None))
            two.ship()
            drain(members, got)
        assert Counter(p for ps in got.values() for p in ps) == Counter(b"%d" % i for i in range(len(origins)))
        per_node = Counter(cid[0] for cid, ps in got.items() for _ in ps)
        if len(origins) >= 2 * (on_a + on_b):  # every node with members gets its share
            assert (per_node["a"] > 0) == (on_a > 0) and per_node["b"] > 0
    finally:
        two.close()


def test_sys_messages_stay_on_their_node(two):
    a, b = two.nodes["A"], two.nodes["B"]
    here = member(a, "a1", "$share/g/$SYS/#")
    there = member(b, "b1", "$share/g/$SYS/#")
    two.announce()
    for i in range(4):  # each node's own $SYS tree: never placed on the other node
        a.broker.publish_local("$SYS/broker/uptime", b"%d" % i, 0)
    a.flush()
    assert a.edge.routes.take_forwards() == {}
    assert [p.payload for p in here.publishes5()] == [b"0", b"1", b"2", b"3"] and there.publishes5() == []


def test_group_forwards_keep_the_peer_queue_bound_and_need_a_peer():
    routes = PeerRoutes("A", max_queue_bytes=100)
    routes.set_peers(["A", "B"])
    assert not routes.forward_shared("C", ("$share/g/t",), "t", b"x", 1)  # not a peer (any more)
    assert routes.forward_shared("B", ("$share/g/t",), "t", b"x" * 90, 1)
    assert not routes.forward_shared("B", ("$share/g/t",), "t", b"x" * 20, 1)  # over the bytes queued for B
    assert routes.dropped == 2 and routes.forwarded == 1
    (fw,) = routes.take_forwards()["B"]
    assert Forward(*fw) == Forward("t", b"x" * 90, 1, False, None, ("$share/g/t",), False)
