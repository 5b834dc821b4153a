"""MQTT 5 property tests: encode/decode round trip of every packet and property, any split of a valid
stream decodes the same, random or mutated bytes raise only the codec's protocol errors."""
from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fanout.mqtt.codec import PacketReader, decode, encode
from fanout.mqtt.errors import NeedData, ProtocolError
from fanout.mqtt.packets import PINGREQ, PINGRESP
from fanout.mqtt.packets5 import (
    Auth5, Connack5, Connect5, Disconnect5, Puback5, Pubcomp5, Publish5, Pubrec5, Pubrel5, Suback5,
    Subscribe5, Subscription, Unsuback5, Unsubscribe5, Will5,
)
from fanout.mqtt.properties import PROPERTY_SPECS, DataType, Properties, PropertyHolder, ValueRule
from fanout.mqtt.property_block import encode_properties, properties_at
from fanout.mqtt.reason_codes import (
    AUTH_REASON_CODES, CONNACK_REASON_CODES, DISCONNECT_REASON_CODES, PUBACK_REASON_CODES,
    PUBCOMP_REASON_CODES, PUBREC_REASON_CODES, PUBREL_REASON_CODES, SUBACK_REASON_CODES,
    UNSUBACK_REASON_CODES,
)

H = PropertyHolder
T = DataType
# Text without U+0000 and surrogates (MQTT-1.5.4-1/2).
TEXT = st.text(st.characters(blacklist_categories=("Cs",), blacklist_characters="\x00"), max_size=12)
TOPIC = TEXT.filter(lambda s: s and "+" not in s and "#" not in s)
PID = st.integers(1, 0xFFFF)
QOS = st.integers(0, 2)
BLOB = st.binary(max_size=300)
# Reason codes a server sends for codec errors: malformed, protocol error, unsupported version, topic
# alias invalid, packet too large.
CODEC_REASON_CODES = {0x81, 0x82, 0x84, 0x94, 0x95}


def value_strategy(spec, holder):
    dt, rule = spec.data_type, spec.rule
    if dt is T.BYTE:
        return st.integers(0, 1) if rule is ValueRule.ZERO_OR_ONE else st.integers(0, 0xFF)
    if dt in (T.TWO_BYTE_INTEGER, T.FOUR_BYTE_INTEGER):
        top = 0xFFFF if dt is T.TWO_BYTE_INTEGER else 0xFFFF_FFFF
        return st.integers(1 if rule is ValueRule.NOT_ZERO else 0, top)
    if dt is T.VARIABLE_BYTE_INTEGER:
        most = 3 if holder in spec.repeat_in else 1
        return st.lists(st.integers(1, 268_435_455), min_size=1, max_size=most).map(tuple)
    if dt is T.UTF8_STRING:
        return TOPIC if rule is ValueRule.TOPIC_NAME else TEXT
    if dt is T.BINARY_DATA:
        return st.binary(max_size=20)
    return st.lists(st.tuples(TEXT, TEXT), min_size=1, max_size=3).map(tuple)


@st.composite
def properties_for(draw, holder: PropertyHolder) -> Properties:
    specs = [s for s in PROPERTY_SPECS if holder in s.holders]
    chosen = draw(st.lists(st.sampled_from(specs), unique=True, max_size=len(specs)))
    values = {s.name: draw(value_strategy(s, holder)) for s in chosen}
    if "authentication_data" in values and "authentication_method" not in values:
        values["authentication_method"] = draw(TEXT)
    return Properties(**values)


def props(holder: PropertyHolder):
    # Half the packets carry no properties at all (the common case on the wire).
    return st.one_of(st.just(Properties()), properties_for(holder))


@st.composite
def publishes(draw):
    qos = draw(QOS)
    properties = draw(props(H.PUBLISH))
    topic = draw(TOPIC if properties.topic_alias is None else st.one_of(st.just(""), TOPIC))
    return Publish5(topic, draw(BLOB), qos, draw(st.booleans()), draw(st.booleans()) if qos else False,
                    draw(PID) if qos else None, properties)


@st.composite
def connects(draw):
    will = draw(st.none() | st.builds(Will5, TOPIC, BLOB, QOS, st.booleans(), props(H.WILL)))
    return Connect5(draw(TEXT), draw(st.booleans()), draw(st.integers(0, 0xFFFF)),
                    draw(st.none() | TEXT), draw(st.none() | BLOB), will, draw(props(H.CONNECT)))


@st.composite
def connacks(draw):
    code = draw(st.sampled_from(sorted(CONNACK_REASON_CODES)))
    return Connack5(draw(st.booleans()) if code == 0 else False, code, draw(props(H.CONNACK)))


@st.composite
def auths(draw):
    # Only the remaining-length-0 success form may omit the Authentication Method (3.15.2.2.2).
    if draw(st.booleans()):
        return Auth5()
    properties = draw(properties_for(H.AUTH))
    if properties.authentication_method is None:
        properties = properties.replace(authentication_method=draw(TEXT))
    return Auth5(draw(st.sampled_from(sorted(AUTH_REASON_CODES))), properties)


def acks(cls, codes, holder):
    return st.builds(cls, PID, st.sampled_from(sorted(codes)), props(holder))


SUBSCRIPTIONS = st.one_of(
    st.builds(Subscription, TEXT.filter(lambda t: not t.startswith("$share/")), QOS, st.booleans(),
              st.booleans(), st.integers(0, 2)),
    # No Local is a Protocol Error on a shared subscription (MQTT-3.8.3-4).
    st.builds(Subscription, TEXT.map(lambda t: "$share/g/" + t), QOS, st.just(False), st.booleans(),
              st.integers(0, 2)),
)


