"""The broker core speaking MQTT 5, driven in memory (the ``Net`` of test_mqtt_broker, with a level-5 peer)."""
from __future__ import annotations

import pytest

from fanout.config import AclRule
from fanout.mqtt.codec import PacketReader, encode
from fanout.mqtt.connection import CONNECTED
from fanout.mqtt.packets import Connack, Connect, Pingreq, Pingresp, Publish, Subscribe
from fanout.mqtt.packets5 import (
    Auth5, Connack5, Connect5, Disconnect5, Puback5, Pubcomp5, Publish5, Pubrec5, Pubrel5, Suback5, Subscribe5,
    Subscription, Unsuback5, Unsubscribe5, Will5,
)
from fanout.mqtt.properties import EMPTY_PROPERTIES, Properties
from fanout.mqtt.reason_codes import ReasonCode as RC
from tests.unit.test_mqtt_broker import FakeClient, Net


class Client5(FakeClient):
    """A peer that speaks MQTT 5 (its reader decodes the broker's level-5 packets)."""

    def __init__(self, net: Net) -> None:
        super().__init__(net)
        self.reader = PacketReader(protocol_level=5)

    def connect5(self, client_id: str, clean: bool = True, keepalive: int = 60, will: Will5 | None = None,
                 username: str | None = None, password: bytes | None = None, **props) -> Connack5:
        self.send(Connect5(client_id, clean, keepalive, username, password, will, Properties(**props)))
        got = self.take()
        assert got and isinstance(got[0], Connack5), got
        self.inbox = got[1:]
        return got[0]

    def sub5(self, *subs: Subscription, pid: int = 1, sub_id: int | None = None) -> tuple[int, ...]:
        props = Properties(subscription_identifiers=(sub_id,)) if sub_id else EMPTY_PROPERTIES
        self.send(Subscribe5(pid, subs, props))
        got = self.take()
        assert isinstance(got[0], Suback5) and got[0].packet_id == pid, got
        self.inbox = got[1:]
        return got[0].reason_codes


def c5(net: Net) -> Client5:
    return Client5(net)


def disconnects(packets) -> list[int]:
    """The reason codes of the DISCONNECTs among ``packets`` (they carry the reason as Reason String too)."""
    return [p.reason_code for p in packets if isinstance(p, Disconnect5)]


def publishes(packets) -> list:
    return [p for p in packets if isinstance(p, (Publish, Publish5))]


@pytest.fixture
def net() -> Net:
    return Net()


# -- negotiation and CONNACK -------------------------------------------------------------------------


def test_level5_connect_gets_connack5_with_properties(net):
    c = c5(net)
    ack = c.connect5("a")
    assert ack.reason_code == 0 and not ack.session_present
    props = ack.properties
    assert props.receive_maximum == net.settings.receive_maximum
    assert props.topic_alias_maximum == net.settings.topic_alias_maximum
    assert props.maximum_packet_size == net.settings.max_packet_size_bytes
    assert (props.retain_available, props.wildcard_subscription_available,
            props.subscription_identifier_available, props.shared_subscription_available) == (1, 1, 1, 1)
    assert props.assigned_client_identifier is None
    assert c.conn.state is CONNECTED and c.conn.v5 is not None
    assert net.broker.state.v5_connected == 1
    c.send(Pingreq())
    assert c.take() == [Pingresp()]


def test_level4_connect_is_unchanged(net):
    c = net.client()
    assert c.connect("a") == Connack(False, 0)
    assert c.conn.v5 is None


def test_server_keep_alive_default_cap_is_60s(net):
    c = c5(net)
    assert c.connect5("k", keepalive=120).properties.server_keep_alive == 60
    d = c5(net)
    assert d.connect5("d", keepalive=30).properties.server_keep_alive is None
    v3 = net.client()
    v3.connect("v3", keepalive=120)
    assert v3.conn.keepalive_ms == 180_000  # 3.1.1 cannot be told: its own keep alive stands


def test_assigned_client_identifier_and_server_keep_alive():
    net = Net(mqtt={"max_keepalive": "30s"})
    c = c5(net)
    ack = c.connect5("", clean=False, keepalive=600)
    assert ack.properties.assigned_client_identifier.startswith("auto-")
    assert ack.properties.server_keep_alive == 30
    assert c.conn.keepalive_ms == 45_000


