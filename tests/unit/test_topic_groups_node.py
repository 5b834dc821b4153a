"""The node's part of consumer groups (fanout.node.topic_groups) through the in-memory broker: a ``$share``
subscription on a durable topic's filter is claimed (no live copies), from MQTT 5 and 3.1.1 clients; joins,
acks and leaves become dispatcher events; group sends reach the member with their offsets."""
from __future__ import annotations

import pytest

from fanout.mqtt.packets import Puback, Publish, Unsubscribe
from fanout.mqtt.packets5 import Puback5, Subscribe5, Subscription
from fanout.mqtt.properties import Properties
from fanout.topics.groups_records import EV_GROUP_FAILED, EV_GROUP_JOIN, GroupAck, GroupJoin, GroupLeave, GroupSend
from fanout.records import pack_batch, unpack_batch

from .test_node_core import Client, Cluster
from .test_node_mqtt5 import Client5

DURABLE = "ecp/+/response"


@pytest.fixture
def c(tmp_path):
    cluster = Cluster(tmp_path, shards=2)
    cluster.edge.groups.set_filters({DURABLE})
    yield cluster
    cluster.close()


def group_events(c: Cluster) -> dict[int, list[tuple]]:
    taken = c.edge.take_events()
    out = {shard: [e for e in events if e[0] >= EV_GROUP_JOIN] for shard, events in taken.items()}
    return {shard: events for shard, events in out.items() if events}


def subscribe5(cl: Client5, topic_filter: str, **props) -> None:
    cl.send(Subscribe5(1, (Subscription(topic_filter, 1),), Properties(**props)))


def send(c: Cluster, *sends: tuple) -> None:
    c.edge.deliver_groups(unpack_batch(pack_batch(list(sends))))  # through the wire form
    c.flush()


def test_mqtt5_member_joins_every_shard_and_gets_no_live_copies(c):
    m = Client5(c, "consumer-1", receive_maximum=7)
    subscribe5(m, f"$share/g1/{DURABLE}", user_properties=(("start", "earliest"),))
    assert [p.reason_codes for p in m.inbox] == [(1,)]
    m.inbox.clear()
    gen = c.edge.generation_of("consumer-1")
    ev = group_events(c)
    join = GroupJoin.build("consumer-1", gen, "g1", DURABLE, 7, "earliest")
    assert ev == {0: [join], 1: [join]}
    pub = Client(c, "publisher")
    pub.send(Publish("ecp/VIN00000000000001/response", b"live", 1, False, False, 5))
    assert m.publishes5() == []  # the group is served from the log, never by live routing
    assert c.broker.state.shared.groups == {}


def test_plain_share_on_another_filter_stays_a_live_shared_subscription(c):
    m = Client5(c, "consumer-2")
    subscribe5(m, "$share/g1/other/+")
    m.inbox.clear()
    assert group_events(c) == {}
    Client(c, "publisher").send(Publish("other/x", b"live", 1, False, False, 5))
    assert [p.payload for p in m.publishes5()] == [b"live"]


def test_group_send_carries_offsets_and_puback_becomes_an_ack_on_the_partition_shard(c):
    m = Client5(c, "consumer-1")
    subscribe5(m, f"$share/g1/{DURABLE}")
    m.inbox.clear()
    group_events(c)
    gen = c.edge.generation_of("consumer-1")
    kept = [["user_property", ["trace", "t1"]], ["content_type", "application/json"]]
    send(c, GroupSend.build("consumer-1", gen, "responses", "g1", 3, 41, 1234, "ecp/V1/response", "V1", 1, b"{}", kept))
    (p,) = m.publishes5()
    assert (p.topic, p.payload, p.qos) == ("ecp/V1/response", b"{}", 1)
    assert p.properties.user_properties == (("trace", "t1"), ("partition", "3"), ("offset", "41"), ("ts_ms", "1234"),
                                            ("client_id", "V1"))
    assert p.properties.content_type == "application/json"
    m.send(Puback5(p.packet_id))
    assert group_events(c) == {1: [GroupAck.build("consumer-1", gen, "responses", "g1", 3, 41)]}


def test_mqtt311_member_is_claimed_too_and_acks(c):
    m = Client(c, "consumer-3")
    m.subscribe(f"$share/g2/{DURABLE}")
    gen = c.edge.generation_of("consumer-3")
    ev = group_events(c)
    assert ev[0] == ev[1] == [GroupJoin.build("consumer-3", gen, "g2", DURABLE, 256, "latest")]
    send(c, GroupSend.build("consumer-3", gen, "responses", "g2", 0, 7, 1, "ecp/V2/response", "V2", 1, b"x", None))
    (p,) = m.publishes()
    assert (p.topic, p.payload, p.qos) == ("ecp/V2/response", b"x", 1)
    m.send(Puback(p.packet_id))
    assert group_events(c) == {0: [GroupAck.build("consumer-3", gen, "responses", "g2", 0, 7)]}


