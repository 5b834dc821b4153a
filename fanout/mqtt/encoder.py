"""Encoding of MQTT 3.1.1 packets to bytes (re-exported by :mod:`fanout.mqtt.codec`).

Strategy: the hot path of the broker (PUBLISH to a subscriber, PUBACK back to a publisher) has fast
functions that take plain values and never build a packet object: :func:`encode_publish` packs the
fixed header and the topic length in one ``struct`` call and joins topic, packet id and payload in one
``bytes.join``; acknowledgements are one ``struct.pack``. :func:`encode` handles every packet type in both directions (clients, tests) and
relies on the packet constructors for validation; here only lengths are checked (strings up to 65,535
bytes, remaining length up to 268,435,455) and anything wrong raises ``ValueError``.
"""
from __future__ import annotations

import struct
from typing import Callable

from .packets import (
    Connack, Connect, Disconnect, DISCONNECT_BYTES, Packet, Pingreq, PINGREQ_BYTES, Pingresp,
    PINGRESP_BYTES, Puback, Pubcomp, Publish, Pubrec, Pubrel, Suback, Subscribe, Unsuback, Unsubscribe,
)

MAX_REMAINING_LENGTH = 268_435_455  # 4-byte varint maximum (section 2.2.3)

_U16 = struct.Struct(">H").pack
_ACK = struct.Struct(">BBH").pack
_HEAD1 = struct.Struct(">BBH").pack  # first byte, 1-byte remaining length, topic length
_HEAD2 = struct.Struct(">BBBH").pack  # first byte, 2-byte remaining length, topic length
_SMALL_VARINT = [bytes((n,)) for n in range(128)]


def encode_varint(n: int) -> bytes:
    """Encode a remaining length as the MQTT variable byte integer (section 2.2.3).

    Args:
        n: 0..268,435,455.

    Returns:
        1 to 4 bytes, 7 bits each, least significant group first, high bit = continuation.

    Raises:
        ValueError: ``n`` is out of range.
    """
    if 0 <= n < 128:
        return _SMALL_VARINT[n]
    if not 0 <= n <= MAX_REMAINING_LENGTH:
        raise ValueError(f"remaining length {n} outside 0..{MAX_REMAINING_LENGTH}")
    out = bytearray()
    while n >= 128:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


def _utf8(s: str, what: str) -> bytes:
    b = s.encode("utf-8")
    if len(b) > 0xFFFF:
        raise ValueError(f"{what} is {len(b)} bytes of UTF-8, the maximum is 65535 (section 1.5.3)")
    return _U16(len(b)) + b


def _binary(b: bytes, what: str) -> bytes:
    if len(b) > 0xFFFF:
        raise ValueError(f"{what} is {len(b)} bytes, the maximum is 65535 (section 1.5.3)")
    return _U16(len(b)) + bytes(b)


def _frame(first: int, body: bytes) -> bytes:
    return bytes((first,)) + encode_varint(len(body)) + body


def _check_pid(packet_id: int) -> None:
    if type(packet_id) is not int or not 0 < packet_id <= 0xFFFF:
        raise ValueError(f"packet_id must be an int in 1..65535, got {packet_id!r}")