def test_refusals_carry_mqtt5_reason_codes():
    net = Net(mqtt={"anonymous_role": "none"}, users={})
    c = c5(net)
    c.send(Connect5("a"))
    assert c.take()[0].reason_code == RC.NOT_AUTHORIZED and c.closed
    c = c5(net)
    c.send(Connect5("a", properties=Properties(authentication_method="SCRAM-SHA-1")))
    assert c.take()[0].reason_code == RC.BAD_AUTHENTICATION_METHOD and c.closed


def test_auth_without_an_authentication_method_is_a_protocol_error(net):
    # 4.12: an AUTH from a client whose CONNECT named no Authentication Method is a Protocol Error
    c = c5(net)
    assert c.connect5("no-method").reason_code == RC.SUCCESS
    c.send(Auth5(RC.CONTINUE_AUTHENTICATION, Properties(authentication_method="SCRAM-SHA-1")))
    assert disconnects(c.take()) == [RC.PROTOCOL_ERROR] and c.closed


def test_bad_password_is_0x86():
    from fanout.config import UserConfig
    from fanout.mqtt.auth import hash_password

    net = Net(users={"alice": UserConfig("alice", hash_password("secret", iterations=1000), "client")})
    c = c5(net)
    c.send(Connect5("a", username="alice", password=b"wrong"))
    assert c.take()[0].reason_code == RC.BAD_USER_NAME_OR_PASSWORD


def test_session_expiry_replaces_clean_session(net):
    sub = c5(net)
    sub.connect5("s", clean=True, session_expiry_interval=60)
    sub.sub5(Subscription("t", 1))
    sub.send(Disconnect5())
    assert sub.closed
    pub = c5(net)
    pub.connect5("p")
    pub.send(Publish5("t", b"held", 1, packet_id=1))
    again = c5(net)
    ack = again.connect5("s", clean=False)
    assert ack.session_present
    assert [p.payload for p in publishes(again.take())] == [b"held"]
    again.send(Disconnect5())
    net.advance(61_000)
    assert net.broker.session_of("s") is None  # its own 60 s, not mqtt.session_expiry (2 h)


def test_session_expiry_zero_ends_with_connection(net):
    c = c5(net)
    c.connect5("z", clean=False)
    c.sub5(Subscription("t", 1))
    c.send(Disconnect5())
    assert net.broker.session_of("z") is None


def test_disconnect_may_not_raise_expiry_from_zero(net):
    c = c5(net)
    c.connect5("z")
    c.send(Disconnect5(properties=Properties(session_expiry_interval=10)))
    assert c.closed and net.broker.session_of("z") is None


def test_session_expiry_capped_by_config():
    net = Net(mqtt={"session_expiry": "1m"})
    c = c5(net)
    ack = c.connect5("s", session_expiry_interval=0xFFFFFFFF)
    assert ack.properties.session_expiry_interval == 60


# -- flow control and sizes --------------------------------------------------------------------------


def test_client_receive_maximum_bounds_the_window(net):
    sub = c5(net)
    sub.connect5("s", receive_maximum=2)
    sub.sub5(Subscription("t", 1))
    pub = net.client()
    pub.connect("p")
    for i in range(5):
        pub.send(Publish("t", b"%d" % i, 1, packet_id=i + 1))
    got = publishes(sub.take())
    assert [p.payload for p in got] == [b"0", b"1"]
    sub.send(Puback5(got[0].packet_id))
    assert [p.payload for p in publishes(sub.take())] == [b"2"]


def test_client_exceeding_server_receive_maximum_gets_0x93():
    net = Net(mqtt={"receive_maximum": 2})
    c = c5(net)
    c.connect5("q")
    for pid in (1, 2, 3):
        c.send(Publish5("t", b"x", 2, packet_id=pid))
    got = c.take()
    assert [type(p) for p in got] == [Pubrec5, Pubrec5, Disconnect5]
    assert got[-1].reason_code == RC.RECEIVE_MAXIMUM_EXCEEDED and c.closed


