"""Codec tests: round trips, incremental feeding, malformed input, spec byte vectors."""
from __future__ import annotations

import pytest

from fanout.mqtt.codec import (
    PacketReader, decode, encode, encode_connack, encode_puback, encode_pubcomp, encode_publish,
    encode_pubrec, encode_pubrel, encode_suback, encode_unsuback, encode_varint,
)
from fanout.mqtt.errors import (
    MalformedPacket, MQTTError, NeedData, PacketTooLarge, ProtocolError, UnsupportedProtocol,
)
from fanout.mqtt.packets import (
    DISCONNECT, DISCONNECT_BYTES, PINGREQ, PINGREQ_BYTES, PINGRESP, PINGRESP_BYTES, SUBACK_FAILURE,
    Connack, Connect, Disconnect, PacketType, Pingreq, Pingresp, Puback, Pubcomp, Publish, Pubrec,
    Pubrel, Suback, Subscribe, Unsuback, Unsubscribe, Will,
)

ALL_PACKETS = [
    Connect("car-1"),
    Connect("", clean_session=True, keepalive=0),
    Connect("c\u00e9", clean_session=False, keepalive=65535, username="u", password=b"\x00pw",
            will=Will("wills/c\u00e9", b"bye", 2, True)),
    Connect("c", username="only-user", will=Will("w", b"", 0, False)),
    Connect("c", will=Will("w", b"x" * 300, 1, False)),
    Connack(False, 0),
    Connack(True, 0),
    Connack(False, 5),
    Publish("a/b", b"payload"),
    Publish("a/b", b"", retain=True),
    Publish("$SYS/x", b"p" * 200, qos=1, packet_id=1),
    Publish("t", b"p" * 20000, qos=2, retain=True, dup=True, packet_id=65535),
    Publish("\u00fc/\U0001F600", b"\xff\x00", qos=1, dup=True, packet_id=42),
    Puback(1), Puback(65535), Pubrec(7), Pubrel(8), Pubcomp(9),
    Subscribe(10, (("a/+/c", 0), ("#", 1), ("x/y", 2))),
    Subscribe(11, (("", 0),)),  # filter syntax is the broker's business (SUBACK 0x80)
    Suback(10, (0, 1, 2, SUBACK_FAILURE)),
    Unsubscribe(12, ("a/+/c", "#")),
    Unsuback(12),
    PINGREQ, PINGRESP, DISCONNECT,
]


@pytest.mark.parametrize("pkt", ALL_PACKETS, ids=repr)
def test_round_trip(pkt):
    data = encode(pkt)
    assert decode(data) == (pkt, len(data))
    assert decode(bytearray(data)) == (pkt, len(data))
    assert decode(memoryview(data)) == (pkt, len(data))
    assert PacketType(data[0] >> 4) is PacketType[type(pkt).__name__.upper()]


@pytest.mark.parametrize("pkt", ALL_PACKETS, ids=repr)
def test_byte_at_a_time(pkt):
    data = encode(pkt)
    for i in range(len(data)):
        with pytest.raises(NeedData):
            decode(data[:i])
    reader = PacketReader()
    for i in range(len(data) - 1):
        assert reader.feed(data[i:i + 1]) == []
        assert reader.buffered == i + 1
    assert reader.feed(data[-1:]) == [pkt]
    assert reader.buffered == 0


def test_trailing_bytes_stay_buffered():
    a, b = encode(Publish("a", b"1", 1, packet_id=1)), encode(Puback(3))
    reader = PacketReader()
    assert reader.feed(a + b + b[:3]) == [Publish("a", b"1", 1, packet_id=1), Puback(3)]
    assert reader.buffered == 3
    assert reader.feed(b[3:] + a[:1]) == [Puback(3)]
    assert reader.buffered == 1
    assert decode(a + b) == (Publish("a", b"1", 1, packet_id=1), len(a))


def test_many_small_packets_in_one_chunk():
    packets = [Puback(i) for i in range(1, 5001)]
    data = b"".join(encode(p) for p in packets)
    reader = PacketReader()
    assert reader.feed(data) == packets
    assert reader.buffered == 0


def test_reader_accepts_bytearray_and_memoryview():
    data = encode(Publish("a", b"x"))
    reader = PacketReader()
    assert reader.feed(bytearray(data[:2])) == []
    assert reader.feed(memoryview(data)[2:]) == [Publish("a", b"x")]


