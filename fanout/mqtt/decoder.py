"""Per-packet-type body decoders and the first-byte dispatch table (used by :mod:`fanout.mqtt.codec`).

Strategy: see :mod:`fanout.mqtt.codec`. Each decoder has the signature
``decoder(buf: bytes, first: int, start: int, stop: int) -> Packet``: it reads the body
``buf[start:stop]`` by offset, checks every read against ``stop`` (``buf`` may continue with the next
packet), requires the body to be consumed exactly and raises :class:`MalformedPacket` (or
:class:`UnsupportedProtocol` for CONNECT) citing the MQTT 3.1.1 statement it enforces. Packets are built
with :func:`fanout.mqtt.packets.unchecked`: the wire checks here replace the constructor checks.
"""
from __future__ import annotations

from typing import Any, Callable

from .errors import MalformedPacket, UnsupportedProtocol
from .packets import (
    DISCONNECT, PINGREQ, PINGRESP, SUBACK_CODES, Connack, Connect, Puback, Pubcomp, Publish, Pubrec,
    Pubrel, Suback, Subscribe, Unsuback, Unsubscribe, Will, unchecked,
)

_new_publish = unchecked(Publish)
_new_puback = unchecked(Puback)
_new_connect = unchecked(Connect)
_new_will = unchecked(Will)
_new_connack = unchecked(Connack)
_new_subscribe = unchecked(Subscribe)
_new_suback = unchecked(Suback)
_new_unsubscribe = unchecked(Unsubscribe)

_Decoder = Callable[[bytes, int, int, int], Any]


def _str_at(buf: bytes, pos: int, stop: int, what: str) -> tuple[str, int]:
    """Read a UTF-8 string with its 2-byte length at ``pos``; return (string, next position)."""
    end = pos + 2
    if end > stop:
        raise MalformedPacket(f"{what}: length prefix runs past the packet end")
    end += (buf[pos] << 8) | buf[pos + 1]
    if end > stop:
        raise MalformedPacket(f"{what}: string runs past the packet end")
    try:
        s = buf[pos + 2:end].decode("utf-8")
    except UnicodeDecodeError:
        # MQTT-1.5.3-1: ill-formed UTF-8 (Python's strict decoder also refuses surrogates).
        raise MalformedPacket(f"{what}: ill-formed UTF-8 (MQTT-1.5.3-1)") from None
    if "\x00" in s:
        raise MalformedPacket(f"{what}: contains U+0000 (MQTT-1.5.3-2)")
    return s, end


def _bin_at(buf: bytes, pos: int, stop: int, what: str) -> tuple[bytes, int]:
    """Read binary data with its 2-byte length at ``pos``; return (bytes, next position)."""
    end = pos + 2
    if end > stop:
        raise MalformedPacket(f"{what}: length prefix runs past the packet end")
    end += (buf[pos] << 8) | buf[pos + 1]
    if end > stop:
        raise MalformedPacket(f"{what}: data runs past the packet end")
    return buf[pos + 2:end], end


def _pid_at(buf: bytes, pos: int, stop: int, what: str) -> int:
    if pos + 2 > stop:
        raise MalformedPacket(f"{what}: packet identifier missing")
    pid = (buf[pos] << 8) | buf[pos + 1]
    if not pid:
        # MQTT-2.3.1-1: SUBSCRIBE, UNSUBSCRIBE and PUBLISH (QoS > 0) need a non-zero identifier;
        # acknowledgements echo one, so 0 is never valid there either.
        raise MalformedPacket(f"{what}: packet identifier 0 (MQTT-2.3.1-1)")
    return pid


def _check_topic_name(topic: str, what: str) -> None:
    if not topic:
        raise MalformedPacket(f"{what}: empty topic name (MQTT-4.7.3-1)")
    if "+" in topic or "#" in topic:
        raise MalformedPacket(f"{what}: wildcard in topic name (MQTT-3.3.2-2)")