def encode_publish(topic: str | bytes, payload: bytes, qos: int, retain: bool, dup: bool,
                   packet_id: int | None) -> bytes:
    """Encode a PUBLISH without building a :class:`Publish` (broker hot path).

    The topic is not validated (it came from a decoded PUBLISH or from configuration).

    Args:
        topic: topic name, ``str`` or already UTF-8 encoded ``bytes`` (callers sending one topic to
            many subscribers can encode it once).
        payload: application message.
        qos: 0, 1 or 2.
        retain: RETAIN flag.
        dup: DUP flag; must be False for QoS 0 (MQTT-3.3.1-2).
        packet_id: 1..65535 for QoS 1 and 2, ignored for QoS 0 (MQTT-2.3.1-5: no identifier).

    Returns:
        The complete packet.

    Raises:
        ValueError: bad QoS, DUP on QoS 0, bad packet id, topic over 65535 bytes, packet too large.
    """
    tb = topic.encode("utf-8") if isinstance(topic, str) else topic
    tl = len(tb)
    if tl > 0xFFFF:
        raise ValueError(f"topic is {tl} bytes of UTF-8, the maximum is 65535")
    if qos:
        if qos != 1 and qos != 2:
            raise ValueError(f"QoS must be 0, 1 or 2, got {qos!r}")
        if type(packet_id) is not int or not 0 < packet_id <= 0xFFFF:
            raise ValueError(f"packet_id must be an int in 1..65535, got {packet_id!r}")
        first = 0x30 | (qos << 1) | (8 if dup else 0) | (1 if retain else 0)
        rl = 4 + tl + len(payload)
        return b"".join((_pub_head(first, rl, tl), tb, _U16(packet_id), payload))
    if dup:
        raise ValueError("DUP must be 0 for QoS 0 (MQTT-3.3.1-2)")
    first = 0x31 if retain else 0x30
    return b"".join((_pub_head(first, 2 + tl + len(payload), tl), tb, payload))


def _pub_head(first: int, rl: int, tl: int) -> bytes:
    # Fixed header and topic length packed in one struct call (1- and 2-byte remaining lengths
    # cover packets up to 16 KiB).
    if rl < 0x80:
        return _HEAD1(first, rl, tl)
    if rl < 0x4000:
        return _HEAD2(first, (rl & 0x7F) | 0x80, rl >> 7, tl)
    return bytes((first,)) + encode_varint(rl) + _U16(tl)


def _ack(first: int, packet_id: int) -> bytes:
    if type(packet_id) is int and 0 < packet_id <= 0xFFFF:
        return _ACK(first, 2, packet_id)
    raise ValueError(f"packet_id must be an int in 1..65535, got {packet_id!r}")


def encode_puback(packet_id: int) -> bytes:
    """Encode PUBACK (4 bytes).

    Args:
        packet_id: 1..65535.

    Returns:
        ``40 02 <id>``.

    Raises:
        ValueError: bad packet id.
    """
    if type(packet_id) is int and 0 < packet_id <= 0xFFFF:
        return _ACK(0x40, 2, packet_id)
    raise ValueError(f"packet_id must be an int in 1..65535, got {packet_id!r}")


def encode_pubrec(packet_id: int) -> bytes:
    """Encode PUBREC (``50 02 <id>``); see :func:`encode_puback`."""
    return _ack(0x50, packet_id)


def encode_pubrel(packet_id: int) -> bytes:
    """Encode PUBREL (``62 02 <id>``, reserved flags 0b0010 per MQTT-3.6.1-1); see :func:`encode_puback`."""
    return _ack(0x62, packet_id)


def encode_pubcomp(packet_id: int) -> bytes:
    """Encode PUBCOMP (``70 02 <id>``); see :func:`encode_puback`."""
    return _ack(0x70, packet_id)


def encode_unsuback(packet_id: int) -> bytes:
    """Encode UNSUBACK (``b0 02 <id>``); see :func:`encode_puback`."""
    return _ack(0xB0, packet_id)


_CONNACKS = {(sp, rc): bytes((0x20, 2, sp, rc)) for sp in (0, 1) for rc in range(6)}


def encode_connack(session_present: bool, return_code: int) -> bytes:
    """Encode CONNACK.

    Args:
        session_present: session present flag; forced to 0 when ``return_code`` is not 0 (MQTT-3.2.2-4).
        return_code: 0..5 (``CONNACK_*`` constants).

    Returns:
        ``20 02 <flags> <code>``.

    Raises:
        ValueError: return code out of 0..255.
    """
    key = (1 if session_present and return_code == 0 else 0, return_code)
    cached = _CONNACKS.get(key)
    if cached is not None:
        return cached
    if type(return_code) is not int or not 0 <= return_code <= 0xFF:
        raise ValueError(f"return_code must be in 0..255, got {return_code!r}")
    return bytes((0x20, 2, key[0], return_code))