def test_fast_encoders_match_encode():
    assert encode_puback(5) == encode(Puback(5)) == b"\x40\x02\x00\x05"
    assert encode_pubrec(5) == encode(Pubrec(5)) == b"\x50\x02\x00\x05"
    assert encode_pubrel(5) == encode(Pubrel(5)) == b"\x62\x02\x00\x05"
    assert encode_pubcomp(5) == encode(Pubcomp(5)) == b"\x70\x02\x00\x05"
    assert encode_unsuback(5) == encode(Unsuback(5)) == b"\xb0\x02\x00\x05"
    assert encode_connack(True, 0) == encode(Connack(True, 0)) == b"\x20\x02\x01\x00"
    assert encode_connack(True, 5) == b"\x20\x02\x00\x05"  # MQTT-3.2.2-4
    assert encode_suback(3, (1, 0x80)) == encode(Suback(3, (1, 0x80)))
    assert PINGREQ_BYTES == encode(Pingreq()) == b"\xc0\x00"
    assert PINGRESP_BYTES == encode(Pingresp()) == b"\xd0\x00"
    assert DISCONNECT_BYTES == encode(Disconnect()) == b"\xe0\x00"
    for qos, pid in ((0, None), (1, 9), (2, 9)):
        for retain in (False, True):
            for dup in ((False, True) if qos else (False,)):
                for payload in (b"", b"x" * 130, b"y" * 20000):
                    pkt = Publish("t/\u00e9", payload, qos, retain, dup, pid)
                    assert encode_publish("t/\u00e9", payload, qos, retain, dup, pid) == encode(pkt)
                    assert encode_publish("t/\u00e9".encode(), payload, qos, retain, dup, pid) == encode(pkt)


def test_spec_vectors():
    # Section 3.3 example: PUBLISH "a/b" QoS 1 packet id 10.
    assert encode(Publish("a/b", b"", 1, packet_id=10)) == b"\x32\x07\x00\x03a/b\x00\x0a"
    assert encode(Connect("c", keepalive=10)) == (
        b"\x10\x0d\x00\x04MQTT\x04\x02\x00\x0a\x00\x01c")
    assert encode(Subscribe(1, (("a/b", 1),))) == b"\x82\x08\x00\x01\x00\x03a/b\x01"


@pytest.mark.parametrize("value,encoded", [
    (0, b"\x00"), (127, b"\x7f"), (128, b"\x80\x01"), (16383, b"\xff\x7f"),
    (16384, b"\x80\x80\x01"), (2097151, b"\xff\xff\x7f"), (2097152, b"\x80\x80\x80\x01"),
    (268435455, b"\xff\xff\xff\x7f"),
])
def test_remaining_length_vectors(value, encoded):
    # Table 2.4 of MQTT 3.1.1 section 2.2.3.
    assert encode_varint(value) == encoded
    # A PUBLISH announcing that remaining length: header parses, body is awaited or refused.
    data = b"\x30" + encoded
    if value == 0:
        with pytest.raises(MalformedPacket):  # a PUBLISH needs a topic
            decode(data)
    else:
        with pytest.raises(NeedData):
            decode(data)
        with pytest.raises(PacketTooLarge):
            decode(data, max_packet_size=value - 1)


def test_varint_out_of_range():
    with pytest.raises(ValueError):
        encode_varint(268435456)
    with pytest.raises(ValueError):
        encode_varint(-1)


def test_oversize_raises_before_body():
    reader = PacketReader(max_packet_size=100)
    assert reader.feed(b"\x30") == []
    assert reader.feed(b"\xe5") == []  # continuation: length not known yet
    with pytest.raises(PacketTooLarge):
        reader.feed(b"\x00")  # 101
    with pytest.raises(PacketTooLarge):
        reader.feed(b"anything")  # the reader stays failed
    ok = PacketReader(max_packet_size=100)
    assert ok.feed(b"\x30\x64") == []  # exactly 100 is fine
    assert ok.buffered == 2


def test_error_carries_earlier_packets():
    reader = PacketReader()
    with pytest.raises(MalformedPacket) as info:
        reader.feed(encode(Puback(1)) + encode(Puback(2)) + b"\x00\x00")
    assert info.value.packets == [Puback(1), Puback(2)]
    assert isinstance(info.value, ProtocolError) and isinstance(info.value, MQTTError)
    assert not isinstance(NeedData(), ProtocolError)


def _connect_body(flags: int, payload: bytes, name: bytes = b"MQTT", level: int = 4) -> bytes:
    body = len(name).to_bytes(2, "big") + name + bytes((level, flags)) + b"\x00\x3c" + payload
    return b"\x10" + encode_varint(len(body)) + body


def _s(text: bytes) -> bytes:
    return len(text).to_bytes(2, "big") + text


