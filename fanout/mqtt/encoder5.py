"""Encoding of MQTT 5.0 packets (re-exported by :mod:`fanout.mqtt.codec`).

Strategy: as in :mod:`fanout.mqtt.encoder`, the broker's per-message work has fast functions taking plain
values: :func:`encode_publish5` takes the properties already encoded (a message forwarded to many
subscribers encodes its properties once; per-subscriber ones such as a Topic Alias are prepended with
:func:`~fanout.mqtt.property_block.topic_alias_property`), and :func:`encode_puback5` is one ``struct``
call for the usual success without properties. Importing this module registers the MQTT 5 packet
classes in :func:`fanout.mqtt.encoder.encode`, so ``codec.encode`` serves both versions.

Acknowledgements use the shortest form the spec allows: remaining length 2 for a PUBACK, PUBREC, PUBREL
or PUBCOMP with reason code 0 and no properties, 3 without properties (3.4.2.2.1); a DISCONNECT or AUTH
with code 0 and no properties has remaining length 0, a DISCONNECT without properties 1 (3.14.2.2.1).

:func:`encode_within` encodes an acknowledgement for a peer that announced a Maximum Packet Size: "The
Server MUST NOT send this property if it would increase the size of the packet beyond the Maximum
Packet Size specified by the Client" holds for the Reason String and the User Property of every
packet that may carry a Reason String (MQTT-3.2.2-19/20, 3.4.2-2/3, 3.5.2-2/3, 3.6.2-2/3, 3.7.2-2/3,
3.9.2-1/2, 3.11.2-1/2, 3.14.2-3/4, 3.15.2-2/3).
"""
from __future__ import annotations

import struct
from dataclasses import replace
from typing import Any, Callable

from .encoder import (
    _ENCODERS, _SMALL_VARINT, _U16, _binary, _check_pid, _frame, _pub_head, _utf8, encode,
    encode_varint,
)
from .packets5 import (
    ACKS_WITH_REASON_STRING, Auth5, Connack5, Connect5, Disconnect5, Puback5, Pubcomp5, Publish5,
    Pubrec5, Pubrel5, Suback5, Subscribe5, Unsuback5, Unsubscribe5,
)
from .properties import EMPTY_PROPERTIES, Properties
from .property_block import encode_properties, encode_properties_body

_ACK = struct.Struct(">BBH").pack
_ACK_CODE = struct.Struct(">BBHB").pack


def encode_publish5(topic: str | bytes, payload: bytes, qos: int, retain: bool, dup: bool,
                    packet_id: int | None, properties_body: bytes = b"") -> bytes:
    """Encode an MQTT 5 PUBLISH without building a :class:`Publish5` (broker hot path).

    Args:
        topic: topic name, ``str`` or UTF-8 ``bytes``; empty when the properties hold a Topic Alias.
        payload: application message.
        qos: 0, 1 or 2.
        retain: RETAIN flag.
        dup: DUP flag; must be False for QoS 0 (MQTT-3.3.1-2).
        packet_id: 1..65535 for QoS 1 and 2, ignored for QoS 0.
        properties_body: encoded properties without their length
            (:func:`~fanout.mqtt.property_block.encode_properties_body`), not validated here.

    Returns:
        The complete packet.

    Raises:
        ValueError: bad QoS, DUP on QoS 0, bad packet id, topic over 65535 bytes, packet too large.
    """
    tb = topic.encode("utf-8") if type(topic) is str else topic
    tl = len(tb)
    if tl > 0xFFFF:
        raise ValueError(f"topic is {tl} bytes of UTF-8, the maximum is 65535")
    pl = len(properties_body)
    plen = _SMALL_VARINT[pl] if pl < 0x80 else encode_varint(pl)
    if qos:
        if qos != 1 and qos != 2:
            raise ValueError(f"QoS must be 0, 1 or 2, got {qos!r}")
        if type(packet_id) is not int or not 0 < packet_id <= 0xFFFF:
            raise ValueError(f"packet_id must be an int in 1..65535, got {packet_id!r}")
        first = 0x30 | (qos << 1) | (8 if dup else 0) | (1 if retain else 0)
        rl = 4 + tl + len(plen) + pl + len(payload)
        return b"".join((_pub_head(first, rl, tl), tb, _U16(packet_id), plen, properties_body,
                         payload))
    if dup:
        raise ValueError("DUP must be 0 for QoS 0 (MQTT-3.3.1-2)")
    first = 0x31 if retain else 0x30
    rl = 2 + tl + len(plen) + pl + len(payload)
    return b"".join((_pub_head(first, rl, tl), tb, plen, properties_body, payload))