def code_lists(codes):
    return st.lists(st.sampled_from(sorted(codes)), min_size=1, max_size=4).map(tuple)


PACKETS_5 = st.one_of(
    publishes(), connects(), connacks(),
    acks(Puback5, PUBACK_REASON_CODES, H.PUBACK), acks(Pubrec5, PUBREC_REASON_CODES, H.PUBREC),
    acks(Pubrel5, PUBREL_REASON_CODES, H.PUBREL), acks(Pubcomp5, PUBCOMP_REASON_CODES, H.PUBCOMP),
    st.builds(Subscribe5, PID, st.lists(SUBSCRIPTIONS, min_size=1, max_size=4).map(tuple),
              props(H.SUBSCRIBE)),
    st.builds(Suback5, PID, code_lists(SUBACK_REASON_CODES), props(H.SUBACK)),
    st.builds(Unsubscribe5, PID, st.lists(TEXT, min_size=1, max_size=4).map(tuple), props(H.UNSUBSCRIBE)),
    st.builds(Unsuback5, PID, code_lists(UNSUBACK_REASON_CODES), props(H.UNSUBACK)),
    st.just(PINGREQ), st.just(PINGRESP),
    st.builds(Disconnect5, st.sampled_from(sorted(DISCONNECT_REASON_CODES)), props(H.DISCONNECT)),
    auths(),
)


@settings(max_examples=500, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(pkt=PACKETS_5)
def test_every_packet_round_trips(pkt):
    data = encode(pkt)
    assert decode(data, protocol_level=5) == (pkt, len(data))


@pytest.mark.parametrize("spec, holder", [(s, h) for s in PROPERTY_SPECS for h in sorted(s.holders)],
                         ids=lambda x: getattr(x, "name", str(x)))
@settings(max_examples=25, deadline=None)
@given(data=st.data())
def test_every_property_round_trips_in_every_holder(spec, holder, data):
    value = data.draw(value_strategy(spec, holder))
    extra = {"authentication_method": "m"} if spec.name == "authentication_data" else {}
    properties = Properties(**{spec.name: value}, **extra)
    encoded = encode_properties(properties)
    assert properties_at(encoded, 0, len(encoded), holder, "test") == (properties, len(encoded))


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(holder=st.sampled_from(sorted(H)), data=st.data())
def test_property_sets_round_trip(holder, data):
    properties = data.draw(properties_for(holder))
    encoded = encode_properties(properties) + b"trailing"
    assert properties_at(encoded, 0, len(encoded), holder, "test") == (properties, len(encoded) - 8)


def _chunks(data: bytes, cuts: list[int]) -> list[bytes]:
    points = sorted({c % (len(data) + 1) for c in cuts} | {0, len(data)})
    return [data[a:b] for a, b in zip(points, points[1:])]


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(packets=st.lists(PACKETS_5, min_size=1, max_size=6),
       cuts=st.lists(st.integers(0, 10_000), max_size=12))
def test_any_split_yields_same_packets(packets, cuts):
    data = b"".join(encode(p) for p in packets)
    reader = PacketReader(protocol_level=5)
    out = []
    for chunk in _chunks(data, cuts):
        out.extend(reader.feed(chunk))
    assert out == packets and reader.buffered == 0
    pos, again = 0, []
    while pos < len(data):
        pkt, used = decode(data[pos:], protocol_level=5)
        again.append(pkt)
        pos += used
    assert again == packets


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(connect=connects(), packets=st.lists(PACKETS_5.filter(lambda p: type(p) is not Connect5),
                                             max_size=5),
       cuts=st.lists(st.integers(0, 10_000), max_size=8))
def test_negotiating_reader_any_split(connect, packets, cuts):
    data = b"".join(encode(p) for p in [connect, *packets])
    reader = PacketReader(protocol_level=None)
    out = []
    for chunk in _chunks(data, cuts):
        out.extend(reader.feed(chunk))
    assert out == [connect, *packets] and reader.protocol_level == 5


def _only_protocol_errors(data: bytes, cuts: list[int], level) -> None:
    reader = PacketReader(max_packet_size=1000, protocol_level=level)
    try:
        for chunk in _chunks(data, cuts):
            reader.feed(chunk)
    except ProtocolError as exc:
        assert exc.reason_code in CODEC_REASON_CODES
    try:
        decode(data, max_packet_size=1000, protocol_level=level)
    except NeedData:
        pass
    except ProtocolError as exc:
        assert exc.reason_code in CODEC_REASON_CODES


@settings(max_examples=400, deadline=None)
@given(data=st.binary(max_size=200), cuts=st.lists(st.integers(0, 1000), max_size=6),
       level=st.sampled_from([5, None]))
def test_random_bytes_only_protocol_errors(data, cuts, level):
    _only_protocol_errors(data, cuts, level)


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(packet=PACKETS_5, flips=st.lists(st.tuples(st.integers(0, 10_000), st.integers(0, 7)),
                                        min_size=1, max_size=3),
       cuts=st.lists(st.integers(0, 10_000), max_size=3))
def test_mutated_packets_only_protocol_errors(packet, flips, cuts):
    data = bytearray(encode(packet))
    for pos, bit in flips:
        data[pos % len(data)] ^= 1 << bit
    _only_protocol_errors(bytes(data), cuts, 5)