def test_message_over_client_maximum_packet_size_is_not_sent(net):
    sub = c5(net)
    sub.connect5("s", maximum_packet_size=100)
    sub.sub5(Subscription("t", 1))
    pub = net.client()
    pub.connect("p")
    pub.send(Publish("t", b"x" * 200, 1, packet_id=1), Publish("t", b"small", 1, packet_id=2))
    assert [p.payload for p in publishes(sub.take())] == [b"small"]
    assert net.broker.state.too_large_dropped == 1
    assert len(net.broker.session_of("s").inflight) == 1  # the small one; the big one left the window


def test_inbound_topic_alias(net):
    sub = c5(net)
    sub.connect5("s")
    sub.sub5(Subscription("long/topic", 0))
    pub = c5(net)
    pub.connect5("p")
    pub.send(Publish5("long/topic", b"1", properties=Properties(topic_alias=3)),
             Publish5("", b"2", properties=Properties(topic_alias=3)))
    got = publishes(sub.take())
    assert [(p.topic, p.payload) for p in got] == [("long/topic", b"1"), ("long/topic", b"2")]
    assert got[0].properties.topic_alias is None  # one hop only


def test_topic_alias_over_maximum_is_0x94(net):
    c = c5(net)
    c.connect5("p")
    c.send(Publish5("t", b"1", properties=Properties(topic_alias=net.settings.topic_alias_maximum + 1)))
    got = c.take()
    assert disconnects(got) == [RC.TOPIC_ALIAS_INVALID] and c.closed


def test_unknown_topic_alias_is_protocol_error(net):
    c = c5(net)
    c.connect5("p")
    c.send(Publish5("", b"1", properties=Properties(topic_alias=1)))
    assert disconnects(c.take()) == [RC.PROTOCOL_ERROR] and c.closed


# -- PUBLISH / SUBSCRIBE semantics -------------------------------------------------------------------


def test_puback_reason_codes(net):
    c = c5(net)
    c.connect5("p")
    c.send(Publish5("nobody/here", b"x", 1, packet_id=1))
    assert c.take() == [Puback5(1, RC.NO_MATCHING_SUBSCRIBERS)]
    c.send(Publish5("$SYS/x", b"x", 1, packet_id=2))
    assert c.take() == [Puback5(2, RC.NOT_AUTHORIZED)]
    c.send(Publish5("t", b"\xff", 1, packet_id=3, properties=Properties(payload_format_indicator=1)))
    assert c.take() == [Puback5(3, RC.PAYLOAD_FORMAT_INVALID)]
    c.sub5(Subscription("t", 1))
    c.send(Publish5("t", b"ok", 1, packet_id=4))
    got = c.take()
    assert Puback5(4, 0) in got


def test_suback_and_unsuback_reason_codes():
    net = Net(acl=(AclRule("subscribe", "test/nosubscribe", False),))
    c = c5(net)
    c.connect5("s")
    assert c.sub5(Subscription("test/nosubscribe", 1), Subscription("a/+", 2), Subscription("a/#/b", 0)) == (
        RC.UNSPECIFIED_ERROR, 2, RC.TOPIC_FILTER_INVALID)
    c.send(Unsubscribe5(2, ("a/+", "never")))
    assert c.take() == [Unsuback5(2, (0, RC.NO_SUBSCRIPTION_EXISTED))]


def test_no_local(net):
    c = c5(net)
    c.connect5("me")
    c.sub5(Subscription("t", 0, no_local=True))
    c.send(Publish5("t", b"own"))
    assert publishes(c.take()) == []
    other = net.client()
    other.connect("other")
    other.send(Publish("t", b"theirs"))
    assert [p.payload for p in publishes(c.take())] == [b"theirs"]