def _d_publish(buf: bytes, first: int, pos: int, stop: int) -> Publish:
    # Flags were validated by the first-byte table (QoS 3, DUP on QoS 0).
    tend = pos + 2
    if tend > stop:
        raise MalformedPacket("PUBLISH: topic length missing (MQTT-3.3.2-1)")
    tend += (buf[pos] << 8) | buf[pos + 1]
    qos = (first >> 1) & 3
    pid: int | None  # declared: compiled (mypyc) code checks each assignment against the first one's type
    if qos:
        body = tend + 2
        if body > stop:
            raise MalformedPacket("PUBLISH: topic or packet identifier runs past the packet end")
        pid = (buf[tend] << 8) | buf[tend + 1]
        if not pid:
            raise MalformedPacket("PUBLISH: packet identifier 0 (MQTT-2.3.1-1)")
    else:
        if tend > stop:
            raise MalformedPacket("PUBLISH: topic runs past the packet end")
        pid = None
        body = tend
    try:
        topic = buf[pos + 2:tend].decode("utf-8")
    except UnicodeDecodeError:
        raise MalformedPacket("PUBLISH: topic is ill-formed UTF-8 (MQTT-1.5.3-1)") from None
    # MQTT-3.3.2-2 (no wildcards), MQTT-1.5.3-2 (no U+0000), MQTT-4.7.3-1 (not empty): one combined
    # test on the hot path, the precise reason only when it fails.
    if "+" in topic or "#" in topic or "\x00" in topic or not topic:
        if "\x00" in topic:
            raise MalformedPacket("PUBLISH: topic contains U+0000 (MQTT-1.5.3-2)")
        _check_topic_name(topic, "PUBLISH")
    return _new_publish(topic, buf[body:stop], qos, first & 1 == 1, first & 8 == 8, pid)


_PUBACKS: list[Any] = [None] * 0x10000


def _d_puback(buf: bytes, first: int, pos: int, stop: int) -> Puback:
    if stop - pos != 2:
        raise MalformedPacket("PUBACK: remaining length must be 2")
    pid = (buf[pos] << 8) | buf[pos + 1]
    pkt = _PUBACKS[pid]
    if pkt is None:
        if not pid:
            raise MalformedPacket("PUBACK: packet identifier 0 (MQTT-2.3.1-1)")
        pkt = _PUBACKS[pid] = _new_puback(pid)
    return pkt


def _ack_decoder(cls: type, name: str) -> _Decoder:
    build = unchecked(cls)

    def decode_ack(buf: bytes, first: int, pos: int, stop: int) -> Any:
        if stop - pos != 2:
            raise MalformedPacket(f"{name}: remaining length must be 2")
        return build(_pid_at(buf, pos, stop, name))

    return decode_ack


