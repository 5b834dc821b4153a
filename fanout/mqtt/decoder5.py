"""MQTT 5.0 body decoders and the per-protocol-level first-byte tables used by :mod:`fanout.mqtt.codec`.

Strategy: the decoders have the signature of :mod:`fanout.mqtt.decoder`'s
(``decoder(buf, first, start, stop) -> packet``), read by offset, check every read against ``stop`` and
build packets with ``unchecked``. The 256-entry first-byte tables of MQTT 5 are derived from the 3.1.1
table (the fixed-header flag rules are the same, section 2.1.3) plus AUTH, so a flag rule lives in one
place. Errors follow section 4.13 and the definitions of 1.2: bytes that cannot be parsed are a
:class:`MalformedPacket` (0x81); a parsed packet holding data the protocol forbids is a
:class:`ProtocolError` (0x82), e.g. a reason code not in the packet's list, a wildcard in a topic name
(MQTT-3.3.2-2), Retain Handling 3, a SUBSCRIBE without filters.

Protocol levels (:data:`DECODER_TABLES`):

- ``4``: the MQTT 3.1.1 tables of :mod:`fanout.mqtt.decoder`, untouched (a level-5 CONNECT is refused
  with :class:`UnsupportedProtocol`).
- ``5``: MQTT 5; a CONNECT is decoded by its own protocol level field (4 or 5).
- ``None``: not negotiated yet (a server before the CONNECT): packets decode as 3.1.1, and a CONNECT is
  decoded by its own protocol level field (4 or 5) and returned; the reader then switches to that level's
  table for the rest of the stream (bytes after the CONNECT in the same chunk included). Returned, not
  raised: in compiled code an exception costs a traceback frame per function it crosses.
"""
from __future__ import annotations

from typing import Any, Callable

from .decoder import (
    DECODERS, FIRST_BYTE_ERRORS, FIXED_REMAINING_LENGTH, _bin_at, _d_connect, _pid_at, _str_at,
)
from .errors import MalformedPacket, ProtocolError
from .packets import PINGREQ, PINGRESP, unchecked
from .packets5 import (
    SHARED_PREFIX, Auth5, Connack5, Connect5, Disconnect5, Puback5, Pubcomp5, Publish5, Pubrec5,
    Pubrel5, Suback5, Subscribe5, Subscription, Unsuback5, Unsubscribe5, Will5,
)
from .properties import EMPTY_PROPERTIES, PropertyHolder
from .property_block import ALIAS_ONLY_INTERNED, alias_only_properties, properties_at
from .reason_codes import (
    AUTH_REASON_CODES, CONNACK_REASON_CODES, DISCONNECT_REASON_CODES, PUBACK_REASON_CODES,
    PUBCOMP_REASON_CODES, PUBREC_REASON_CODES, PUBREL_REASON_CODES, SUBACK_REASON_CODES,
    UNSUBACK_REASON_CODES,
)

_Decoder = Callable[[bytes, int, int, int], Any]
H = PropertyHolder

_new_connect = unchecked(Connect5)
_new_will = unchecked(Will5)
_new_connack = unchecked(Connack5)
_new_publish = unchecked(Publish5)
_new_subscription = unchecked(Subscription)
_new_subscribe = unchecked(Subscribe5)
_new_unsubscribe = unchecked(Unsubscribe5)


def _check_topic_name(topic: str, what: str) -> None:
    if "\x00" in topic:
        raise MalformedPacket(f"{what}: topic contains U+0000 (MQTT-1.5.4-2)")
    if "+" in topic or "#" in topic:
        raise ProtocolError(f"{what}: wildcard in topic name (MQTT-3.3.2-2)")