def _ack5(first: int, packet_id: int, reason_code: int, properties: Properties) -> bytes:
    if type(packet_id) is not int or not 0 < packet_id <= 0xFFFF:
        raise ValueError(f"packet_id must be an int in 1..65535, got {packet_id!r}")
    if properties is EMPTY_PROPERTIES or properties == EMPTY_PROPERTIES:
        if not reason_code:
            return _ACK(first, 2, packet_id)
        return _ACK_CODE(first, 3, packet_id, reason_code)
    return _frame(first, _U16(packet_id) + bytes((reason_code,)) + encode_properties(properties))


def encode_puback5(packet_id: int, reason_code: int = 0,
                   properties: Properties = EMPTY_PROPERTIES) -> bytes:
    """Encode an MQTT 5 PUBACK in its shortest form (``40 02 <id>`` for success, no properties).

    Args:
        packet_id: 1..65535.
        reason_code: a PUBACK reason code (not checked here; :class:`Puback5` checks it).
        properties: Reason String and User Properties, if any.

    Raises:
        ValueError: bad packet id.
    """
    if reason_code == 0 and properties is EMPTY_PROPERTIES and type(packet_id) is int \
            and 0 < packet_id <= 0xFFFF:
        return _ACK(0x40, 2, packet_id)
    return _ack5(0x40, packet_id, reason_code, properties)


def encode_pubrec5(packet_id: int, reason_code: int = 0,
                   properties: Properties = EMPTY_PROPERTIES) -> bytes:
    """Encode an MQTT 5 PUBREC; see :func:`encode_puback5`."""
    return _ack5(0x50, packet_id, reason_code, properties)


def encode_pubrel5(packet_id: int, reason_code: int = 0,
                   properties: Properties = EMPTY_PROPERTIES) -> bytes:
    """Encode an MQTT 5 PUBREL (flags 0b0010, MQTT-3.6.1-1); see :func:`encode_puback5`."""
    return _ack5(0x62, packet_id, reason_code, properties)


def encode_pubcomp5(packet_id: int, reason_code: int = 0,
                    properties: Properties = EMPTY_PROPERTIES) -> bytes:
    """Encode an MQTT 5 PUBCOMP; see :func:`encode_puback5`."""
    return _ack5(0x70, packet_id, reason_code, properties)


def encode_connack5(session_present: bool, reason_code: int,
                    properties: Properties = EMPTY_PROPERTIES) -> bytes:
    """Encode an MQTT 5 CONNACK; session present is sent as 0 with a refusal (MQTT-3.2.2-6)."""
    flags = 1 if session_present and reason_code == 0 else 0
    return _frame(0x20, bytes((flags, reason_code)) + encode_properties(properties))


def encode_suback5(packet_id: int, reason_codes: tuple[int, ...] | list[int],
                   properties: Properties = EMPTY_PROPERTIES) -> bytes:
    """Encode an MQTT 5 SUBACK: one reason code per requested filter, in order."""
    _check_pid(packet_id)
    return _frame(0x90, _U16(packet_id) + encode_properties(properties) + bytes(reason_codes))


def encode_unsuback5(packet_id: int, reason_codes: tuple[int, ...] | list[int],
                     properties: Properties = EMPTY_PROPERTIES) -> bytes:
    """Encode an MQTT 5 UNSUBACK: one reason code per topic filter, in order."""
    _check_pid(packet_id)
    return _frame(0xB0, _U16(packet_id) + encode_properties(properties) + bytes(reason_codes))


def encode_disconnect5(reason_code: int = 0, properties: Properties = EMPTY_PROPERTIES) -> bytes:
    """Encode an MQTT 5 DISCONNECT in its shortest form (``e0 00`` for a normal disconnection)."""
    if properties is EMPTY_PROPERTIES or properties == EMPTY_PROPERTIES:
        return b"\xe0\x00" if not reason_code else bytes((0xE0, 1, reason_code))
    return _frame(0xE0, bytes((reason_code,)) + encode_properties(properties))


def encode_auth5(reason_code: int = 0, properties: Properties = EMPTY_PROPERTIES) -> bytes:
    """Encode an AUTH; code 0 without properties is ``f0 00`` (3.15.2.1)."""
    if not reason_code and (properties is EMPTY_PROPERTIES or properties == EMPTY_PROPERTIES):
        return b"\xf0\x00"
    return _frame(0xF0, bytes((reason_code,)) + encode_properties(properties))