MALFORMED = {
    "reserved type 0": b"\x00\x00",
    "reserved type 15": b"\xf0\x00",
    "CONNACK flags": b"\x21\x02\x00\x00",
    "PUBACK flags": b"\x42\x02\x00\x01",
    "PUBREL flags 0": b"\x60\x02\x00\x01",
    "SUBSCRIBE flags 0": b"\x80\x06\x00\x01\x00\x01a\x00",
    "UNSUBSCRIBE flags 0": b"\xa0\x05\x00\x01\x00\x01a",
    "PINGREQ flags": b"\xc1\x00",
    "DISCONNECT flags": b"\xe2\x00",
    "PUBLISH qos 3": b"\x36\x05\x00\x01a\x00\x01",
    "PUBLISH dup on qos 0": b"\x38\x03\x00\x01a",
    "varint 5 bytes": b"\x30\xff\xff\xff\xff\x01",
    "PUBACK long": b"\x40\x03\x00\x01\x00",
    "PUBACK short": b"\x40\x01\x00",
    "PUBACK id 0": b"\x40\x02\x00\x00",
    "PUBREC id 0": b"\x50\x02\x00\x00",
    "PINGREQ body": b"\xc0\x01\x00",
    "UNSUBACK long": b"\xb0\x03\x00\x01\x00",
    "PUBLISH no topic": b"\x30\x00",
    "PUBLISH topic past end": b"\x30\x03\x00\x05a",
    "PUBLISH empty topic": b"\x30\x02\x00\x00",
    "PUBLISH qos1 no id": b"\x32\x03\x00\x01a",
    "PUBLISH qos1 id 0": b"\x32\x05\x00\x01a\x00\x00",
    "PUBLISH bad utf8": b"\x30\x03\x00\x01\xff",
    "PUBLISH surrogate": b"\x30\x05\x00\x03\xed\xa0\x80",
    "PUBLISH overlong utf8": b"\x30\x04\x00\x02\xc0\xaf",
    "PUBLISH U+0000": b"\x30\x05\x00\x03a\x00b",
    "PUBLISH wildcard +": b"\x30\x05\x00\x03a/+",
    "PUBLISH wildcard #": b"\x30\x03\x00\x01#",
    "SUBSCRIBE no topics": b"\x82\x02\x00\x01",
    "SUBSCRIBE id 0": b"\x82\x06\x00\x00\x00\x01a\x00",
    "SUBSCRIBE qos 3": b"\x82\x06\x00\x01\x00\x01a\x03",
    "SUBSCRIBE reserved bits": b"\x82\x06\x00\x01\x00\x01a\x04",
    "SUBSCRIBE missing qos": b"\x82\x05\x00\x01\x00\x01a",
    "SUBSCRIBE bad utf8": b"\x82\x06\x00\x01\x00\x01\x80\x00",
    "SUBSCRIBE U+0000": b"\x82\x06\x00\x01\x00\x01\x00\x00",
    "UNSUBSCRIBE no topics": b"\xa2\x02\x00\x01",
    "UNSUBSCRIBE truncated": b"\xa2\x04\x00\x01\x00\x05",
    "SUBACK no codes": b"\x90\x02\x00\x01",
    "SUBACK reserved code": b"\x90\x03\x00\x01\x03",
    "CONNACK reserved flags": b"\x20\x02\x02\x00",
    "CONNACK reserved code": b"\x20\x02\x00\x06",
    "CONNACK session present on refusal": b"\x20\x02\x01\x05",
    "CONNECT reserved flag": _connect_body(0x03, _s(b"c")),
    "CONNECT will qos without will": _connect_body(0x0A, _s(b"c")),
    "CONNECT will retain without will": _connect_body(0x22, _s(b"c")),
    "CONNECT will qos 3": _connect_body(0x1E, _s(b"c") + _s(b"w") + _s(b"m")),
    "CONNECT password without username": _connect_body(0x42, _s(b"c") + _s(b"pw")),
    "CONNECT missing client id": _connect_body(0x02, b""),
    "CONNECT missing will": _connect_body(0x06, _s(b"c")),
    "CONNECT will wildcard": _connect_body(0x06, _s(b"c") + _s(b"w/#") + _s(b"m")),
    "CONNECT will empty topic": _connect_body(0x06, _s(b"c") + _s(b"") + _s(b"m")),
    "CONNECT missing username": _connect_body(0x82, _s(b"c")),
    "CONNECT extra bytes": _connect_body(0x02, _s(b"c") + b"\x00"),
    "CONNECT username without flag": _connect_body(0x02, _s(b"c") + _s(b"u")),
    "CONNECT bad utf8 client id": _connect_body(0x02, _s(b"\xfe")),
    "CONNECT truncated flags": b"\x10\x07\x00\x04MQTT\x04",
    "CONNECT no level": b"\x10\x06\x00\x04MQTT",
}


@pytest.mark.parametrize("name", sorted(MALFORMED))
def test_malformed(name):
    data = MALFORMED[name]
    with pytest.raises(MalformedPacket):
        decode(data)
    reader = PacketReader()
    with pytest.raises(MalformedPacket):
        for i in range(len(data)):
            reader.feed(data[i:i + 1])
    with pytest.raises(MalformedPacket):
        reader.feed(encode(PINGREQ))


