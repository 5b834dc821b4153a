"""MQTT 5 codec rules as tables: property placement and repetition, value rules, reason codes per packet,
malformed and protocol-error packets (each with the reason code a server answers), constructor checks."""
from __future__ import annotations

import pytest

from fanout.mqtt.codec import decode, encode_varint
from fanout.mqtt.errors import MalformedPacket, ProtocolError
from fanout.mqtt.packets import Will
from fanout.mqtt.packets5 import (
    Auth5, Connack5, Connect5, Disconnect5, Puback5, Pubcomp5, Publish5, Pubrec5, Pubrel5, Suback5,
    Subscribe5, Subscription, Unsuback5, Unsubscribe5, Will5,
)
from fanout.mqtt.properties import PROPERTY_SPECS, DataType, Properties, PropertyHolder, PropertyId
from fanout.mqtt.reason_codes import (
    AUTH_REASON_CODES, CONNACK_REASON_CODES, DISCONNECT_REASON_CODES, PUBACK_REASON_CODES,
    PUBCOMP_REASON_CODES, PUBREC_REASON_CODES, PUBREL_REASON_CODES, SUBACK_REASON_CODES,
    UNSUBACK_REASON_CODES,
)

H = PropertyHolder
T = DataType
MALFORMED, PROTOCOL = 0x81, 0x82


def frame(first: int, body: bytes) -> bytes:
    return bytes((first,)) + encode_varint(len(body)) + body


def block(raw: bytes) -> bytes:
    return encode_varint(len(raw)) + raw


def packet_with(holder: PropertyHolder, raw_props: bytes) -> bytes:
    """A valid packet of ``holder``'s type whose (only) property block holds ``raw_props``."""
    b = block(raw_props)
    connect_head = b"\x00\x04MQTT\x05"
    return {
        H.CONNECT: lambda: frame(0x10, connect_head + b"\x02\x00\x3c" + b + b"\x00\x01c"),
        H.WILL: lambda: frame(0x10, connect_head + b"\x06\x00\x3c\x00\x00\x01c" + b
                              + b"\x00\x01w\x00\x00"),
        H.CONNACK: lambda: frame(0x20, b"\x00\x00" + b),
        H.PUBLISH: lambda: frame(0x30, b"\x00\x01t" + b + b"payload"),
        H.PUBACK: lambda: frame(0x40, b"\x00\x01\x00" + b),
        H.PUBREC: lambda: frame(0x50, b"\x00\x01\x00" + b),
        H.PUBREL: lambda: frame(0x62, b"\x00\x01\x00" + b),
        H.PUBCOMP: lambda: frame(0x70, b"\x00\x01\x00" + b),
        H.SUBSCRIBE: lambda: frame(0x82, b"\x00\x01" + b + b"\x00\x01t\x00"),
        H.SUBACK: lambda: frame(0x90, b"\x00\x01" + b + b"\x00"),
        H.UNSUBSCRIBE: lambda: frame(0xA2, b"\x00\x01" + b + b"\x00\x01t"),
        H.UNSUBACK: lambda: frame(0xB0, b"\x00\x01" + b + b"\x00"),
        H.DISCONNECT: lambda: frame(0xE0, b"\x00" + b),
        H.AUTH: lambda: frame(0xF0, b"\x00" + b),
    }[holder]()


def props_of(holder: PropertyHolder, data: bytes) -> Properties:
    pkt, used = decode(data, protocol_level=5)
    assert used == len(data)
    return pkt.will.properties if holder is H.WILL else pkt.properties


# A valid wire value and its decoded form per data type (Response Topic needs a topic name, which "r" is).
SAMPLE = {
    T.BYTE: (b"\x01", 1), T.TWO_BYTE_INTEGER: (b"\x00\x01", 1),
    T.FOUR_BYTE_INTEGER: (b"\x00\x00\x00\x01", 1), T.VARIABLE_BYTE_INTEGER: (b"\x81\x01", 129),
    T.UTF8_STRING: (b"\x00\x01r", "r"), T.BINARY_DATA: (b"\x00\x01b", b"b"),
    T.UTF8_STRING_PAIR: (b"\x00\x01k\x00\x01v", ("k", "v")),
}
OTHER = {
    T.BYTE: (b"\x00", 0), T.TWO_BYTE_INTEGER: (b"\xff\xff", 0xFFFF),
    T.FOUR_BYTE_INTEGER: (b"\xff\xff\xff\xff", 0xFFFF_FFFF), T.VARIABLE_BYTE_INTEGER: (b"\x02", 2),
    T.UTF8_STRING: (b"\x00\x03s\xc3\xa9", "s\u00e9"), T.BINARY_DATA: (b"\x00\x00", b""),
    T.UTF8_STRING_PAIR: (b"\x00\x01k\x00\x00", ("k", "")),
}
METHOD = b"\x15\x00\x01m"  # Authentication Method, which Authentication Data needs