def test_retain_as_published_and_retain_handling(net):
    pub = net.client()
    pub.connect("p")
    pub.send(Publish("r", b"kept", 0, retain=True))
    rap = c5(net)
    rap.connect5("rap")
    rap.sub5(Subscription("r", 0, retain_as_published=True))
    assert [(p.payload, p.retain) for p in publishes(rap.take())] == [(b"kept", True)]  # replay: RETAIN 1
    plain = c5(net)
    plain.connect5("plain")
    plain.sub5(Subscription("r", 0, retain_handling=2))
    assert publishes(plain.take()) == []  # 2: never
    plain.sub5(Subscription("r", 0, retain_handling=1), pid=2)
    assert publishes(plain.take()) == []  # 1: only when new
    plain.sub5(Subscription("r2", 0, retain_handling=1), pid=3)
    pub.send(Publish("r", b"live", 0, retain=True))
    assert [(p.payload, p.retain) for p in publishes(rap.take())] == [(b"live", True)]
    assert [(p.payload, p.retain) for p in publishes(plain.take())] == [(b"live", False)]


def test_subscription_identifiers(net):
    c = c5(net)
    c.connect5("s")
    c.sub5(Subscription("a/+", 0), sub_id=7)
    c.sub5(Subscription("a/#", 1), pid=2, sub_id=9)
    c.sub5(Subscription("b", 0), pid=3)
    pub = net.client()
    pub.connect("p")
    pub.send(Publish("a/x", b"1"), Publish("b", b"2"))
    got = publishes(c.take())
    assert got[0].properties.subscription_identifiers == (7, 9)
    assert got[1].properties.subscription_identifiers == ()


def test_properties_forwarded_to_v5_and_dropped_for_v3(net):
    v5 = c5(net)
    v5.connect5("v5")
    v5.sub5(Subscription("t", 1))
    v3 = net.client()
    v3.connect("v3")
    v3.subscribe(("t", 1))
    pub = c5(net)
    pub.connect5("p")
    props = Properties(payload_format_indicator=1, content_type="text/plain", response_topic="reply/here",
                       correlation_data=b"\x01\x02", user_properties=(("trace", "1"), ("b", "2"), ("trace", "3")))
    pub.send(Publish5("t", b"hello", 1, packet_id=1, properties=props))
    got = publishes(v5.take())[0]
    assert got.properties == props
    plain = publishes(v3.take())[0]
    assert isinstance(plain, Publish) and plain.payload == b"hello"


def test_v3_publisher_to_v5_receiver(net):
    v5 = c5(net)
    v5.connect5("v5")
    v5.sub5(Subscription("t", 1))
    pub = net.client()
    pub.connect("p")
    pub.send(Publish("t", b"x", 1, packet_id=1))
    got = publishes(v5.take())
    assert len(got) == 1 and isinstance(got[0], Publish5) and got[0].properties == EMPTY_PROPERTIES


def test_message_expiry(net):
    sub = c5(net)
    sub.connect5("s", clean=False, session_expiry_interval=3600)
    sub.sub5(Subscription("t", 1))
    sub.send(Disconnect5())
    pub = c5(net)
    pub.connect5("p")
    pub.send(Publish5("t", b"short", 1, packet_id=1, properties=Properties(message_expiry_interval=2)),
             Publish5("t", b"long", 1, packet_id=2, properties=Properties(message_expiry_interval=100)))
    net.advance(5_000)
    again = c5(net)
    again.connect5("s", clean=False)
    got = publishes(again.take())
    assert [p.payload for p in got] == [b"long"]
    assert 94 <= got[0].properties.message_expiry_interval <= 95  # the remaining interval
    assert net.broker.state.expired_dropped == 1


# -- DISCONNECT and wills ----------------------------------------------------------------------------


def test_takeover_sends_0x8e(net):
    a = c5(net)
    a.connect5("same")
    b = c5(net)
    b.connect5("same")
    assert disconnects(a.take()) == [RC.SESSION_TAKEN_OVER] and a.closed


def test_keepalive_timeout_sends_0x8d(net):
    a = c5(net)
    a.connect5("k", keepalive=1)
    net.advance(3_000)
    assert disconnects(a.take()) == [RC.KEEP_ALIVE_TIMEOUT] and a.closed


def test_protocol_error_sends_its_reason_code(net):
    a = c5(net)
    a.connect5("k")
    a.send(Connect5("again"))
    assert disconnects(a.take()) == [RC.PROTOCOL_ERROR] and a.closed