def _d_connect5(buf: bytes, first: int, pos: int, stop: int) -> Connect5:
    """Body of a level-5 CONNECT; ``pos`` is just after the protocol level byte."""
    if pos + 3 > stop:
        raise MalformedPacket("CONNECT: connect flags or keep alive missing")
    flags = buf[pos]
    keepalive = (buf[pos + 1] << 8) | buf[pos + 2]
    if flags & 0x01:
        raise MalformedPacket("CONNECT: reserved flag set (MQTT-3.1.2-3)")
    will_flag = flags & 0x04
    will_qos = (flags >> 3) & 3
    will_retain = flags & 0x20 == 0x20
    if not will_flag and (will_qos or will_retain):
        raise MalformedPacket("CONNECT: will QoS/retain set without will flag (MQTT-3.1.2-11, -13)")
    if will_qos == 3:
        raise MalformedPacket("CONNECT: will QoS 3 (3.1.2.6)")
    props, p = properties_at(buf, pos + 3, stop, H.CONNECT, "CONNECT")
    # MQTT-3.1.3-1: client id, will properties, will topic, will payload, user name, password.
    client_id, p = _str_at(buf, p, stop, "CONNECT client id")
    will = None
    if will_flag:
        will_props, p = properties_at(buf, p, stop, H.WILL, "CONNECT will")
        will_topic, p = _str_at(buf, p, stop, "CONNECT will topic")
        if not will_topic:
            raise ProtocolError("CONNECT: empty will topic (MQTT-4.7.3-1)")
        _check_topic_name(will_topic, "CONNECT will topic")
        will_payload, p = _bin_at(buf, p, stop, "CONNECT will payload")
        will = _new_will(will_topic, will_payload, will_qos, will_retain, will_props)
    username = password = None
    if flags & 0x80:
        username, p = _str_at(buf, p, stop, "CONNECT user name")  # MQTT-3.1.2-17
    if flags & 0x40:
        password, p = _bin_at(buf, p, stop, "CONNECT password")  # MQTT-3.1.2-19
    if p != stop:
        # MQTT-3.1.2-16/18: fields whose flag is 0 must not be present.
        raise MalformedPacket("CONNECT: bytes after the last field announced by the flags")
    return _new_connect(client_id, flags & 0x02 == 0x02, keepalive, username, password, will, props)


def _connect_level(buf: bytes, pos: int, stop: int) -> tuple[str, int, int]:
    name, p = _str_at(buf, pos, stop, "CONNECT protocol name")
    if p >= stop:
        raise MalformedPacket("CONNECT: protocol level missing")
    return name, buf[p], p + 1


def _d_connect_any(buf: bytes, first: int, pos: int, stop: int) -> Any:
    """A CONNECT of level 4 or 5, decoded by its own protocol level field."""
    name, level, p = _connect_level(buf, pos, stop)
    if name == "MQTT" and level == 5:
        return _d_connect5(buf, first, p, stop)
    return _d_connect(buf, first, pos, stop)  # level 4, or raises UnsupportedProtocol


def _d_connack5(buf: bytes, first: int, pos: int, stop: int) -> Connack5:
    if stop - pos < 3:
        raise MalformedPacket("CONNACK: flags, reason code or property length missing")
    ack_flags, code = buf[pos], buf[pos + 1]
    if ack_flags & 0xFE:
        raise MalformedPacket("CONNACK: reserved acknowledge flags set (MQTT-3.2.2-1)")
    if code not in CONNACK_REASON_CODES:
        raise ProtocolError(f"CONNACK: reason code {code:#04x} is not a CONNACK code (MQTT-3.2.2-8)")
    if ack_flags and code:
        raise ProtocolError("CONNACK: session present with a refusal (MQTT-3.2.2-6)")
    props, p = properties_at(buf, pos + 2, stop, H.CONNACK, "CONNACK")
    if p != stop:
        raise MalformedPacket("CONNACK: bytes after the properties")
    return _new_connack(ack_flags == 1, code, props)


def _d_publish5(buf: bytes, first: int, pos: int, stop: int) -> Publish5:
    # Flags were validated by the first-byte table (QoS 3, DUP on QoS 0).
    tend = pos + 2
    if tend > stop:
        raise MalformedPacket("PUBLISH: topic length missing")
    tend += (buf[pos] << 8) | buf[pos + 1]
    qos = (first >> 1) & 3
    if qos:
        p = tend + 2
        if p > stop:
            raise MalformedPacket("PUBLISH: topic or packet identifier runs past the packet end")
        pid = (buf[tend] << 8) | buf[tend + 1]
        if not pid:
            raise MalformedPacket("PUBLISH: packet identifier 0 (MQTT-2.2.1-3)")
    else:
        p = tend
        pid = None
    if p >= stop:
        raise MalformedPacket("PUBLISH: property length missing (MQTT-2.2.2-1)")
    if not buf[p]:
        props = EMPTY_PROPERTIES
        p += 1
    elif buf[p] == 3 and p + 4 <= stop and buf[p + 1] == 0x23 \
            and 0 < (alias := (buf[p + 2] << 8) | buf[p + 3]) < ALIAS_ONLY_INTERNED:
        props = alias_only_properties(alias)  # a Topic Alias alone: the aliased PUBLISH of every stream
        p += 4
        if tend == pos + 2:  # and an empty topic, which the alias stands for: nothing in it to check
            return _new_publish("", buf[p:stop], qos, first & 1 == 1, first & 8 == 8, pid, props)
    else:
        props, p = properties_at(buf, p, stop, H.PUBLISH, "PUBLISH")
    try:
        topic = buf[pos + 2:tend].decode("utf-8")
    except UnicodeDecodeError:
        raise MalformedPacket("PUBLISH: topic is ill-formed UTF-8 (MQTT-1.5.4-1)") from None
    if "+" in topic or "#" in topic or "\x00" in topic or not topic:
        _check_topic_name(topic, "PUBLISH")
        if not topic and props.topic_alias is None:
            raise ProtocolError("PUBLISH: empty topic name without a Topic Alias (3.3.2.3.4)")
    return _new_publish(topic, buf[p:stop], qos, first & 1 == 1, first & 8 == 8, pid, props)