def raw_property(spec, sample=SAMPLE) -> bytes:
    return bytes((spec.id,)) + sample[spec.data_type][0]


def expected(spec, sample=SAMPLE):
    value = sample[spec.data_type][1]
    return (value,) if spec.data_type in (T.VARIABLE_BYTE_INTEGER, T.UTF8_STRING_PAIR) else value


ALL_HOLDERS = list(H)
PLACEMENT = [(s, h) for s in PROPERTY_SPECS for h in ALL_HOLDERS]


def _prefix(spec, holder) -> bytes:
    # Authentication Data needs an Authentication Method, and so does every AUTH with properties.
    if spec.id == PropertyId.AUTHENTICATION_METHOD:
        return b""
    needs_method = spec.id == PropertyId.AUTHENTICATION_DATA and holder in spec.holders
    return METHOD if needs_method or holder is H.AUTH else b""


@pytest.mark.parametrize("spec, holder", PLACEMENT, ids=lambda x: getattr(x, "name", str(x)))
def test_property_placement(spec, holder):
    data = packet_with(holder, _prefix(spec, holder) + raw_property(spec))
    if holder in spec.holders:
        assert getattr(props_of(holder, data), spec.name) == expected(spec)
    else:
        # 2.2.2.2: "A Control Packet which contains an Identifier which is not valid for its packet
        # type ... is a Malformed Packet."
        with pytest.raises(MalformedPacket, match="not valid in") as exc:
            decode(data, protocol_level=5)
        assert exc.value.reason_code == MALFORMED


ALLOWED = [(s, h) for s in PROPERTY_SPECS for h in ALL_HOLDERS if h in s.holders]


@pytest.mark.parametrize("spec, holder", ALLOWED, ids=lambda x: getattr(x, "name", str(x)))
def test_property_repetition(spec, holder):
    data = packet_with(holder, _prefix(spec, holder) + raw_property(spec) + raw_property(spec, OTHER))
    if holder in spec.repeat_in:
        assert getattr(props_of(holder, data), spec.name) == expected(spec) + expected(spec, OTHER)
    else:
        with pytest.raises(ProtocolError, match="more than once") as exc:
            decode(data, protocol_level=5)
        assert type(exc.value) is ProtocolError and exc.value.reason_code == PROTOCOL


def test_repeats_allowed_only_for_user_property_and_publish_subscription_identifiers():
    repeatable = {(s.name, h) for s in PROPERTY_SPECS for h in s.repeat_in}
    assert {n for n, _ in repeatable} == {"user_properties", "subscription_identifiers"}
    assert {h for n, h in repeatable if n == "subscription_identifiers"} == {H.PUBLISH}


def test_user_properties_keep_wire_order_with_repeated_names():
    pairs = [("b", "1"), ("a", "2"), ("b", "3"), ("", ""), ("\u00e9", "\U0001F600")]
    raw = b"".join(b"\x26" + encode_utf8(k) + encode_utf8(v) for k, v in pairs)
    for holder in ALL_HOLDERS:
        data = packet_with(holder, (METHOD if holder is H.AUTH else b"") + raw)
        assert props_of(holder, data).user_properties == tuple(pairs)


def encode_utf8(s: str) -> bytes:
    b = s.encode()
    return len(b).to_bytes(2, "big") + b