def _d_connect(buf: bytes, first: int, pos: int, stop: int) -> Connect:
    name, p = _str_at(buf, pos, stop, "CONNECT protocol name")
    if p >= stop:
        raise MalformedPacket("CONNECT: protocol level missing")
    level = buf[p]
    if name != "MQTT" or level != 4:
        # MQTT-3.1.2-1 (name must be "MQTT"), MQTT-3.1.2-2 (unsupported level -> CONNACK 0x01).
        raise UnsupportedProtocol(
            f"CONNECT: unsupported protocol {name!r} level {level} (MQTT-3.1.2-1, MQTT-3.1.2-2)",
            name, level)
    if p + 4 > stop:
        raise MalformedPacket("CONNECT: connect flags or keep alive missing")
    flags = buf[p + 1]
    keepalive = (buf[p + 2] << 8) | buf[p + 3]
    if flags & 0x01:
        raise MalformedPacket("CONNECT: reserved flag set (MQTT-3.1.2-3)")
    will_flag = flags & 0x04
    will_qos = (flags >> 3) & 3
    will_retain = flags & 0x20 == 0x20
    if not will_flag and (will_qos or will_retain):
        raise MalformedPacket(
            "CONNECT: will QoS/retain set without will flag (MQTT-3.1.2-11, -13, -15)")
    if will_qos == 3:
        raise MalformedPacket("CONNECT: will QoS 3 (MQTT-3.1.2-14)")
    if flags & 0x40 and not flags & 0x80:
        raise MalformedPacket("CONNECT: password flag without username flag (MQTT-3.1.2-22)")
    # MQTT-3.1.3-1: payload order is client id, will topic, will message, username, password;
    # MQTT-3.1.3-3/4: the client id is always present and is a UTF-8 string.
    client_id, p = _str_at(buf, p + 4, stop, "CONNECT client id")
    will = None
    if will_flag:
        # MQTT-3.1.2-9: will topic and will message present; MQTT-3.1.3-10: will topic is UTF-8.
        will_topic, p = _str_at(buf, p, stop, "CONNECT will topic")
        _check_topic_name(will_topic, "CONNECT will topic")
        will_payload, p = _bin_at(buf, p, stop, "CONNECT will message")
        will = _new_will(will_topic, will_payload, will_qos, will_retain)
    username = password = None
    if flags & 0x80:
        username, p = _str_at(buf, p, stop, "CONNECT username")  # MQTT-3.1.2-19, MQTT-3.1.3-11
    if flags & 0x40:
        password, p = _bin_at(buf, p, stop, "CONNECT password")  # MQTT-3.1.2-21
    if p != stop:
        # MQTT-3.1.2-11/18/20: fields whose flag is 0 must not be present.
        raise MalformedPacket("CONNECT: bytes after the last field announced by the flags")
    return _new_connect(client_id, flags & 0x02 == 0x02, keepalive, username, password, will,
                        name, level)


def _d_connack(buf: bytes, first: int, pos: int, stop: int) -> Connack:
    if stop - pos != 2:
        raise MalformedPacket("CONNACK: remaining length must be 2")
    ack_flags, code = buf[pos], buf[pos + 1]
    if ack_flags & 0xFE:
        raise MalformedPacket("CONNACK: reserved acknowledge flags set (section 3.2.2.1)")
    if code > 5:
        raise MalformedPacket(f"CONNACK: reserved return code {code} (section 3.2.2.3)")
    if ack_flags and code:
        raise MalformedPacket("CONNACK: session present with a refusal (MQTT-3.2.2-4)")
    return _new_connack(ack_flags == 1, code)


def _d_subscribe(buf: bytes, first: int, pos: int, stop: int) -> Subscribe:
    pid = _pid_at(buf, pos, stop, "SUBSCRIBE")
    p = pos + 2
    topics = []
    # Filter syntax (wildcard placement, empty filter) is not checked here: the broker refuses such
    # a filter with SUBACK 0x80 (topics.validate_topic_filter) instead of closing the connection.
    while p < stop:
        topic_filter, p = _str_at(buf, p, stop, "SUBSCRIBE topic filter")  # MQTT-3.8.3-1
        if p >= stop:
            raise MalformedPacket("SUBSCRIBE: requested QoS missing")
        qos = buf[p]
        if qos > 2:
            raise MalformedPacket(
                "SUBSCRIBE: requested QoS byte has reserved bits set or QoS 3 (MQTT-3.8.3-4)")
        topics.append((topic_filter, qos))
        p += 1
    if not topics:
        raise MalformedPacket("SUBSCRIBE without topic filters (MQTT-3.8.3-3)")
    return _new_subscribe(pid, tuple(topics))


def _d_suback(buf: bytes, first: int, pos: int, stop: int) -> Suback:
    pid = _pid_at(buf, pos, stop, "SUBACK")
    codes = tuple(buf[pos + 2:stop])
    if not codes:
        raise MalformedPacket("SUBACK without return codes (MQTT-3.9.3-1)")
    for code in codes:
        if code not in SUBACK_CODES:
            raise MalformedPacket(f"SUBACK: reserved return code {code:#x} (MQTT-3.9.3-2)")
    return _new_suback(pid, codes)