def _ack5_decoder(cls: type, name: str, codes: frozenset[int], holder: PropertyHolder,
                  intern: bool = False) -> _Decoder:
    build = unchecked(cls)
    # The short form (remaining length 2: success, no properties) is what nearly every PUBACK is;
    # like the 3.1.1 PUBACKs, those immutable values are interned per packet identifier.
    interned: list[Any] = [None] * 0x10000 if intern else []

    def decode_ack5(buf: bytes, first: int, pos: int, stop: int) -> Any:
        n = stop - pos
        if n == 2 and interned:
            pid = (buf[pos] << 8) | buf[pos + 1]
            pkt = interned[pid]
            if pkt is None:
                if not pid:
                    raise MalformedPacket(f"{name}: packet identifier 0 (MQTT-2.2.1-3)")
                pkt = interned[pid] = build(pid, 0, EMPTY_PROPERTIES)
            return pkt
        pid = _pid_at(buf, pos, stop, name)
        if n == 2:
            return build(pid, 0, EMPTY_PROPERTIES)
        code = buf[pos + 2]
        if code not in codes:
            raise ProtocolError(f"{name}: reason code {code:#04x} is not a {name} code")
        if n == 3:
            # "If the Remaining Length is less than 4 there is no Property Length" (3.4.2.2.1).
            return build(pid, code, EMPTY_PROPERTIES)
        props, p = properties_at(buf, pos + 3, stop, holder, name)
        if p != stop:
            raise MalformedPacket(f"{name}: bytes after the properties")
        return build(pid, code, props)

    return decode_ack5


def _code_list_decoder(cls: type, name: str, codes: frozenset[int], holder: PropertyHolder
                       ) -> _Decoder:
    build = unchecked(cls)

    def decode_code_list(buf: bytes, first: int, pos: int, stop: int) -> Any:
        pid = _pid_at(buf, pos, stop, name)
        props, p = properties_at(buf, pos + 2, stop, holder, name)
        found = tuple(buf[p:stop])
        if not found:
            raise ProtocolError(f"{name} without reason codes (one per topic filter)")
        for code in found:
            if code not in codes:
                raise ProtocolError(f"{name}: reason code {code:#04x} is not a {name} code")
        return build(pid, found, props)

    return decode_code_list


def _d_subscribe5(buf: bytes, first: int, pos: int, stop: int) -> Subscribe5:
    pid = _pid_at(buf, pos, stop, "SUBSCRIBE")
    props, p = properties_at(buf, pos + 2, stop, H.SUBSCRIBE, "SUBSCRIBE")
    subs = []
    # Filter syntax is not checked here: the broker answers a bad filter with SUBACK 0x8F.
    while p < stop:
        topic_filter, p = _str_at(buf, p, stop, "SUBSCRIBE topic filter")
        if p >= stop:
            raise MalformedPacket("SUBSCRIBE: subscription options missing")
        options = buf[p]
        p += 1
        if options & 0xC0:
            raise MalformedPacket("SUBSCRIBE: reserved subscription option bits set (MQTT-3.8.3-5)")
        qos = options & 3
        if qos == 3:
            raise ProtocolError("SUBSCRIBE: maximum QoS 3 (3.8.3.1)")
        retain_handling = options >> 4
        if retain_handling == 3:
            raise ProtocolError("SUBSCRIBE: Retain Handling 3 (3.8.3.1)")
        no_local = options & 4 == 4
        if no_local and topic_filter.startswith(SHARED_PREFIX):
            raise ProtocolError("SUBSCRIBE: No Local on a shared subscription (MQTT-3.8.3-4)")
        subs.append(_new_subscription(topic_filter, qos, no_local, options & 8 == 8, retain_handling))
    if not subs:
        raise ProtocolError("SUBSCRIBE without topic filters (MQTT-3.8.3-2)")
    return _new_subscribe(pid, tuple(subs), props)


def _d_unsubscribe5(buf: bytes, first: int, pos: int, stop: int) -> Unsubscribe5:
    pid = _pid_at(buf, pos, stop, "UNSUBSCRIBE")
    props, p = properties_at(buf, pos + 2, stop, H.UNSUBSCRIBE, "UNSUBSCRIBE")
    topics = []
    while p < stop:
        topic_filter, p = _str_at(buf, p, stop, "UNSUBSCRIBE topic filter")
        topics.append(topic_filter)
    if not topics:
        raise ProtocolError("UNSUBSCRIBE without topic filters (MQTT-3.10.3-2)")
    return _new_unsubscribe(pid, tuple(topics), props)