def test_shutdown_sends_0x8b(net):
    a = c5(net)
    a.connect5("k")
    net.broker.shutdown()
    net.pump()
    assert disconnects(a.take()) == [RC.SERVER_SHUTTING_DOWN]


def test_disconnect_with_will_message(net):
    w = net.client()
    w.connect("w")
    w.subscribe(("will/#", 0))
    a = c5(net)
    a.connect5("a", will=Will5("will/a", b"bye", properties=Properties(content_type="text/plain")))
    a.send(Disconnect5(RC.DISCONNECT_WITH_WILL_MESSAGE))
    assert [p.payload for p in publishes(w.take())] == [b"bye"]
    b = c5(net)
    b.connect5("b", will=Will5("will/b", b"bye"))
    b.send(Disconnect5())
    assert publishes(w.take()) == []


def test_will_delay_cancelled_by_reconnect_and_published_after_it(net):
    w = c5(net)
    w.connect5("w")
    w.sub5(Subscription("will/#", 0))
    will = Will5("will/a", b"late", properties=Properties(will_delay_interval=5, content_type="x"))
    a = c5(net)
    a.connect5("a", clean=False, will=will, session_expiry_interval=600)
    a.drop()
    net.advance(2_000)
    assert publishes(w.take()) == []
    back = c5(net)
    back.connect5("a", clean=False, will=will, session_expiry_interval=600)
    net.advance(10_000)
    assert publishes(w.take()) == []  # cancelled by the reconnect (MQTT-3.1.3-9)
    back.drop()
    net.advance(6_000)
    got = publishes(w.take())
    assert [p.payload for p in got] == [b"late"] and got[0].properties.content_type == "x"


def test_will_delay_ends_with_the_session(net):
    w = c5(net)
    w.connect5("w")
    w.sub5(Subscription("will/#", 0))
    a = c5(net)
    a.connect5("a", will=Will5("will/a", b"now", properties=Properties(will_delay_interval=60)))
    a.drop()  # Session Expiry 0: the session ends at once, so does the delay
    assert [p.payload for p in publishes(w.take())] == [b"now"]


# -- shared subscriptions ----------------------------------------------------------------------------


def test_shared_subscription_one_member_each(net):
    members = []
    for name in ("m1", "m2"):
        m = c5(net)
        m.connect5(name)
        assert m.sub5(Subscription("$share/g/jobs/+", 1)) == (1,)
        members.append(m)
    plain = c5(net)
    plain.connect5("plain")
    plain.sub5(Subscription("jobs/+", 0))
    pub = net.client()
    pub.connect("p")
    for i in range(4):
        pub.send(Publish("jobs/x", b"%d" % i, 1, packet_id=i + 1))
    got = [[p.payload for p in publishes(m.take())] for m in members]
    assert sorted(got[0] + got[1]) == [b"0", b"1", b"2", b"3"] and got[0] and got[1]
    assert len(publishes(plain.take())) == 4
    assert "jobs/+" in net.broker.route_filters()


def test_shared_subscription_invalid_and_unsubscribe(net):
    m = c5(net)
    m.connect5("m")
    assert m.sub5(Subscription("$share/g+/x", 0), Subscription("$share/g", 0)) == (
        RC.TOPIC_FILTER_INVALID, RC.TOPIC_FILTER_INVALID)
    m.sub5(Subscription("$share/g/x", 0), pid=2)
    m.send(Unsubscribe5(3, ("$share/g/x",)))
    assert m.take() == [Unsuback5(3, (0,))]
    assert not net.broker.state.shared.groups


def test_shared_subscription_leaves_with_the_session(net):
    m = c5(net)
    m.connect5("m")
    m.sub5(Subscription("$share/g/x", 0))
    m.send(Disconnect5())
    assert not net.broker.state.shared.groups


# -- QoS 2 with v5 acks ------------------------------------------------------------------------------


def test_qos2_both_directions_v5(net):
    sub = c5(net)
    sub.connect5("s")
    sub.sub5(Subscription("t", 2))
    pub = c5(net)
    pub.connect5("p")
    pub.send(Publish5("t", b"x", 2, packet_id=5))
    assert pub.take() == [Pubrec5(5)]
    pub.send(Pubrel5(5))
    assert pub.take() == [Pubcomp5(5)]
    got = publishes(sub.take())
    sub.send(Pubrec5(got[0].packet_id))
    assert [type(p) for p in sub.take()] == [Pubrel5]
    sub.send(Pubcomp5(got[0].packet_id))
    assert not net.broker.session_of("s").inflight