def _enc_connect5(p: Connect5) -> bytes:
    flags = 0x02 if p.clean_start else 0
    parts = [b"\x00\x04MQTT\x05", b"", _U16(p.keepalive), encode_properties(p.properties),
             _utf8(p.client_id, "client id")]
    if p.will is not None:
        w = p.will
        flags |= 0x04 | (w.qos << 3) | (0x20 if w.retain else 0)
        parts.append(encode_properties(w.properties))
        parts.append(_utf8(w.topic, "will topic"))
        parts.append(_binary(w.payload, "will payload"))
    if p.username is not None:
        flags |= 0x80
        parts.append(_utf8(p.username, "user name"))
    if p.password is not None:
        flags |= 0x40
        parts.append(_binary(p.password, "password"))
    parts[1] = bytes((flags,))
    return _frame(0x10, b"".join(parts))


def _enc_publish5(p: Publish5) -> bytes:
    return encode_publish5(p.topic, p.payload, p.qos, p.retain, p.dup, p.packet_id,
                           encode_properties_body(p.properties))


def _enc_subscribe5(p: Subscribe5) -> bytes:
    parts = [_U16(p.packet_id), encode_properties(p.properties)]
    for sub in p.subscriptions:
        parts.append(_utf8(sub.topic_filter, "topic filter"))
        parts.append(_SMALL_VARINT[sub.options])
    return _frame(0x82, b"".join(parts))


def _enc_unsubscribe5(p: Unsubscribe5) -> bytes:
    parts = [_U16(p.packet_id), encode_properties(p.properties)]
    parts.extend(_utf8(topic_filter, "topic filter") for topic_filter in p.topics)
    return _frame(0xA2, b"".join(parts))


ENCODERS_5: dict[type, Callable[[Any], bytes]] = {
    Connect5: _enc_connect5,
    Connack5: lambda p: encode_connack5(p.session_present, p.reason_code, p.properties),
    Publish5: _enc_publish5,
    Puback5: lambda p: _ack5(0x40, p.packet_id, p.reason_code, p.properties),
    Pubrec5: lambda p: _ack5(0x50, p.packet_id, p.reason_code, p.properties),
    Pubrel5: lambda p: _ack5(0x62, p.packet_id, p.reason_code, p.properties),
    Pubcomp5: lambda p: _ack5(0x70, p.packet_id, p.reason_code, p.properties),
    Subscribe5: _enc_subscribe5,
    Suback5: lambda p: encode_suback5(p.packet_id, p.reason_codes, p.properties),
    Unsubscribe5: _enc_unsubscribe5,
    Unsuback5: lambda p: encode_unsuback5(p.packet_id, p.reason_codes, p.properties),
    Disconnect5: lambda p: encode_disconnect5(p.reason_code, p.properties),
    Auth5: lambda p: encode_auth5(p.reason_code, p.properties),
}
# Registration: encode() of fanout.mqtt.encoder dispatches on the packet class.
_ENCODERS.update(ENCODERS_5)


def encode_within(pkt: Any, maximum_packet_size: int | None) -> bytes:
    """Encode an acknowledgement so that it fits the receiver's Maximum Packet Size.

    Drops the Reason String first, then User Properties from the last one backwards (those left keep
    their order), until the packet fits; the spec forbids sending either when it would make the packet
    exceed the maximum (see the module docstring). Other packets are encoded unchanged.

    Args:
        pkt: any packet; only those of ``ACKS_WITH_REASON_STRING`` are trimmed.
        maximum_packet_size: the receiver's Maximum Packet Size (whole packet, fixed header included;
            3.1.2.11.4), or ``None`` when it announced none.

    Returns:
        The encoded packet, at most ``maximum_packet_size`` bytes.

    Raises:
        ValueError: the packet does not fit even without them (the caller must not send it).
    """
    data = encode(pkt)
    if maximum_packet_size is None or len(data) <= maximum_packet_size:
        return data
    if isinstance(pkt, ACKS_WITH_REASON_STRING):
        props = pkt.properties
        if props.reason_string is not None:
            props = props.replace(reason_string=None)
            data = encode(replace(pkt, properties=props))
        users = props.user_properties
        while len(data) > maximum_packet_size and users:
            users = users[:-1]
            data = encode(replace(pkt, properties=props.replace(user_properties=users)))
    if len(data) > maximum_packet_size:
        raise ValueError(f"{type(pkt).__name__} is {len(data)} bytes, over the receiver's Maximum "
                         f"Packet Size {maximum_packet_size}")
    return data