@pytest.mark.parametrize("raw, holder, code", [
    (b"\x01\x02", H.PUBLISH, PROTOCOL),  # Payload Format Indicator 2
    (b"\x01\x02", H.WILL, PROTOCOL),
    (b"\x17\x02", H.CONNECT, PROTOCOL),  # Request Problem Information 2
    (b"\x19\xff", H.CONNECT, PROTOCOL),  # Request Response Information
    (b"\x24\x02", H.CONNACK, PROTOCOL),  # Maximum QoS 2 (3.2.2.3.4: only 0 or 1)
    (b"\x25\x02", H.CONNACK, PROTOCOL),  # Retain Available
    (b"\x28\x02", H.CONNACK, PROTOCOL), (b"\x29\x02", H.CONNACK, PROTOCOL),
    (b"\x2a\x02", H.CONNACK, PROTOCOL),
    (b"\x21\x00\x00", H.CONNECT, PROTOCOL),  # Receive Maximum 0
    (b"\x21\x00\x00", H.CONNACK, PROTOCOL),
    (b"\x27\x00\x00\x00\x00", H.CONNECT, PROTOCOL),  # Maximum Packet Size 0
    (b"\x0b\x00", H.SUBSCRIBE, PROTOCOL),  # Subscription Identifier 0
    (b"\x0b\x00", H.PUBLISH, PROTOCOL),
    (b"\x23\x00\x00", H.PUBLISH, 0x94),  # Topic Alias 0 -> Topic Alias invalid
    (b"\x08\x00\x03a/#", H.PUBLISH, PROTOCOL),  # Response Topic with a wildcard (MQTT-3.3.2-14)
    (b"\x08\x00\x03a/+", H.WILL, PROTOCOL),
    (b"\x08\x00\x00", H.PUBLISH, PROTOCOL),  # empty Response Topic
    (b"\x16\x00\x01d", H.CONNECT, PROTOCOL),  # Authentication Data without a Method
    (b"\x16\x00\x01d", H.AUTH, PROTOCOL),
])
def test_forbidden_values_are_protocol_errors(raw, holder, code):
    with pytest.raises(ProtocolError) as exc:
        decode(packet_with(holder, raw), protocol_level=5)
    assert not isinstance(exc.value, MalformedPacket)
    assert exc.value.reason_code == code


UNDEFINED_IDS = sorted(set(range(0x80)) - {s.id for s in PROPERTY_SPECS})


@pytest.mark.parametrize("ident", UNDEFINED_IDS)
def test_unknown_property_identifiers_are_malformed(ident):
    with pytest.raises(MalformedPacket, match="unknown property") as exc:
        decode(packet_with(H.PUBLISH, bytes((ident, 0))), protocol_level=5)
    assert exc.value.reason_code == MALFORMED


@pytest.mark.parametrize("raw", [
    b"\x80\x01\x00",  # a two-byte identifier: none is defined in MQTT 5.0
    b"\x02\x00\x00\x00",  # Message Expiry Interval cut off by the property length
    b"\x23\x00",  # Topic Alias cut off
    b"\x01",  # Payload Format Indicator without its byte
    b"\x03\x00\x05ab",  # Content Type longer than the block
    b"\x09\x00\x05ab",  # Correlation Data longer than the block
    b"\x0b\x80\x80",  # Subscription Identifier varint cut off
    b"\x0b\x80\x80\x80\x80\x01",  # Subscription Identifier varint of 5 bytes
    b"\x26\x00\x01k",  # User Property without its value
    b"\x03\x00\x02\xc3\x28",  # Content Type: ill-formed UTF-8 (MQTT-1.5.4-1)
    b"\x03\x00\x03\xed\xa0\x80",  # Content Type: an encoded surrogate U+D800 (MQTT-1.5.4-1)
    b"\x03\x00\x01\x00",  # Content Type: U+0000 (MQTT-1.5.4-2)
    b"\x26\x00\x01\x00\x00\x01v",  # User Property name U+0000
    b"\x26\x00\x01k\x00\x01\xff",  # User Property value ill-formed
])
def test_ill_formed_properties_are_malformed(raw):
    with pytest.raises(MalformedPacket) as exc:
        decode(packet_with(H.PUBLISH, raw), protocol_level=5)
    assert exc.value.reason_code == MALFORMED


@pytest.mark.parametrize("data", [
    b"\x30\x05\x00\x01t\x05\x00",  # property length past the packet end
    b"\x30\x03\x00\x01t",  # property length missing (MQTT-2.2.2-1)
    b"\x30\x08\x00\x01t\xff\xff\xff\xff\x7f",  # property length varint of 5 bytes
    b"\x20\x02\x00\x00",  # CONNACK without property length
    b"\xe0\x03\x00\x00\xff",  # DISCONNECT: bytes after the properties
    b"\x40\x05\x00\x01\x00\x00\xff",  # PUBACK: bytes after the properties
])
def test_property_block_framing_errors_are_malformed(data):
    with pytest.raises(MalformedPacket):
        decode(data, protocol_level=5)