def encode_suback(packet_id: int, return_codes: tuple[int, ...] | list[int]) -> bytes:
    """Encode SUBACK.

    Args:
        packet_id: the SUBSCRIBE's packet id.
        return_codes: granted QoS (0..2) or 0x80 per requested filter, in order (MQTT-3.9.3-1).

    Returns:
        The complete packet.

    Raises:
        ValueError: bad packet id or return code out of 0..255.
    """
    _check_pid(packet_id)
    return _frame(0x90, _U16(packet_id) + bytes(return_codes))


def _enc_connect(p: Connect) -> bytes:
    flags = 0x02 if p.clean_session else 0
    parts = [_utf8(p.protocol_name, "protocol name"), b"", _U16(p.keepalive),
             _utf8(p.client_id, "client id")]
    if p.will is not None:
        w = p.will
        flags |= 0x04 | (w.qos << 3) | (0x20 if w.retain else 0)
        parts.append(_utf8(w.topic, "will topic"))
        parts.append(_binary(w.payload, "will payload"))
    if p.username is not None:
        flags |= 0x80
        parts.append(_utf8(p.username, "username"))
    if p.password is not None:
        flags |= 0x40
        parts.append(_binary(p.password, "password"))
    parts[1] = bytes((p.protocol_level, flags))
    return _frame(0x10, b"".join(parts))


def _enc_connack(p: Connack) -> bytes:
    return bytes((0x20, 2, 1 if p.session_present else 0, p.return_code))


def _enc_publish(p: Publish) -> bytes:
    return encode_publish(p.topic, p.payload, p.qos, p.retain, p.dup, p.packet_id)


def _enc_subscribe(p: Subscribe) -> bytes:
    parts = [_U16(p.packet_id)]
    for topic_filter, qos in p.topics:
        parts.append(_utf8(topic_filter, "topic filter"))
        parts.append(_SMALL_VARINT[qos])
    return _frame(0x82, b"".join(parts))


def _enc_unsubscribe(p: Unsubscribe) -> bytes:
    parts = [_U16(p.packet_id)]
    parts.extend(_utf8(topic_filter, "topic filter") for topic_filter in p.topics)
    return _frame(0xA2, b"".join(parts))


_ENCODERS: dict[type, Callable[[Packet], bytes]] = {
    Connect: _enc_connect,  # type: ignore[dict-item]
    Connack: _enc_connack,  # type: ignore[dict-item]
    Publish: _enc_publish,  # type: ignore[dict-item]
    Puback: lambda p: _ack(0x40, p.packet_id),  # type: ignore[union-attr,arg-type]
    Pubrec: lambda p: _ack(0x50, p.packet_id),  # type: ignore[union-attr,arg-type]
    Pubrel: lambda p: _ack(0x62, p.packet_id),  # type: ignore[union-attr,arg-type]
    Pubcomp: lambda p: _ack(0x70, p.packet_id),  # type: ignore[union-attr,arg-type]
    Subscribe: _enc_subscribe,  # type: ignore[dict-item]
    Suback: lambda p: encode_suback(p.packet_id, p.return_codes),  # type: ignore[union-attr,arg-type]
    Unsubscribe: _enc_unsubscribe,  # type: ignore[dict-item]
    Unsuback: lambda p: _ack(0xB0, p.packet_id),  # type: ignore[union-attr,arg-type]
    Pingreq: lambda p: PINGREQ_BYTES,
    Pingresp: lambda p: PINGRESP_BYTES,
    Disconnect: lambda p: DISCONNECT_BYTES,
}


def encode(pkt: Packet) -> bytes:
    """Encode any packet, in either direction.

    Args:
        pkt: a packet instance.

    Returns:
        The complete packet bytes (fixed header included).

    Raises:
        ValueError: a string or binary field over 65535 bytes, or a body over 268,435,455 bytes.
        TypeError: ``pkt`` is not a packet.
    """
    try:
        encoder = _ENCODERS[type(pkt)]
    except KeyError:
        raise TypeError(f"not an MQTT packet: {pkt!r}") from None
    return encoder(pkt)
