"""Property tests: any split of a valid stream decodes the same; garbage raises only ProtocolError."""
from __future__ import annotations

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fanout.mqtt.codec import PacketReader, decode, encode
from fanout.mqtt.errors import NeedData, ProtocolError
from fanout.mqtt.packets import (
    DISCONNECT, PINGREQ, PINGRESP, SUBACK_CODES, Connack, Connect, Puback, Pubcomp, Publish, Pubrec,
    Pubrel, Suback, Subscribe, Unsuback, Unsubscribe, Will,
)

# Text without U+0000 and surrogates (MQTT-1.5.3-1/2).
TEXT = st.text(st.characters(blacklist_categories=("Cs",), blacklist_characters="\x00"), max_size=12)
TOPIC = TEXT.filter(lambda s: s and "+" not in s and "#" not in s)
PID = st.integers(1, 0xFFFF)
QOS = st.integers(0, 2)
BLOB = st.binary(max_size=300)


@st.composite
def publishes(draw):
    qos = draw(QOS)
    return Publish(draw(TOPIC), draw(BLOB), qos, draw(st.booleans()),
                   draw(st.booleans()) if qos else False, draw(PID) if qos else None)


@st.composite
def connects(draw):
    username = draw(st.none() | TEXT)
    password = draw(st.none() | BLOB) if username is not None else None
    will = draw(st.none() | st.builds(Will, TOPIC, BLOB, QOS, st.booleans()))
    return Connect(draw(TEXT), draw(st.booleans()), draw(st.integers(0, 0xFFFF)), username,
                   password, will)


@st.composite
def connacks(draw):
    code = draw(st.integers(0, 5))
    return Connack(draw(st.booleans()) if code == 0 else False, code)


PACKETS = st.one_of(
    publishes(), connects(), connacks(),
    st.builds(Puback, PID), st.builds(Pubrec, PID), st.builds(Pubrel, PID), st.builds(Pubcomp, PID),
    st.builds(Subscribe, PID, st.lists(st.tuples(TEXT, QOS), min_size=1, max_size=4).map(tuple)),
    st.builds(Suback, PID, st.lists(st.sampled_from(sorted(SUBACK_CODES)), min_size=1,
                                    max_size=4).map(tuple)),
    st.builds(Unsubscribe, PID, st.lists(TEXT, min_size=1, max_size=4).map(tuple)),
    st.builds(Unsuback, PID), st.just(PINGREQ), st.just(PINGRESP), st.just(DISCONNECT),
)


def _chunks(data: bytes, cuts: list[int]) -> list[bytes]:
    points = sorted({c % (len(data) + 1) for c in cuts} | {0, len(data)})
    return [data[a:b] for a, b in zip(points, points[1:])]


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(packets=st.lists(PACKETS, min_size=1, max_size=8), cuts=st.lists(st.integers(0, 10_000),
                                                                          max_size=12))
def test_any_split_yields_same_packets(packets, cuts):
    data = b"".join(encode(p) for p in packets)
    reader = PacketReader()
    out = []
    for chunk in _chunks(data, cuts):
        out.extend(reader.feed(chunk))
    assert out == packets
    assert reader.buffered == 0
    # decode() walks the same stream packet by packet.
    pos, again = 0, []
    while pos < len(data):
        pkt, used = decode(data[pos:])
        again.append(pkt)
        pos += used
    assert again == packets


@settings(max_examples=400, deadline=None)
@given(data=st.binary(max_size=200), cuts=st.lists(st.integers(0, 1000), max_size=6))
def test_random_bytes_only_protocol_errors(data, cuts):
    reader = PacketReader(max_packet_size=1000)
    try:
        for chunk in _chunks(data, cuts):
            reader.feed(chunk)
    except ProtocolError:
        pass
    try:
        decode(data, max_packet_size=1000)
    except (ProtocolError, NeedData):
        pass


@settings(max_examples=300, deadline=None)
@given(packet=PACKETS, flips=st.lists(st.tuples(st.integers(0, 10_000), st.integers(0, 7)),
                                      min_size=1, max_size=3),
       cut=st.integers(0, 10_000))
def test_mutated_packets_only_protocol_errors(packet, flips, cut):
    data = bytearray(encode(packet))
    for pos, bit in flips:
        data[pos % len(data)] ^= 1 << bit
    data = bytes(data)
    reader = PacketReader()
    try:
        reader.feed(data[:cut % (len(data) + 1)])
        reader.feed(data[cut % (len(data) + 1):])
    except ProtocolError:
        pass
    try:
        decode(data)
    except (ProtocolError, NeedData):
        pass