# --- reason codes per packet: MUST use one of the packet's codes

def _with_code(kind: str, code: int) -> bytes:
    return {
        "CONNACK": frame(0x20, bytes((0, code, 0))),
        "PUBACK": frame(0x40, bytes((0, 1, code))),
        "PUBREC": frame(0x50, bytes((0, 1, code))),
        "PUBREL": frame(0x62, bytes((0, 1, code))),
        "PUBCOMP": frame(0x70, bytes((0, 1, code, 0))),
        "SUBACK": frame(0x90, bytes((0, 1, 0, 0, code))),
        "UNSUBACK": frame(0xB0, bytes((0, 1, 0, code))),
        "DISCONNECT": frame(0xE0, bytes((code,))),
        "AUTH": frame(0xF0, bytes((code,)) + block(METHOD)),
    }[kind]


CODE_SETS = {
    "CONNACK": CONNACK_REASON_CODES, "PUBACK": PUBACK_REASON_CODES, "PUBREC": PUBREC_REASON_CODES,
    "PUBREL": PUBREL_REASON_CODES, "PUBCOMP": PUBCOMP_REASON_CODES, "SUBACK": SUBACK_REASON_CODES,
    "UNSUBACK": UNSUBACK_REASON_CODES, "DISCONNECT": DISCONNECT_REASON_CODES, "AUTH": AUTH_REASON_CODES,
}
CONSTRUCTORS = {
    "CONNACK": lambda c: Connack5(False, c), "PUBACK": lambda c: Puback5(1, c),
    "PUBREC": lambda c: Pubrec5(1, c), "PUBREL": lambda c: Pubrel5(1, c),
    "PUBCOMP": lambda c: Pubcomp5(1, c), "SUBACK": lambda c: Suback5(1, (0, c)),
    "UNSUBACK": lambda c: Unsuback5(1, (c,)), "DISCONNECT": Disconnect5,
    "AUTH": lambda c: Auth5(c, Properties(authentication_method="m")),
}


@pytest.mark.parametrize("kind", sorted(CODE_SETS))
def test_reason_codes_per_packet(kind):
    allowed = CODE_SETS[kind]
    for code in range(256):
        data = _with_code(kind, code)
        if code in allowed:
            pkt = decode(data, protocol_level=5)[0]
            assert code in getattr(pkt, "reason_codes", (getattr(pkt, "reason_code", None),))
            assert CONSTRUCTORS[kind](code) is not None
        else:
            with pytest.raises(ProtocolError, match="not a") as exc:
                decode(data, protocol_level=5)
            assert exc.value.reason_code == PROTOCOL
            with pytest.raises(ValueError):
                CONSTRUCTORS[kind](code)


def test_reason_code_list_sizes_match_the_spec():
    sizes = {k: len(v) for k, v in CODE_SETS.items()}
    assert sizes == {"CONNACK": 22, "PUBACK": 9, "PUBREC": 9, "PUBREL": 2, "PUBCOMP": 2, "SUBACK": 12,
                     "UNSUBACK": 7, "DISCONNECT": 29, "AUTH": 3}


# --- packet rules

CONNECT_HEAD = b"\x00\x04MQTT\x05"


