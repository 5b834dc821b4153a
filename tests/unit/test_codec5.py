"""MQTT 5 codec tests: round trips, short forms, negotiation, and golden bytes (a spec example, paho's)."""
from __future__ import annotations

import pytest

from fanout.mqtt.codec import (
    PacketReader, decode, encode, encode_auth5, encode_connack5, encode_disconnect5, encode_puback5,
    encode_pubcomp5, encode_publish5, encode_pubrec5, encode_pubrel5, encode_suback5, encode_unsuback5,
    encode_within,
)
from fanout.mqtt.errors import MalformedPacket, NeedData, PacketTooLarge, UnsupportedProtocol
from fanout.mqtt.packets import PINGREQ, PINGRESP, Connect, Puback, Publish, Will
from fanout.mqtt.packets5 import (
    Auth5, Connack5, Connect5, Disconnect5, Puback5, Pubcomp5, Publish5, Pubrec5, Pubrel5, Suback5,
    Subscribe5, Subscription, Unsuback5, Unsubscribe5, Will5,
)
from fanout.mqtt.properties import EMPTY_PROPERTIES, Properties
from fanout.mqtt.property_block import (
    encode_properties_body, message_expiry_property, subscription_identifier_property,
    topic_alias_property,
)
from fanout.mqtt.reason_codes import ReasonCode, is_error, reason_name

P = Properties
ALL_PACKETS_5 = [
    Connect5("car-1"),
    Connect5("", clean_start=False, keepalive=0),
    Connect5("c\u00e9", False, 65535, "u", b"\x00pw",
             Will5("wills/c\u00e9", b"bye", 2, True,
                   P(will_delay_interval=30, payload_format_indicator=1, message_expiry_interval=60,
                     content_type="text/plain", response_topic="r/t", correlation_data=b"\x01",
                     user_properties=(("k", "v"), ("k", "v2")))),
             P(session_expiry_interval=0xFFFFFFFF, receive_maximum=10, maximum_packet_size=1 << 20,
               topic_alias_maximum=0, request_response_information=1, request_problem_information=0,
               authentication_method="SCRAM-SHA-1", authentication_data=b"client-first",
               user_properties=(("a", "b"),))),
    Connect5("p", password=b"secret-without-user"),  # allowed in MQTT 5 (3.1.2.9)
    Connack5(),
    Connack5(True, 0, P(session_expiry_interval=10, receive_maximum=20, maximum_qos=1,
                        retain_available=0, maximum_packet_size=65536,
                        assigned_client_identifier="auto-1", topic_alias_maximum=10,
                        reason_string="ok", wildcard_subscription_available=1,
                        subscription_identifier_available=1, shared_subscription_available=0,
                        server_keep_alive=30, response_information="resp/", server_reference="other",
                        authentication_method="m", authentication_data=b"d")),
    Connack5(False, ReasonCode.BAD_USER_NAME_OR_PASSWORD, P(reason_string="nope")),
    Publish5("a/b", b"payload"),
    Publish5("a/b", b"", retain=True),
    Publish5("t", b"p" * 20000, 2, True, True, 65535),
    Publish5("", b"aliased", 1, False, False, 3, P(topic_alias=7)),
    Publish5("a/b", b"{}", 1, False, False, 9,
             P(payload_format_indicator=1, message_expiry_interval=3600, content_type="application/json",
               response_topic="reply/x", correlation_data=b"\x00\xff", topic_alias=1,
               subscription_identifiers=(1, 268_435_455, 300),
               user_properties=(("trace", "1"), ("campaign", "c"), ("trace", "2")))),
    Puback5(1), Puback5(2, ReasonCode.NO_MATCHING_SUBSCRIBERS),
    Puback5(3, ReasonCode.PAYLOAD_FORMAT_INVALID, P(reason_string="ids: not a list")),
    Puback5(4, 0, P(user_properties=(("x", "y"),))),
    Pubrec5(5), Pubrec5(6, ReasonCode.QUOTA_EXCEEDED, P(reason_string="q")),
    Pubrel5(7), Pubrel5(8, ReasonCode.PACKET_IDENTIFIER_NOT_FOUND),
    Pubcomp5(9), Pubcomp5(10, 0x92, P(reason_string="gone")),
    Subscribe5(11, (Subscription("a/+/c"), Subscription("#", 1, True, True, 2),
                    Subscription("$share/g/x", 2, False, False, 1)), P(subscription_identifiers=(5,))),
    Subscribe5(12, (Subscription(""),)),  # filter syntax is the broker's business (SUBACK 0x8F)
    Suback5(11, (0, 1, 2, 0x80, 0x83, 0x87, 0x8F, 0x91, 0x97, 0x9E, 0xA1, 0xA2), P(reason_string="r")),
    Unsubscribe5(13, ("a/+/c", "#"), P(user_properties=(("u", "1"),))),
    Unsuback5(13, (0x00, 0x11, 0x80, 0x83, 0x87, 0x8F, 0x91)),
    PINGREQ, PINGRESP,
    Disconnect5(), Disconnect5(ReasonCode.DISCONNECT_WITH_WILL_MESSAGE),
    Disconnect5(ReasonCode.SESSION_TAKEN_OVER,
                P(session_expiry_interval=0, reason_string="taken over", server_reference="b:1883")),
    Auth5(), Auth5(ReasonCode.CONTINUE_AUTHENTICATION,
                   P(authentication_method="SCRAM-SHA-1", authentication_data=b"server-first")),
    Auth5(ReasonCode.RE_AUTHENTICATE, P(authentication_method="m", reason_string="again")),
]


