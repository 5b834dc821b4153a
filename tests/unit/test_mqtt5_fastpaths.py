"""The MQTT 5 fast paths give the same packets as the general ones: an aliased PUBLISH decoded to an interned
Properties value, receivers with a known Topic Alias served from shared pre-encoded parts, plain MQTT 5
receivers encoded once per message (in memory, the ``Net`` of test_mqtt_broker)."""
from __future__ import annotations

import pytest

from fanout.mqtt.codec import decode, encode
from fanout.mqtt.errors import ProtocolError
from fanout.mqtt.message5 import message_props
from fanout.mqtt.packets import Publish
from fanout.mqtt.packets5 import Puback5, Publish5, Subscription
from fanout.mqtt.properties import Properties
from fanout.mqtt.property_block import ALIAS_ONLY_INTERNED
from fanout.mqtt.reason_codes import ReasonCode as RC
from tests.unit.test_mqtt5_broker import c5, disconnects, publishes
from tests.unit.test_mqtt_broker import Net


def _decode5(pkt):
    data = encode(pkt)
    got, end = decode(data, protocol_level=5)
    assert end == len(data)
    return got


def test_alias_only_publish_decodes_to_one_shared_value_equal_to_the_general_one():
    a = _decode5(Publish5("", b"1", 1, packet_id=1, properties=Properties(topic_alias=7)))
    b = _decode5(Publish5("t/x", b"2", 1, packet_id=2, properties=Properties(topic_alias=7)))
    assert a.properties is b.properties and a.properties == Properties(topic_alias=7)
    assert message_props(a.properties, 0) is None  # nothing to forward
    high = ALIAS_ONLY_INTERNED + 5  # past the interned range: the general decoder, same value
    assert _decode5(Publish5("", b"3", 0, properties=Properties(topic_alias=high))).properties == \
        Properties(topic_alias=high)
    mixed = _decode5(Publish5("t", b"4", 0, properties=Properties(topic_alias=7, content_type="x")))
    assert mixed.properties == Properties(topic_alias=7, content_type="x")
    assert message_props(mixed.properties, 0).props == Properties(content_type="x")


def test_topic_alias_zero_is_still_refused_with_0x94():
    data = bytearray(encode(Publish5("t", b"", 0, properties=Properties(topic_alias=1))))
    data[-1] = 0  # alias 1 -> 0 (the last two bytes are the alias, the payload is empty)
    with pytest.raises(ProtocolError) as exc:
        decode(bytes(data), protocol_level=5)
    assert exc.value.reason_code == RC.TOPIC_ALIAS_INVALID


@pytest.mark.parametrize("qos", [0, 1])
def test_receivers_with_a_known_alias_share_parts_and_get_what_the_general_path_sends(qos):
    net = Net(mqtt={"topic_alias_maximum": 8})
    subs = [c5(net) for _ in range(3)]
    for i, s in enumerate(subs):
        s.connect5(f"s{i}", topic_alias_maximum=2 if i < 2 else 1)
        s.sub5(Subscription("t/#", qos))
    plain = c5(net)
    plain.connect5("plain")
    plain.sub5(Subscription("t/#", qos))
    pub = net.client()
    pub.connect("p")
    for n, topic in enumerate(("t/a", "t/a", "t/b", "t/a", "t/b", "t/c")):
        pub.send(Publish(topic, b"%d" % n, qos, packet_id=n + 1 if qos else None))
    for i, s in enumerate(subs):
        packets = publishes(s.take())
        got = [(p.topic, p.properties.topic_alias, p.payload, p.qos) for p in packets]
        if i < 2:  # two aliases: t/a -> 1, t/b -> 2, t/c in full
            assert got == [("t/a", 1, b"0", qos), ("", 1, b"1", qos), ("t/b", 2, b"2", qos), ("", 1, b"3", qos),
                           ("", 2, b"4", qos), ("t/c", None, b"5", qos)]
        else:
            assert got == [("t/a", 1, b"0", qos), ("", 1, b"1", qos), ("t/b", None, b"2", qos),
                           ("", 1, b"3", qos), ("t/b", None, b"4", qos), ("t/c", None, b"5", qos)]
        if qos:
            assert sorted(p.packet_id for p in packets) == sorted(s.conn.session.inflight) and len(packets) == 6
    assert [(p.topic, p.properties.topic_alias) for p in publishes(plain.take())] == [
        ("t/a", None), ("t/a", None), ("t/b", None), ("t/a", None), ("t/b", None), ("t/c", None)]