@pytest.mark.parametrize("data, code", [
    (frame(0x10, CONNECT_HEAD + b"\x03\x00\x3c\x00\x00\x01c"), MALFORMED),  # reserved flag (MQTT-3.1.2-3)
    (frame(0x10, CONNECT_HEAD + b"\x1e\x00\x3c\x00\x00\x01c\x00\x00\x01w\x00\x00"), MALFORMED),  # will QoS 3
    (frame(0x10, CONNECT_HEAD + b"\x0a\x00\x3c\x00\x00\x01c"), MALFORMED),  # will QoS without will flag
    (frame(0x10, CONNECT_HEAD + b"\x22\x00\x3c\x00\x00\x01c"), MALFORMED),  # will retain without flag
    (frame(0x10, CONNECT_HEAD + b"\x02\x00\x3c\x00\x00\x01cX"), MALFORMED),  # bytes after the payload
    (frame(0x10, CONNECT_HEAD + b"\x02\x00\x3c"), MALFORMED),  # property length missing
    (frame(0x10, CONNECT_HEAD + b"\x82\x00\x3c\x00\x00\x01c"), MALFORMED),  # user name flag, no name
    (frame(0x10, CONNECT_HEAD + b"\x06\x00\x3c\x00\x00\x01c\x00\x00\x03a/#\x00\x00"), PROTOCOL),
    (frame(0x10, CONNECT_HEAD + b"\x06\x00\x3c\x00\x00\x01c\x00\x00\x00\x00\x00"), PROTOCOL),
    (frame(0x20, b"\x02\x00\x00"), MALFORMED),  # CONNACK reserved acknowledge flag (MQTT-3.2.2-1)
    (frame(0x20, b"\x01\x80\x00"), PROTOCOL),  # session present with a refusal (MQTT-3.2.2-6)
    (frame(0x30, b"\x00\x00\x00"), PROTOCOL),  # empty topic without a Topic Alias
    (frame(0x30, b"\x00\x03a/#\x00"), PROTOCOL),  # wildcard in topic name (MQTT-3.3.2-2)
    (frame(0x30, b"\x00\x03a/+\x00"), PROTOCOL),
    (frame(0x30, b"\x00\x03a\x00b\x00"), MALFORMED),  # U+0000 in topic
    (frame(0x30, b"\x00\x02\xc3\x28\x00"), MALFORMED),  # ill-formed UTF-8 topic
    (frame(0x32, b"\x00\x01t\x00\x00\x00"), MALFORMED),  # packet identifier 0
    (frame(0x32, b"\x00\x01t\x00"), MALFORMED),  # packet identifier cut off
    (frame(0x82, b"\x00\x01\x00\x00\x01t\x40"), MALFORMED),  # reserved option bits (MQTT-3.8.3-5)
    (frame(0x82, b"\x00\x01\x00\x00\x01t\x80"), MALFORMED),
    (frame(0x82, b"\x00\x01\x00\x00\x01t\x03"), PROTOCOL),  # maximum QoS 3
    (frame(0x82, b"\x00\x01\x00\x00\x01t\x30"), PROTOCOL),  # Retain Handling 3
    (frame(0x82, b"\x00\x01\x00\x00\x0a$share/g/t\x04"), PROTOCOL),  # No Local shared (MQTT-3.8.3-4)
    (frame(0x82, b"\x00\x01\x00"), PROTOCOL),  # SUBSCRIBE without filters (MQTT-3.8.3-2)
    (frame(0x82, b"\x00\x01\x00\x00\x01t"), MALFORMED),  # options byte missing
    (frame(0x82, b"\x00\x00\x00\x00\x01t\x00"), MALFORMED),  # packet identifier 0
    (frame(0xA2, b"\x00\x01\x00"), PROTOCOL),  # UNSUBSCRIBE without filters (MQTT-3.10.3-2)
    (frame(0x90, b"\x00\x01\x00"), PROTOCOL),  # SUBACK without reason codes
    (frame(0xB0, b"\x00\x01\x00"), PROTOCOL),  # UNSUBACK without reason codes
    (frame(0x40, b"\x00"), MALFORMED),  # PUBACK too short
    (frame(0x40, b"\x00\x00"), MALFORMED),  # PUBACK packet identifier 0
    (frame(0x50, b"\x00\x00\x10"), MALFORMED),
    (frame(0xC0, b"\x00"), MALFORMED),  # PINGREQ with a body
    (b"\xf1\x00", MALFORMED),  # AUTH reserved flags
    (b"\xf0\x01\x19", PROTOCOL),  # AUTH without Authentication Method (3.15.2.2.2)
    (b"\xf0\x02\x18\x00", PROTOCOL),
    (b"\xf0\x02\x00\x00", PROTOCOL),  # only the remaining-length-0 success may omit it
    (b"\x60\x02\x00\x01", MALFORMED),  # PUBREL flags must be 0b0010 (MQTT-3.6.1-1)
    (b"\x36\x03\x00\x01t", MALFORMED),  # PUBLISH QoS 3 (MQTT-3.3.1-4)
])
def test_packet_rules(data, code):
    with pytest.raises(ProtocolError) as exc:
        decode(data, protocol_level=5)
    assert exc.value.reason_code == code
    assert isinstance(exc.value, MalformedPacket) == (code == MALFORMED)