def test_pubrec_failure_ends_the_exchange(net):
    sub = c5(net)
    sub.connect5("s")
    sub.sub5(Subscription("t", 2))
    pub = net.client()
    pub.connect("p")
    pub.send(Publish("t", b"x", 2, packet_id=1))
    got = publishes(sub.take())
    sub.send(Pubrec5(got[0].packet_id, RC.UNSPECIFIED_ERROR))
    assert sub.take() == [] and not net.broker.session_of("s").inflight


def test_v3_subscribe_still_0x80(net):
    c = net.client()
    c.connect("a")
    c.send(Subscribe(1, (("a/#/b", 0),)))
    assert c.take()[0].return_codes == (0x80,)


def test_level5_connect_byte_at_a_time(net):
    c = c5(net)
    data = encode(Connect5("slow", properties=Properties(receive_maximum=5)))
    for i in range(len(data)):
        c.send_raw(data[i:i + 1])
    got = c.take()
    assert isinstance(got[0], Connack5) and got[0].reason_code == 0
    assert net.broker.session_of("slow").inflight_cap == 5


# -- ingest, limits, $SYS, retained properties -------------------------------------------------------


def test_v5_ingest_acked_when_durable_and_rejected_with_negative_puback():
    from fanout.mqtt.hooks import IngestTicket, RecordingHooks

    hooks = RecordingHooks(intercept_ingest=True)
    net = Net(hooks=hooks)
    p = c5(net)
    p.connect5("plat", username="platform", password=b"platform")
    p.send(Publish5("$SDV-FANOUT/trigger", b"{}", 1, packet_id=11))
    assert p.take() == []
    (t,) = hooks.take(IngestTicket)
    assert net.broker.complete_publish("plat", 11, t.generation) is True
    net.pump()
    assert p.take() == [Puback5(11)]
    p.send(Publish5("$SDV-FANOUT/trigger", b"nope", 1, packet_id=12))
    (t,) = hooks.take(IngestTicket)
    assert net.broker.reject_publish("plat", 12, {"error": "trigger: not JSON", "field": "ids"}, t.generation)
    net.pump()
    got = p.take()
    assert got == [Puback5(12, RC.PAYLOAD_FORMAT_INVALID, Properties(reason_string="trigger: not JSON: ids"))]
    assert not p.closed  # MQTT 5: the connection stays
    p.send(Publish5("$SDV-FANOUT/data/x", b"b", 1, packet_id=13))
    (t,) = hooks.take(IngestTicket)
    net.broker.reject_publish("plat", 13, {"error": "unknown data id", "reason_code": RC.IMPLEMENTATION_SPECIFIC_ERROR})
    net.pump()
    assert p.take()[0].reason_code == RC.IMPLEMENTATION_SPECIFIC_ERROR


def test_v5_ingest_via_topic_alias_keeps_the_topic():
    from fanout.mqtt.hooks import IngestTicket, RecordingHooks

    hooks = RecordingHooks(intercept_ingest=True)
    net = Net(hooks=hooks)
    p = c5(net)
    p.connect5("plat", username="platform", password=b"platform")
    p.send(Publish5("$SDV-FANOUT/trigger", b"1", 1, packet_id=1, properties=Properties(topic_alias=2)),
           Publish5("", b"2", 1, packet_id=2, properties=Properties(topic_alias=2)))
    assert [t.topic for t in hooks.take(IngestTicket)] == ["$SDV-FANOUT/trigger"] * 2


def test_packet_too_large_from_v5_client_is_0x95():
    net = Net(mqtt={"max_packet_size": "1KiB"})
    c = c5(net)
    c.connect5("big")
    c.send(Publish5("t", b"x" * 2000))
    assert disconnects(c.take()) == [RC.PACKET_TOO_LARGE] and c.closed