@pytest.mark.parametrize("pkt", ALL_PACKETS_5, ids=repr)
def test_round_trip(pkt):
    data = encode(pkt)
    assert decode(data, protocol_level=5) == (pkt, len(data))
    assert decode(bytearray(data), protocol_level=5) == (pkt, len(data))
    assert decode(memoryview(data), protocol_level=5) == (pkt, len(data))


@pytest.mark.parametrize("pkt", ALL_PACKETS_5, ids=repr)
def test_byte_at_a_time(pkt):
    data = encode(pkt)
    for i in range(len(data)):
        with pytest.raises(NeedData):
            decode(data[:i], protocol_level=5)
    reader = PacketReader(protocol_level=5)
    for i in range(len(data) - 1):
        assert reader.feed(data[i:i + 1]) == []
    assert reader.feed(data[-1:]) == [pkt]
    assert reader.buffered == 0


def test_stream_of_all_packets_in_one_chunk_and_trailing_bytes():
    data = b"".join(encode(p) for p in ALL_PACKETS_5)
    reader = PacketReader(protocol_level=5)
    assert reader.feed(data + data[:3]) == ALL_PACKETS_5
    assert reader.buffered == 3


# --- short forms (the shortest encoding the spec allows, and the other lengths it allows on input)

def test_acks_use_the_short_forms():
    assert encode(Puback5(5)) == encode_puback5(5) == b"\x40\x02\x00\x05"
    assert encode(Puback5(5, 0x10)) == encode_puback5(5, 0x10) == b"\x40\x03\x00\x05\x10"
    assert encode(Pubrec5(5)) == encode_pubrec5(5) == b"\x50\x02\x00\x05"
    assert encode(Pubrel5(5)) == encode_pubrel5(5) == b"\x62\x02\x00\x05"
    assert encode(Pubcomp5(5, 0x92)) == encode_pubcomp5(5, 0x92) == b"\x70\x03\x00\x05\x92"
    assert encode(Puback5(5, 0x80, P(reason_string="x"))) == \
        encode_puback5(5, 0x80, P(reason_string="x")) == b"\x40\x08\x00\x05\x80\x04\x1f\x00\x01x"
    assert encode(Disconnect5()) == encode_disconnect5() == b"\xe0\x00"
    assert encode(Disconnect5(0x8E)) == encode_disconnect5(0x8E) == b"\xe0\x01\x8e"
    assert encode(Auth5()) == encode_auth5() == b"\xf0\x00"
    method = P(authentication_method="m")
    assert encode(Auth5(0x18, method)) == encode_auth5(0x18, method) == b"\xf0\x06\x18\x04\x15\x00\x01m"


@pytest.mark.parametrize("data, pkt", [
    (b"\x40\x02\x00\x05", Puback5(5)),
    (b"\x40\x03\x00\x05\x00", Puback5(5)),
    (b"\x40\x04\x00\x05\x00\x00", Puback5(5)),
    (b"\x40\x04\x00\x05\x97\x00", Puback5(5, 0x97)),
    (b"\x62\x03\x00\x05\x92", Pubrel5(5, 0x92)),
    (b"\xe0\x00", Disconnect5()),
    (b"\xe0\x01\x04", Disconnect5(4)),
    (b"\xe0\x02\x00\x00", Disconnect5()),
    (b"\xf0\x00", Auth5()),
    (b"\xf0\x06\x18\x04\x15\x00\x01m", Auth5(0x18, P(authentication_method="m"))),
])
def test_all_allowed_lengths_decode(data, pkt):
    assert decode(data, protocol_level=5) == (pkt, len(data))