def test_password_without_user_name_is_allowed_in_5():
    data = frame(0x10, CONNECT_HEAD + b"\x42\x00\x3c\x00\x00\x01c\x00\x02pw")
    assert decode(data, protocol_level=5)[0] == Connect5("c", True, 60, None, b"pw")


def test_subscription_options_decode():
    data = frame(0x82, b"\x00\x01\x00" + b"\x00\x01a\x2d" + b"\x00\x01b\x1a")
    pkt = decode(data, protocol_level=5)[0]
    assert pkt.subscriptions == (Subscription("a", 1, True, True, 2), Subscription("b", 2, False, True, 1))
    assert [s.options for s in pkt.subscriptions] == [0x2D, 0x1A]


# --- constructors refuse what the decoder refuses (ValueError)

@pytest.mark.parametrize("build", [
    lambda: Properties(topic_alias=0),
    lambda: Properties(receive_maximum=0),
    lambda: Properties(maximum_packet_size=0),
    lambda: Properties(subscription_identifiers=(0,)),
    lambda: Properties(subscription_identifiers=(268_435_456,)),
    lambda: Properties(payload_format_indicator=2),
    lambda: Properties(maximum_qos=2),
    lambda: Properties(message_expiry_interval=1 << 32),
    lambda: Properties(server_keep_alive=-1),
    lambda: Properties(topic_alias="1"),
    lambda: Properties(content_type=b"bytes"),
    lambda: Properties(content_type="a\x00b"),
    lambda: Properties(content_type="\ud800"),
    lambda: Properties(content_type="x" * 65536),
    lambda: Properties(correlation_data="text"),
    lambda: Properties(correlation_data=b"x" * 65536),
    lambda: Properties(response_topic="a/#"),
    lambda: Properties(user_properties=(("only-name",),)),
    lambda: Properties(user_properties=(("k", 1),)),
    lambda: Properties(user_properties=["ab"]),
    lambda: Properties(user_properties=("k", "v")),
    lambda: Properties(authentication_data=b"d"),
    lambda: Puback5(1, properties=Properties(topic_alias=1)),  # misplaced
    lambda: Subscribe5(1, (Subscription("a"),), Properties(subscription_identifiers=(1, 2))),
    lambda: Connect5("c", properties=Properties(will_delay_interval=1)),
    lambda: Will5("t", b"", properties=Properties(session_expiry_interval=1)),
    lambda: Connect5("c", will=Will("t", b"")),
    lambda: Connect5("c", keepalive=70000),
    lambda: Connack5(True, 0x80),
    lambda: Publish5("", b""),
    lambda: Publish5("a/+", b""),
    lambda: Publish5("a", b"", 1),
    lambda: Publish5("a", b"", 0, packet_id=1),
    lambda: Publish5("a", b"", 0, dup=True),
    lambda: Publish5("a", b"", 3, packet_id=1),
    lambda: Publish5("a", b"", properties={"topic_alias": 1}),
    lambda: Subscription("a", 3),
    lambda: Subscription("a", retain_handling=3),
    lambda: Subscription("$share/g/a", no_local=True),
    lambda: Subscribe5(1, ()),
    lambda: Subscribe5(1, (("a", 0),)),
    lambda: Suback5(1, ()),
    lambda: Unsubscribe5(1, ()),
    lambda: Unsuback5(0, (0,)),
    lambda: Disconnect5(0x18),
    lambda: Auth5(0x04),
    lambda: Auth5(0x18),
    lambda: Auth5(0, Properties(reason_string="no method")),
])
def test_constructors_refuse_invalid_values(build):
    with pytest.raises(ValueError):
        build()


def test_constructors_normalise_sequences():
    props = Properties(user_properties=[["k", "v"]], subscription_identifiers=[1],
                       correlation_data=bytearray(b"c"))
    assert props == Properties(user_properties=(("k", "v"),), subscription_identifiers=(1,),
                               correlation_data=b"c")
    assert Subscribe5(1, [Subscription("a")]).subscriptions == (Subscription("a"),)
    assert Suback5(1, [0]).reason_codes == (0,)