def test_aliased_message_over_the_receivers_maximum_packet_size_is_not_sent():
    net = Net(mqtt={"topic_alias_maximum": 8})
    sub = c5(net)
    sub.connect5("s", topic_alias_maximum=4, maximum_packet_size=40)
    sub.sub5(Subscription("t", 1))
    pub = net.client()
    pub.connect("p")
    pub.send(Publish("t", b"small", 1, packet_id=1), Publish("t", b"x" * 60, 1, packet_id=2),
             Publish("t", b"again", 1, packet_id=3))
    got = publishes(sub.take())
    assert [(p.topic, p.properties.topic_alias, p.payload) for p in got] == [("t", 1, b"small"), ("", 1, b"again")]
    assert net.broker.state.too_large_dropped == 1
    sub.send(*(Puback5(p.packet_id) for p in got))
    assert not sub.conn.session.inflight and not disconnects(sub.take())


def test_aliased_receivers_get_the_messages_properties_and_remaining_expiry():
    net = Net(mqtt={"topic_alias_maximum": 8})
    subs = [c5(net) for _ in range(2)]
    for i, s in enumerate(subs):
        s.connect5(f"s{i}", topic_alias_maximum=4)
        s.sub5(Subscription("t", 1))
    pub = c5(net)
    pub.connect5("p")
    props = Properties(content_type="text/plain", user_properties=(("k", "1"), ("k", "2")), message_expiry_interval=30)
    pub.send(Publish5("t", b"a", 1, packet_id=1, properties=props),
             Publish5("t", b"b", 1, packet_id=2, properties=props))
    for s in subs:
        got = publishes(s.take())
        assert [(p.topic, p.properties.topic_alias, p.payload) for p in got] == [("t", 1, b"a"), ("", 1, b"b")]
        for p in got:
            assert (p.properties.content_type, p.properties.user_properties, p.properties.message_expiry_interval) == (
                "text/plain", (("k", "1"), ("k", "2")), 30)


def test_deliveries_queued_behind_a_full_window_go_out_as_the_general_path_would():
    """A plain MQTT 5 receiver whose window is full gets the message queued directly; the drain then
    encodes it itself: a held alias as the alias alone, a new topic with a new alias, the topic in full
    once the maximum is used up, and one over the Maximum Packet Size not at all (counted)."""
    net = Net(mqtt={"topic_alias_maximum": 8})
    aliased, plain = c5(net), c5(net)
    aliased.connect5("a", topic_alias_maximum=2, receive_maximum=1, maximum_packet_size=60)
    plain.connect5("p", receive_maximum=1)
    for s in (aliased, plain):
        s.sub5(Subscription("t/#", 1))
    pub = c5(net)
    pub.connect5("pub")
    sent = [("t/a", b"0"), ("t/a", b"1"), ("t/b", b"2"), ("t/a", b"x" * 80), ("t/c", b"4"), ("t/b", b"5")]
    pub.send(*(Publish5(t, m, 1, packet_id=n + 1) for n, (t, m) in enumerate(sent)))
    assert [p.reason_code for p in pub.take()] == [0] * 6
    for s in (aliased, plain):
        assert len(s.conn.session.queue) == 5  # window of one: the rest waits in the session
    got: dict[str, list] = {"a": [], "p": []}
    for _ in range(len(sent)):
        for s in (aliased, plain):
            packets = publishes(s.take())
            got[s.conn.client_id] += packets
            s.send(*(Puback5(p.packet_id) for p in packets))
    assert [(p.topic, p.properties.topic_alias, p.payload) for p in got["a"]] == [
        ("t/a", 1, b"0"), ("", 1, b"1"), ("t/b", 2, b"2"), ("t/c", None, b"4"), ("", 2, b"5")]
    assert [(p.topic, p.properties.topic_alias, p.payload) for p in got["p"]] == [
        (t, None, m) for t, m in sent]
    assert net.broker.state.too_large_dropped == 1
    for s in (aliased, plain):
        assert not s.conn.session.inflight and not s.conn.session.queue and not disconnects(s.take())