def _d_unsubscribe(buf: bytes, first: int, pos: int, stop: int) -> Unsubscribe:
    pid = _pid_at(buf, pos, stop, "UNSUBSCRIBE")
    p = pos + 2
    topics = []
    while p < stop:
        topic_filter, p = _str_at(buf, p, stop, "UNSUBSCRIBE topic filter")  # MQTT-3.10.3-1
        topics.append(topic_filter)
    if not topics:
        raise MalformedPacket("UNSUBSCRIBE without topic filters (MQTT-3.10.3-2)")
    return _new_unsubscribe(pid, tuple(topics))


def _empty_decoder(singleton: Any, name: str) -> _Decoder:
    def decode_empty(buf: bytes, first: int, pos: int, stop: int) -> Any:
        if stop != pos:
            raise MalformedPacket(f"{name}: remaining length must be 0")
        return singleton

    return decode_empty


_BY_TYPE: dict[int, tuple[str, _Decoder, int]] = {
    # packet type -> (name, decoder, required flags; -1 = PUBLISH flags)
    1: ("CONNECT", _d_connect, 0),
    2: ("CONNACK", _d_connack, 0),
    3: ("PUBLISH", _d_publish, -1),
    4: ("PUBACK", _d_puback, 0),
    5: ("PUBREC", _ack_decoder(Pubrec, "PUBREC"), 0),
    6: ("PUBREL", _ack_decoder(Pubrel, "PUBREL"), 2),  # MQTT-3.6.1-1
    7: ("PUBCOMP", _ack_decoder(Pubcomp, "PUBCOMP"), 0),
    8: ("SUBSCRIBE", _d_subscribe, 2),  # MQTT-3.8.1-1
    9: ("SUBACK", _d_suback, 0),
    10: ("UNSUBSCRIBE", _d_unsubscribe, 2),  # MQTT-3.10.1-1
    11: ("UNSUBACK", _ack_decoder(Unsuback, "UNSUBACK"), 0),
    12: ("PINGREQ", _empty_decoder(PINGREQ, "PINGREQ"), 0),
    13: ("PINGRESP", _empty_decoder(PINGRESP, "PINGRESP"), 0),
    14: ("DISCONNECT", _empty_decoder(DISCONNECT, "DISCONNECT"), 0),  # MQTT-3.14.1-1
}


def _first_byte_table() -> tuple[list[_Decoder | None], list[str]]:
    decoders: list[_Decoder | None] = [None] * 256
    errors = [""] * 256
    for byte in range(256):
        ptype, flags = byte >> 4, byte & 0x0F
        if ptype not in _BY_TYPE:
            errors[byte] = f"reserved packet type {ptype} (section 2.2.1)"
            continue
        name, decoder, required = _BY_TYPE[ptype]
        if required == -1:
            if flags & 0x06 == 0x06:
                errors[byte] = "PUBLISH with QoS 3 (MQTT-3.3.1-4)"
                continue
            if flags & 0x08 and not flags & 0x06:
                errors[byte] = "PUBLISH QoS 0 with DUP set (MQTT-3.3.1-2)"
                continue
        elif flags != required:
            # MQTT-2.2.2-1: reserved flag bits must have the listed value; MQTT-2.2.2-2: close.
            errors[byte] = (f"{name}: fixed header flags {flags:#06b}, expected {required:#06b}"
                            " (MQTT-2.2.2-2)")
            continue
        decoders[byte] = decoder
    return decoders, errors


DECODERS, FIRST_BYTE_ERRORS = _first_byte_table()
# Remaining length a packet type must announce (-1: variable), to refuse e.g. a PINGREQ announcing a
# body before that body arrives.
_FIXED_BY_TYPE = {2: 2, 4: 2, 5: 2, 6: 2, 7: 2, 11: 2, 12: 0, 13: 0, 14: 0}
FIXED_REMAINING_LENGTH = [_FIXED_BY_TYPE.get(b >> 4, -1) for b in range(256)]