def test_sys_counts_mqtt5_clients(net):
    a, b = c5(net), net.client()
    a.connect5("a")
    b.connect("b")
    snap = net.broker.sys.snapshot(net.now)
    assert snap["$SYS/broker/clients/mqtt5/connected"] == 1 and snap["$SYS/broker/clients/connected"] == 2
    a.send(Disconnect5())
    assert net.broker.sys.snapshot(net.now)["$SYS/broker/clients/mqtt5/connected"] == 0


def test_retained_message_keeps_its_properties_and_expires(net):
    pub = c5(net)
    pub.connect5("p")
    pub.send(Publish5("r/1", b"a", 0, retain=True, properties=Properties(content_type="text/x")),
             Publish5("r/2", b"b", 0, retain=True, properties=Properties(message_expiry_interval=1)))
    net.advance(2_000)
    sub = c5(net)
    sub.connect5("s")
    sub.sub5(Subscription("r/+", 0), sub_id=4)
    got = publishes(sub.take())
    assert [(p.topic, p.retain, p.properties.content_type, p.properties.subscription_identifiers) for p in got] == [
        ("r/1", True, "text/x", (4,))]
    v3 = net.client()
    v3.connect("v3")
    v3.subscribe(("r/+", 0))
    assert [p.payload for p in publishes(v3.take())] == [b"a"]


def test_offline_v5_session_receive_maximum_after_resume(net):
    sub = c5(net)
    sub.connect5("s", clean=False, session_expiry_interval=600)
    sub.sub5(Subscription("t", 1))
    sub.drop()
    pub = net.client()
    pub.connect("p")
    for i in range(4):
        pub.send(Publish("t", b"%d" % i, 1, packet_id=i + 1))
    again = c5(net)
    assert again.connect5("s", clean=False, receive_maximum=1).session_present
    assert [p.payload for p in publishes(again.take())] == [b"0"]


def test_outbound_topic_aliases(net):
    sub = c5(net)
    sub.connect5("s", topic_alias_maximum=1)
    sub.sub5(Subscription("t/+", 0))
    pub = net.client()
    pub.connect("p")
    pub.send(Publish("t/a", b"1"), Publish("t/a", b"2"), Publish("t/b", b"3"), Publish("t/a", b"4"))
    got = [(p.topic, p.properties.topic_alias, p.payload) for p in publishes(sub.take())]
    assert got == [("t/a", 1, b"1"), ("", 1, b"2"), ("t/b", None, b"3"), ("", 1, b"4")]


def test_no_outbound_aliases_when_off_or_not_announced():
    net = Net(mqtt={"send_topic_aliases": False})
    sub = c5(net)
    sub.connect5("s", topic_alias_maximum=5)
    sub.sub5(Subscription("t", 0))
    plain = c5(net)
    plain.connect5("plain")
    plain.sub5(Subscription("t", 0))
    pub = net.client()
    pub.connect("p")
    pub.send(Publish("t", b"1"), Publish("t", b"2"))
    for c in (sub, plain):
        assert [(p.topic, p.properties.topic_alias) for p in publishes(c.take())] == [("t", None)] * 2


def test_fanout_deliver_to_v5_vehicle_with_properties(net):
    from fanout.mqtt.hooks import DeliverStatus
    from fanout.mqtt.message5 import message_props

    v = c5(net)
    v.connect5("veh", receive_maximum=1)
    v.sub5(Subscription("agent/veh/#", 1))
    props = message_props(Properties(user_properties=(("trace", "t"),), message_expiry_interval=60), net.now)
    st = net.broker.deliver("veh", "agent/veh/proxy/request/r1", b"blob", 1, tag="r1", props=props)
    assert st is DeliverStatus.SENT
    assert net.broker.deliver("veh", "agent/veh/proxy/request/r2", b"blob", 1, tag="r2") is DeliverStatus.QUEUED
    net.pump()
    (got,) = publishes(v.take())
    assert got.properties.user_properties == (("trace", "t"),) and got.properties.message_expiry_interval == 60