def test_bad_first_byte_refused_before_rest():
    with pytest.raises(MalformedPacket):
        PacketReader().feed(b"\xf0")
    with pytest.raises(MalformedPacket):
        PacketReader().feed(b"\x36")  # PUBLISH QoS 3


def test_fixed_length_refused_before_body():
    with pytest.raises(MalformedPacket):
        PacketReader().feed(b"\xc0\x7f")  # PINGREQ announcing 127 bytes


def test_truncated_is_need_data_not_malformed():
    data = encode(Connect("c", username="u", password=b"p", will=Will("w", b"m", 1, True)))
    for i in range(len(data)):
        with pytest.raises(NeedData):
            decode(data[:i])


@pytest.mark.parametrize("name,level", [(b"MQIsdp", 3), (b"MQTT", 3), (b"MQTT", 5), (b"XYZ", 4)])
def test_unsupported_protocol(name, level):
    data = _connect_body(0x02, _s(b"c"), name=name, level=level)
    with pytest.raises(UnsupportedProtocol) as info:
        decode(data)
    assert info.value.return_code == 0x01
    assert info.value.protocol_level == level
    assert isinstance(info.value, ProtocolError)
    # Only name and level are needed: a garbage remainder still gets CONNACK 0x01.
    with pytest.raises(UnsupportedProtocol):
        decode(_connect_body(0xFF, b"", name=name, level=level))


def test_connect_flags_decoded():
    pkt = Connect("c", clean_session=False, keepalive=7, username="u", password=b"p",
                  will=Will("w", b"m", 1, True))
    assert decode(encode(pkt))[0] == pkt
    assert encode(pkt)[9] == 0b11101100


@pytest.mark.parametrize("bad", [
    lambda: Publish("t", b"", qos=3),
    lambda: Publish("t", b"", qos=1),
    lambda: Publish("t", b"", qos=1, packet_id=0),
    lambda: Publish("t", b"", qos=1, packet_id=65536),
    lambda: Publish("t", b"", qos=0, packet_id=1),
    lambda: Publish("t", b"", qos=0, dup=True),
    lambda: Puback(0),
    lambda: Subscribe(1, ()),
    lambda: Subscribe(1, (("a", 3),)),
    lambda: Suback(1, (3,)),
    lambda: Unsubscribe(1, ()),
    lambda: Connect("c", password=b"x"),
    lambda: Connect("c", keepalive=70000),
    lambda: Will("t", b"", 3, False),
    lambda: encode_publish("t", b"", 1, False, False, None),
    lambda: encode_publish("t", b"", 0, False, True, None),
    lambda: encode_publish("t", b"", 3, False, False, 1),
    lambda: encode_publish("t" * 65536, b"", 0, False, False, None),
    lambda: encode_puback(0),
    lambda: encode_puback(65536),
    lambda: encode(Connect("c" * 65536)),
    lambda: encode(Connack(False, 300)),
])
def test_local_validation(bad):
    with pytest.raises(ValueError):
        bad()


def test_encode_rejects_non_packets():
    with pytest.raises(TypeError):
        encode("not a packet")  # type: ignore[arg-type]


def test_packets_are_frozen_and_hashable():
    pkt = decode(encode(Publish("a", b"x", 1, packet_id=3)))[0]
    with pytest.raises(AttributeError):
        pkt.qos = 0  # type: ignore[misc]
    assert hash(pkt) == hash(Publish("a", b"x", 1, packet_id=3))
    assert type(pkt.payload) is bytes
    assert Subscribe(1, [("a", 1)]).topics == (("a", 1),)  # type: ignore[arg-type]


@pytest.mark.parametrize("rl", [127, 128, 16383, 16384, 2097152])
@pytest.mark.parametrize("qos", [0, 1])
def test_encode_publish_remaining_length_boundaries(rl, qos):
    # Topic "t": 2 + 1 bytes, plus 2 for the packet id when QoS > 0.
    payload = b"p" * (rl - 3 - (2 if qos else 0))
    data = encode_publish("t", payload, qos, False, False, 1 if qos else None)
    assert data[1:1 + len(encode_varint(rl))] == encode_varint(rl)
    assert len(data) == 1 + len(encode_varint(rl)) + rl
    assert decode(data) == (Publish("t", payload, qos, packet_id=1 if qos else None), len(data))


def test_buffered_bytes_capped_by_max_packet_size():
    reader = PacketReader(max_packet_size=100)
    data = encode_publish("t", b"x" * 95, 0, False, False, None)  # remaining length 98
    assert reader.feed(data[:-1]) == []
    assert reader.buffered == len(data) - 1 <= 100 + 5
    assert reader.feed(data[-1:] + b"\x30") == [Publish("t", b"x" * 95)]
    assert reader.buffered == 1