def test_short_puback_is_interned_like_3_1_1():
    a = PacketReader(protocol_level=5).feed(b"\x40\x02\x00\x05")[0]
    b = PacketReader(protocol_level=5).feed(b"\x40\x02\x00\x05")[0]
    assert a is b and a == Puback5(5)


# --- fast encoders and per-subscriber properties

def test_fast_encoders_match_encode():
    props = P(reason_string="r", user_properties=(("a", "b"),))
    assert encode_connack5(True, 0, props) == encode(Connack5(True, 0, props))
    assert encode_connack5(True, 0x86) == encode(Connack5(False, 0x86))  # MQTT-3.2.2-6
    assert encode_suback5(3, (1, 0x80), props) == encode(Suback5(3, (1, 0x80), props))
    assert encode_unsuback5(3, [0, 0x11]) == encode(Unsuback5(3, (0, 0x11)))
    assert encode_disconnect5(0x8B, props) == encode(Disconnect5(0x8B, props))
    for qos, pid in ((0, None), (1, 1), (2, 65535)):
        pkt = Publish5("t/\u00e9", b"x" * 200, qos, True, qos > 0, pid, P(content_type="c"))
        assert encode_publish5(pkt.topic, pkt.payload, qos, True, qos > 0, pid,
                               encode_properties_body(pkt.properties)) == encode(pkt)
        assert encode_publish5(pkt.topic.encode(), b"", qos, False, False, pid) == \
            encode(Publish5(pkt.topic, b"", qos, False, False, pid))


def test_per_subscriber_properties_prepend_to_a_shared_body():
    shared = encode_properties_body(P(content_type="application/octet-stream",
                                      user_properties=(("trace", "t1"),)))
    body = message_expiry_property(42) + subscription_identifier_property(300) + \
        topic_alias_property(2) + shared
    pkt, _ = decode(encode_publish5("", b"blob", 1, False, False, 7, body), protocol_level=5)
    assert pkt == Publish5("", b"blob", 1, False, False, 7, P(
        message_expiry_interval=42, subscription_identifiers=(300,), topic_alias=2,
        content_type="application/octet-stream", user_properties=(("trace", "t1"),)))


@pytest.mark.parametrize("size", [0, 127, 128, 16383, 16384, 70000])
def test_publish_with_large_properties(size):
    pkt = Publish5("t", b"p", 1, False, False, 1, P(correlation_data=b"c" * min(size, 65535),
                                                      user_properties=(("k", "v" * max(0, size - 65535)),)))
    assert decode(encode(pkt), protocol_level=5)[0] == pkt


# --- the reader's protocol levels

def test_default_reader_is_3_1_1_and_still_refuses_level_5():
    reader = PacketReader()
    assert reader.protocol_level == 4
    with pytest.raises(UnsupportedProtocol) as exc:
        reader.feed(encode(Connect5("c")))
    assert exc.value.protocol_level == 5 and exc.value.return_code == 1
    assert exc.value.reason_code == ReasonCode.UNSUPPORTED_PROTOCOL_VERSION
    with pytest.raises(MalformedPacket):  # AUTH is a reserved packet type in 3.1.1
        PacketReader().feed(b"\xf0\x00")


@pytest.mark.parametrize("connect, follow, level", [
    (Connect("c", will=Will("w", b"x")), [Publish("a", b"1", 1, packet_id=1), Puback(2)], 4),
    (Connect5("c", properties=P(receive_maximum=5)),
     [Publish5("a", b"1", 1, packet_id=1, properties=P(user_properties=(("k", "v"),))), Puback5(2, 0x10),
      Auth5(0x19, P(authentication_method="m"))], 5),
])
def test_negotiating_reader_takes_the_level_of_the_connect(connect, follow, level):
    data = b"".join(encode(p) for p in [connect, *follow])
    for cut in range(len(data) + 1):
        reader = PacketReader(protocol_level=None)
        assert reader.protocol_level is None
        out = reader.feed(data[:cut]) + reader.feed(data[cut:])
        assert out == [connect, *follow]
        assert reader.protocol_level == level
    assert decode(data, protocol_level=None) == (connect, len(encode(connect)))


def test_negotiating_reader_refuses_other_levels():
    data = bytearray(encode(Connect("c")))
    data[8] = 3  # protocol level byte
    with pytest.raises(UnsupportedProtocol) as exc:
        PacketReader(protocol_level=None).feed(bytes(data))
    assert exc.value.protocol_level == 3 and exc.value.reason_code == 0x84


def test_v5_reader_decodes_a_connect_by_its_own_level():
    reader = PacketReader(protocol_level=5)
    assert reader.feed(encode(Connect("old")) + encode(Connect5("new"))) == [Connect("old"), Connect5("new")]
    assert reader.protocol_level == 5