def test_malformed_level5_connect_gets_connack_with_reason_code(net):
    raw = bytearray(encode(Connect5("a", properties=Properties(receive_maximum=5))))
    i = raw.index(b"\x21\x00\x05")  # Receive Maximum 5 -> 0: a protocol error (3.1.2.11.3)
    raw[i + 2] = 0
    c = c5(net)
    c.send_raw(bytes(raw))
    got = c.take()
    assert got == [Connack5(False, RC.PROTOCOL_ERROR)] and c.closed
    c3 = net.client()
    raw3 = bytearray(encode(Connect("a")))
    raw3[9] = 0x01  # reserved connect flag: malformed; a 3.1.1 client is only closed
    c3.send_raw(bytes(raw3))
    assert c3.take() == [] and c3.closed


def test_batch_path_bytes_equal_the_one_by_one_encoding(net):
    """Many MQTT 5 and 3.1.1 recipients of one message with properties: each PUBLISH decodes to the same
    message (the batch path splits one encoding around the packet id)."""
    big = "x" * 300  # a property block over 127 bytes: a two-byte Property Length
    v5s = [c5(net) for _ in range(3)]
    for i, c in enumerate(v5s):
        c.connect5(f"v{i}")
        c.sub5(Subscription("t", 1 if i else 0))
    v3 = net.client()
    v3.connect("v3")
    v3.subscribe(("t", 1))
    pub = c5(net)
    pub.connect5("p")
    props = Properties(content_type=big, user_properties=(("a", "b"),), message_expiry_interval=30)
    pub.send(Publish5("t", b"payload", 1, packet_id=1, properties=props))
    for i, c in enumerate(v5s):
        (m,) = publishes(c.take())
        assert (m.payload, m.qos, m.properties.content_type, m.properties.message_expiry_interval) == (
            b"payload", 1 if i else 0, big, 30)
    (m,) = publishes(v3.take())
    assert (m.payload, m.qos) == (b"payload", 1)


def test_local_publish_carries_properties_to_another_nodes_publish_local():
    from fanout.mqtt.hooks import LocalPublish, RecordingHooks

    hooks = RecordingHooks(forward_publishes=True)
    a = Net(hooks=hooks)
    pub = c5(a)
    pub.connect5("p")
    pub.send(Publish5("x/t", b"1", 0, properties=Properties(topic_alias=1, user_properties=(("k", "v"),),
                                                            message_expiry_interval=30)))
    (e,) = hooks.take(LocalPublish)
    assert e.properties.topic_alias is None and e.properties.user_properties == (("k", "v"),)
    b = Net()  # the other node
    sub = c5(b)
    sub.connect5("s")
    sub.sub5(Subscription("x/#", 0))
    assert b.broker.publish_local(e.topic, e.payload, e.qos, e.retain, properties=e.properties) == 1
    b.pump()
    (got,) = publishes(sub.take())
    assert got.properties.user_properties == (("k", "v"),) and got.properties.message_expiry_interval == 30


def test_v3_resubscribe_of_a_v5_session_drops_the_options(net):
    c = c5(net)
    c.connect5("mixed", clean=False, session_expiry_interval=600)
    c.sub5(Subscription("t", 0, no_local=True))
    c.drop()
    v3 = net.client()
    v3.connect("mixed", clean=False)
    v3.subscribe(("t", 0))
    v3.send(Publish("t", b"own"))
    assert [p.payload for p in publishes(v3.take())] == [b"own"]  # No Local went with the MQTT 5 subscription


def test_reason_strings_on_refusal_and_disconnect_within_maximum_packet_size():
    net = Net(mqtt={"anonymous_role": "none"}, users={})
    c = c5(net)
    c.send(Connect5("a"))
    (ack,) = c.take()
    assert ack.reason_code == RC.NOT_AUTHORIZED and ack.properties.reason_string == "authentication"
    net = Net()
    a = c5(net)
    a.connect5("same")
    small = c5(net)
    small.connect5("small", maximum_packet_size=8)
    c5(net).connect5("same")
    c5(net).connect5("small")
    (d,) = a.take()
    assert d.reason_code == RC.SESSION_TAKEN_OVER and d.properties.reason_string == "takeover"
    (d,) = small.take()
    assert d.reason_code == RC.SESSION_TAKEN_OVER and d.properties.reason_string is None  # would not fit in 8 bytes