def test_disconnect_leaves_and_a_stale_generation_fails_the_send(c):
    m = Client(c, "consumer-4", clean=False)
    m.subscribe(f"$share/g3/{DURABLE}")
    gen = c.edge.generation_of("consumer-4")
    group_events(c)
    send(c, GroupSend.build("consumer-4", gen, "responses", "g3", 1, 0, 1, "ecp/V3/response", "V3", 1, b"x", None))
    m.drop()
    ev = group_events(c)
    assert ev[0] == ev[1] == [GroupLeave.build("consumer-4", gen, None, None)]
    assert not c.broker.session_of("consumer-4").inflight  # the kept session forgets the group's message
    m2 = Client(c, "consumer-4", clean=False)  # resumed: joins again with its new generation
    gen2 = c.edge.generation_of("consumer-4")
    ev = group_events(c)
    assert ev[0] == ev[1] == [GroupJoin.build("consumer-4", gen2, "g3", DURABLE, 256, "latest")]
    assert m2.publishes() == []
    send(c, GroupSend.build("consumer-4", gen, "responses", "g3", 1, 1, 1, "ecp/V3/response", "V3", 1, b"x", None))
    ev = group_events(c)
    assert [e[0] for e in ev[1]] == [EV_GROUP_FAILED]


def test_unsubscribe_leaves_that_group(c):
    m = Client(c, "consumer-5")
    m.subscribe(f"$share/g4/{DURABLE}")
    gen = c.edge.generation_of("consumer-5")
    group_events(c)
    m.send(Unsubscribe(2, (f"$share/g4/{DURABLE}",)))
    ev = group_events(c)
    assert ev[0] == ev[1] == [GroupLeave.build("consumer-5", gen, "g4", DURABLE)]


def test_groups_per_client_bound(c):
    c.edge.groups.max_groups_per_client = 1
    m = Client(c, "consumer-6")
    m.subscribe(f"$share/a/{DURABLE}")
    m.subscribe(f"$share/b/{DURABLE}", pid=2)
    ev = group_events(c)
    assert [e[3] for e in ev[0]] == ["a"]
    assert c.edge.groups.refused == 1
    assert c.edge.groups.sys_values()["$SYS/fanout/groups/refused"] == 1


def test_acl_at_delivery_evicts_a_member_that_may_not_read(tmp_path):
    import dataclasses

    from fanout.config import mqtt_settings
    from fanout.mqtt.auth import AccessControl
    from fanout.mqtt.broker import Broker
    from fanout.mqtt.settings import AclRule

    c = Cluster(tmp_path, shards=2)
    try:
        cfg = dataclasses.replace(c.cfg, acl=(AclRule("subscribe", "ecp/SECRET/#", False),))
        c.broker = Broker(mqtt_settings(cfg), AccessControl(mqtt_settings(cfg), listener_is_loopback=True), c.edge,
                          now_ms=c.now)
        c.edge.attach(c.broker)
        c.edge.groups.set_filters({DURABLE})
        m = Client(c, "consumer-7")
        m.subscribe(f"$share/g7/{DURABLE}")  # the filter itself is allowed
        gen = c.edge.generation_of("consumer-7")
        group_events(c)
        send(c, GroupSend.build("consumer-7", gen, "responses", "g7", 0, 3, 1, "ecp/SECRET/response", "SECRET", 1,
                                b"x", None))
        assert m.publishes() == []  # checked at delivery: not sent
        ev = group_events(c)
        assert ev == {0: [(EV_GROUP_FAILED, "consumer-7", gen, "responses", "g7", 0, 3, True)]}  # evict
    finally:
        c.close()


def test_a_restarted_dispatcher_learns_the_members_again(c):
    m = Client5(c, "consumer-8", receive_maximum=5)
    subscribe5(m, f"$share/g8/{DURABLE}", user_properties=(("start", "earliest"),))
    gen = c.edge.generation_of("consumer-8")
    group_events(c)
    sync = c.edge.sync_events(1)
    assert GroupJoin.build("consumer-8", gen, "g8", DURABLE, 5, "earliest") in sync
    m.drop()
    group_events(c)
    assert all(e[0] != EV_GROUP_JOIN for e in c.edge.sync_events(1))