def _code_props_decoder(cls: type, name: str, codes: frozenset[int], holder: PropertyHolder,
                        needs_method: bool = False) -> _Decoder:
    """DISCONNECT and AUTH: optional reason code, then optional properties."""
    build = unchecked(cls)
    bare = cls()

    def decode_code_props(buf: bytes, first: int, pos: int, stop: int) -> Any:
        # Remaining length 0: reason code 0x00 and no properties (3.14.2.1, 3.15.2.1); "If the
        # Remaining Length is less than 2, a value of 0 is used" for the Property Length (3.14.2.2.1).
        if pos == stop:
            return bare
        code = buf[pos]
        if code not in codes:
            raise ProtocolError(f"{name}: reason code {code:#04x} is not a {name} code")
        if stop - pos == 1:
            props, p = EMPTY_PROPERTIES, stop
        else:
            props, p = properties_at(buf, pos + 1, stop, holder, name)
        if p != stop:
            raise MalformedPacket(f"{name}: bytes after the properties")
        if needs_method and props.authentication_method is None:
            # 3.15.2.2.2: "It is a Protocol Error to omit the Authentication Method" (an AUTH other
            # than the remaining-length-0 success form).
            raise ProtocolError(f"{name} without Authentication Method (3.15.2.2.2)")
        return build(code, props)

    return decode_code_props


def _empty(singleton: Any, name: str) -> _Decoder:
    def decode_empty(buf: bytes, first: int, pos: int, stop: int) -> Any:
        if stop != pos:
            raise MalformedPacket(f"{name}: remaining length must be 0")
        return singleton

    return decode_empty


_BY_TYPE_5: dict[int, _Decoder] = {
    1: _d_connect_any,
    2: _d_connack5,
    3: _d_publish5,
    4: _ack5_decoder(Puback5, "PUBACK", PUBACK_REASON_CODES, H.PUBACK, intern=True),
    5: _ack5_decoder(Pubrec5, "PUBREC", PUBREC_REASON_CODES, H.PUBREC),
    6: _ack5_decoder(Pubrel5, "PUBREL", PUBREL_REASON_CODES, H.PUBREL),
    7: _ack5_decoder(Pubcomp5, "PUBCOMP", PUBCOMP_REASON_CODES, H.PUBCOMP),
    8: _d_subscribe5,
    9: _code_list_decoder(Suback5, "SUBACK", SUBACK_REASON_CODES, H.SUBACK),
    10: _d_unsubscribe5,
    11: _code_list_decoder(Unsuback5, "UNSUBACK", UNSUBACK_REASON_CODES, H.UNSUBACK),
    12: _empty(PINGREQ, "PINGREQ"),
    13: _empty(PINGRESP, "PINGRESP"),
    14: _code_props_decoder(Disconnect5, "DISCONNECT", DISCONNECT_REASON_CODES, H.DISCONNECT),
    15: _code_props_decoder(Auth5, "AUTH", AUTH_REASON_CODES, H.AUTH, needs_method=True),
}


def _tables_5() -> tuple[list[_Decoder | None], list[str], list[int]]:
    decoders: list[_Decoder | None] = [None] * 256
    errors = list(FIRST_BYTE_ERRORS)
    for byte in range(256):
        ptype = byte >> 4
        if ptype == 15:
            # AUTH: reserved flags 0 (section 2.1.3); type 15 is reserved in 3.1.1.
            if byte & 0x0F:
                errors[byte] = f"AUTH: fixed header flags {byte & 0x0F:#06b}, expected 0b0000 (2.1.3)"
            else:
                decoders[byte], errors[byte] = _BY_TYPE_5[15], ""
        elif DECODERS[byte] is not None:
            decoders[byte] = _BY_TYPE_5[ptype]
    # Only PINGREQ and PINGRESP keep a fixed remaining length: MQTT 5 acks may carry properties.
    fixed = [0 if byte >> 4 in (12, 13) else -1 for byte in range(256)]
    return decoders, errors, fixed


DECODERS_5, FIRST_BYTE_ERRORS_5, FIXED_REMAINING_LENGTH_5 = _tables_5()
_NEGOTIATING = list(DECODERS)
_NEGOTIATING[0x10] = _d_connect_any  # the reader takes the level from the packet

# protocol level -> (decoders, first-byte errors, fixed remaining lengths), see the module docstring.
DECODER_TABLES: dict[int | None, tuple[list[Any], list[str], list[int]]] = {
    4: (DECODERS, FIRST_BYTE_ERRORS, FIXED_REMAINING_LENGTH),
    5: (DECODERS_5, FIRST_BYTE_ERRORS_5, FIXED_REMAINING_LENGTH_5),
    None: (_NEGOTIATING, FIRST_BYTE_ERRORS, FIXED_REMAINING_LENGTH),
}