def test_unknown_protocol_level_argument():
    with pytest.raises(ValueError):
        PacketReader(protocol_level=3)
    with pytest.raises(ValueError):
        decode(b"\xc0\x00", protocol_level=6)


def test_packet_too_large_carries_0x95():
    with pytest.raises(PacketTooLarge) as exc:
        PacketReader(100, protocol_level=5).feed(b"\x30\xff\x01")
    assert exc.value.reason_code == ReasonCode.PACKET_TOO_LARGE


# --- golden bytes

def test_spec_connect_variable_header_example():
    # MQTT 5.0 section 3.1.2.12, figure 3-6: protocol name "MQTT", version 5, flags 0xCE (user name,
    # password, will QoS 1, will flag, clean start), keep alive 10, properties length 5 holding a
    # Session Expiry Interval of 10.
    pkt = Connect5("", True, 10, "u", b"p", Will5("w", b"", 1), P(session_expiry_interval=10))
    data = encode(pkt)
    assert data[2:18] == bytes.fromhex("0004 4d515454 05 ce 000a 05 11 0000000a".replace(" ", ""))
    assert decode(data, protocol_level=5)[0] == pkt


def test_golden_bytes_of_a_publish_with_properties():
    pkt = Publish5("a/b", b"hi", 1, False, False, 10,
                   P(payload_format_indicator=1, message_expiry_interval=60, topic_alias=2,
                     user_properties=(("k", "v"),)))
    assert encode(pkt) == bytes.fromhex(
        "32 1b 0003 612f62 000a 11 0101 020000003c 230002 2600016b000176 6869".replace(" ", ""))


# --- maximum packet size trimming

def test_encode_within_keeps_a_packet_that_fits():
    pkt = Puback5(1, 0x80, P(reason_string="why", user_properties=(("a", "b"),)))
    assert encode_within(pkt, None) == encode(pkt)
    assert encode_within(pkt, len(encode(pkt))) == encode(pkt)


def test_encode_within_drops_reason_string_then_user_properties_from_the_end():
    users = (("a", "1"), ("b", "2"), ("c", "3"))
    pkt = Puback5(1, 0x80, P(reason_string="x" * 50, user_properties=users))
    no_reason = Puback5(1, 0x80, P(user_properties=users))
    assert decode(encode_within(pkt, len(encode(no_reason))), protocol_level=5)[0] == no_reason
    two = Puback5(1, 0x80, P(user_properties=users[:2]))
    assert decode(encode_within(pkt, len(encode(no_reason)) - 1), protocol_level=5)[0] == two
    assert decode(encode_within(pkt, 5), protocol_level=5)[0] == Puback5(1, 0x80)
    with pytest.raises(ValueError):
        encode_within(pkt, 4)


@pytest.mark.parametrize("pkt", [
    Connack5(False, 0x87, P(reason_string="r" * 40)), Suback5(1, (0,), P(reason_string="r" * 40)),
    Unsuback5(1, (0,), P(reason_string="r" * 40)), Disconnect5(0x8B, P(reason_string="r" * 40)),
    Auth5(0x18, P(authentication_method="m", reason_string="r" * 40)),
    Pubrec5(1, 0x97, P(reason_string="r" * 40)), Pubrel5(1, 0, P(reason_string="r" * 40)),
    Pubcomp5(1, 0, P(reason_string="r" * 40)),
])
def test_encode_within_trims_every_packet_with_a_reason_string(pkt):
    data = encode_within(pkt, 30)
    assert len(data) <= 30
    assert decode(data, protocol_level=5)[0].properties.reason_string is None


def test_encode_within_never_trims_a_publish():
    pkt = Publish5("t", b"x" * 100, properties=P(user_properties=(("a", "b"),)))
    with pytest.raises(ValueError):
        encode_within(pkt, 50)


# --- reason codes

def test_reason_code_names():
    assert ReasonCode.NORMAL_DISCONNECTION == ReasonCode.SUCCESS == ReasonCode.GRANTED_QOS_0 == 0
    assert reason_name(0x8E) == "SESSION_TAKEN_OVER"
    assert reason_name(0x7F) == "0x7f"
    assert is_error(0x80) and not is_error(0x10)
    assert len({int(c) for c in ReasonCode}) == 43


def test_properties_repr_and_helpers():
    props = P(topic_alias=3, user_properties=[("k", "v")])
    assert repr(props) == "Properties(topic_alias=3, user_properties=(('k', 'v'),))"
    assert props.set_names() == ["topic_alias", "user_properties"]
    assert props.replace(topic_alias=None) == P(user_properties=(("k", "v"),))
    assert P() == EMPTY_PROPERTIES and EMPTY_PROPERTIES.set_names() == []
