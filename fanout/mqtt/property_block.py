"""The wire format of an MQTT 5.0 property block (section 2.2.2): Property Length, then properties.

Strategy: both directions are driven by :data:`fanout.mqtt.properties.PROPERTY_SPECS`. The decoder
(:func:`properties_at`) looks each identifier up in a 128-entry list built from that table (field index,
holders and repeat bit masks, value reader, rule) and returns the shared ``EMPTY_PROPERTIES`` for a zero
Property Length without building anything; the rules it enforces, with the reason code each carries,
are listed in :mod:`fanout.mqtt.properties`. The encoder writes properties in identifier order (as
paho-mqtt does, so both produce the same bytes), User Properties in their own order. Like the 3.1.1
codec, a non-minimal variable byte integer is read (MQTT-1.5.5-1 binds the sender).
"""
from __future__ import annotations

from itertools import compress
from operator import is_not
from typing import Any, Callable

from .decoder import _bin_at, _str_at
from .encoder import encode_varint
from .errors import MalformedPacket, ProtocolError
from .properties import (
    EMPTY_PROPERTIES, PROPERTY_SPECS, DataType, Properties, PropertyHolder, PropertyId, PropertySpec,
    ValueRule, unchecked_properties,
)

T = DataType


# --- encoding

def _enc_utf8(s: str) -> bytes:
    b = s.encode("utf-8")
    return len(b).to_bytes(2, "big") + b


def _encoder(spec: PropertySpec) -> Callable[[Any], bytes]:
    ident = bytes((spec.id,))
    dt = spec.data_type
    if dt is T.BYTE:
        return lambda v: ident + bytes((v,))
    if dt is T.TWO_BYTE_INTEGER:
        return lambda v: ident + v.to_bytes(2, "big")
    if dt is T.FOUR_BYTE_INTEGER:
        return lambda v: ident + v.to_bytes(4, "big")
    if dt is T.VARIABLE_BYTE_INTEGER:
        return lambda v: b"".join(ident + encode_varint(n) for n in v)
    if dt is T.UTF8_STRING:
        return lambda v: ident + _enc_utf8(v)
    if dt is T.BINARY_DATA:
        return lambda v: ident + len(v).to_bytes(2, "big") + v
    return lambda v: b"".join(ident + _enc_utf8(k) + _enc_utf8(x) for k, x in v)


_ENCODERS = tuple(_encoder(s) for s in PROPERTY_SPECS)
_NONES = (None,) * len(PROPERTY_SPECS)


def encode_properties_body(props: Properties) -> bytes:
    """The properties without their Property Length prefix, in identifier order.

    For callers that send one set of properties in many packets (the broker forwarding a message):
    encode once, then pass the bytes to :func:`fanout.mqtt.encoder5.encode_publish5`.
    """
    if props is EMPTY_PROPERTIES:
        return b""
    # compress/map keep the scan over the 27 mostly-None values in C; an empty repeated field
    # (``()``) passes the filter and encodes to b"".
    return b"".join([enc(v) for enc, v in compress(zip(_ENCODERS, props), map(is_not, props, _NONES))])


def encode_properties(props: Properties) -> bytes:
    """The Property Length (variable byte integer) followed by the properties (section 2.2.2.1).

    Raises:
        ValueError: the properties encode to more than 268,435,455 bytes.
    """
    if props is EMPTY_PROPERTIES:
        return b"\x00"
    body = encode_properties_body(props)
    return encode_varint(len(body)) + body


ALIAS_ONLY_INTERNED = 1024  # aliases 1..1023 alone in a PUBLISH's properties share one Properties each
_alias_only: list[Properties | None] = [None] * ALIAS_ONLY_INTERNED


def alias_only_properties(alias: int) -> Properties:
    """The Properties of a PUBLISH that carries only Topic Alias ``alias`` (1..1023): one immutable value
    per alias, so the decoder builds nothing for the common aliased PUBLISH and :func:`is_alias_only`
    recognises it by identity."""
    props = _alias_only[alias]
    if props is None:
        props = _alias_only[alias] = EMPTY_PROPERTIES._replace(topic_alias=alias)
    return props


def is_alias_only(props: Properties) -> bool:
    """True when ``props`` is the interned value of :func:`alias_only_properties` (nothing to forward)."""
    alias = props.topic_alias
    return alias is not None and alias < ALIAS_ONLY_INTERNED and _alias_only[alias] is props


_ALIAS_PROPERTY = tuple(b"\x23" + a.to_bytes(2, "big") for a in range(ALIAS_ONLY_INTERNED))


def topic_alias_property(alias: int) -> bytes:
    """The encoded Topic Alias property (``23 <alias>``), to prepend to a shared properties body."""
    return _ALIAS_PROPERTY[alias] if alias < ALIAS_ONLY_INTERNED else b"\x23" + alias.to_bytes(2, "big")


def subscription_identifier_property(identifier: int) -> bytes:
    """The encoded Subscription Identifier property (``0b <varint>``)."""
    return b"\x0b" + encode_varint(identifier)


def message_expiry_property(seconds: int) -> bytes:
    """The encoded Message Expiry Interval property (``02 <u32>``): the remaining interval to send."""
    return b"\x02" + seconds.to_bytes(4, "big")


# --- decoding

def varint_at(buf: bytes, pos: int, stop: int, what: str) -> tuple[int, int]:
    """Read a variable byte integer (1.5.5) at ``pos``; return (value, next position)."""
    value = 0
    for shift in (0, 7, 14, 21):
        if pos >= stop:
            raise MalformedPacket(f"{what}: variable byte integer runs past the packet end")
        b = buf[pos]
        pos += 1
        value |= (b & 0x7F) << shift
        if b < 0x80:
            return value, pos
    raise MalformedPacket(f"{what}: variable byte integer longer than 4 bytes (1.5.5)")


def _protocol_error(reason: str, reason_code: int = 0x82) -> ProtocolError:
    exc = ProtocolError(reason)
    if reason_code != 0x82:
        exc.reason_code = reason_code
    return exc


def properties_at(buf: bytes, pos: int, stop: int, holder: PropertyHolder, what: str
                  ) -> tuple[Properties, int]:
    """Decode the Property Length and properties at ``pos`` (section 2.2.2).

    Args:
        buf: the received bytes; the block must end by ``stop``.
        pos: offset of the Property Length.
        stop: end of the enclosing packet body.
        holder: the packet type or WILL, for the placement rules.
        what: packet name for error messages.

    Returns:
        (properties, offset after the block).

    Raises:
        MalformedPacket: cut off, unknown or misplaced identifier, ill-formed value (0x81).
        ProtocolError: a repeated property or a value the spec forbids (0x82; 0x94 for Topic Alias 0).
    """
    if pos >= stop:
        raise MalformedPacket(f"{what}: property length missing (MQTT-2.2.2-1)")
    length = buf[pos]
    if not length:
        return EMPTY_PROPERTIES, pos + 1
    if length < 0x80:
        pos += 1
    else:
        length, pos = varint_at(buf, pos, stop, f"{what} property length")
    end = pos + length
    if end > stop:
        raise MalformedPacket(f"{what}: properties run past the packet end")
    values: list[Any] = [None] * _N
    seen = 0
    hbit = 1 << holder
    while pos < end:
        ident = buf[pos]
        entry = _LOOKUP[ident] if ident < 0x80 else None
        if entry is None:
            raise MalformedPacket(f"{what}: unknown property identifier {ident:#04x} (2.2.2.2)")
        index, spec, holders, repeats, read, rule = entry
        if not holders & hbit:
            raise MalformedPacket(
                f"{what}: {spec.name} ({ident:#04x}) is not valid in {holder.name} (2.2.2.2)")
        value, pos = read(buf, pos + 1, end, what, spec)
        if repeats & hbit:
            if values[index] is None:
                values[index] = [value]
            else:
                values[index].append(value)
        else:
            if seen >> ident & 1:
                raise _protocol_error(f"{what}: {spec.name} included more than once (2.2.2.2)")
            seen |= 1 << ident
            values[index] = (value,) if index == _SUB_ID else value
        if rule:
            _check_rule(spec, value, what)
    for index in (_USER, _SUB_ID):
        if type(values[index]) is list:
            values[index] = tuple(values[index])
        elif values[index] is None:
            values[index] = ()
    props = unchecked_properties(values)
    if props.authentication_data is not None and props.authentication_method is None:
        raise _protocol_error(f"{what}: Authentication Data without Authentication Method (3.1.2.11.10)")
    return props, end


def _cut_off(what: str, spec: PropertySpec) -> MalformedPacket:
    return MalformedPacket(f"{what}: {spec.name} runs past the properties end")


def _read_byte(buf: bytes, pos: int, end: int, what: str, spec: PropertySpec) -> tuple[int, int]:
    if pos >= end:
        raise _cut_off(what, spec)
    return buf[pos], pos + 1


def _read_u16(buf: bytes, pos: int, end: int, what: str, spec: PropertySpec) -> tuple[int, int]:
    if pos + 2 > end:
        raise _cut_off(what, spec)
    return (buf[pos] << 8) | buf[pos + 1], pos + 2


def _read_u32(buf: bytes, pos: int, end: int, what: str, spec: PropertySpec) -> tuple[int, int]:
    if pos + 4 > end:
        raise _cut_off(what, spec)
    return int.from_bytes(buf[pos:pos + 4], "big"), pos + 4


def _read_varint(buf: bytes, pos: int, end: int, what: str, spec: PropertySpec) -> tuple[int, int]:
    return varint_at(buf, pos, end, f"{what} {spec.name}")


def _text_at(buf: bytes, pos: int, end: int) -> tuple[str, int] | None:
    """A well-formed UTF-8 string without U+0000 at ``pos``, or None (the caller raises precisely)."""
    stop = pos + 2
    if stop > end:
        return None
    stop += (buf[pos] << 8) | buf[pos + 1]
    if stop > end:
        return None
    try:
        text = buf[pos + 2:stop].decode("utf-8")
    except UnicodeDecodeError:
        return None
    return None if "\x00" in text else (text, stop)


def _read_str(buf: bytes, pos: int, end: int, what: str, spec: PropertySpec) -> tuple[str, int]:
    # The error message (an f-string) is built only when the string is invalid.
    return _text_at(buf, pos, end) or _str_at(buf, pos, end, f"{what} {spec.name}")


def _read_bin(buf: bytes, pos: int, end: int, what: str, spec: PropertySpec) -> tuple[bytes, int]:
    return _bin_at(buf, pos, end, f"{what} {spec.name}")


def _read_pair(buf: bytes, pos: int, end: int, what: str, spec: PropertySpec
               ) -> tuple[tuple[str, str], int]:
    key, pos = _text_at(buf, pos, end) or _str_at(buf, pos, end, f"{what} user property name")
    value, pos = _text_at(buf, pos, end) or _str_at(buf, pos, end, f"{what} user property value")
    return (key, value), pos


_READERS: dict[DataType, Callable[[bytes, int, int, str, PropertySpec], tuple[Any, int]]] = {
    T.BYTE: _read_byte, T.TWO_BYTE_INTEGER: _read_u16, T.FOUR_BYTE_INTEGER: _read_u32,
    T.VARIABLE_BYTE_INTEGER: _read_varint, T.UTF8_STRING: _read_str, T.BINARY_DATA: _read_bin,
    T.UTF8_STRING_PAIR: _read_pair,
}
_N = len(PROPERTY_SPECS)
_INDEX = {s.id: i for i, s in enumerate(PROPERTY_SPECS)}
_USER = _INDEX[PropertyId.USER_PROPERTY]
_SUB_ID = _INDEX[PropertyId.SUBSCRIPTION_IDENTIFIER]
# Per identifier (0..127): (field index, spec, bit mask of holders, bit mask of holders where it may
# repeat, value reader, rule as a plain int), or None for an identifier the spec does not define.
_LOOKUP: list[tuple[int, PropertySpec, int, int, Any, int] | None] = [None] * 128
for _i, _s in enumerate(PROPERTY_SPECS):
    _LOOKUP[_s.id] = (_i, _s, sum(1 << h for h in _s.holders), sum(1 << h for h in _s.repeat_in),
                      _READERS[_s.data_type], int(_s.rule))


def _check_rule(spec: PropertySpec, value: Any, what: str) -> None:
    rule = spec.rule
    if rule is ValueRule.ZERO_OR_ONE:
        if value > 1:
            raise _protocol_error(f"{what}: {spec.name} is {value}, must be 0 or 1")
    elif rule is ValueRule.NOT_ZERO:
        if not value:
            # 3.3.2.3.4: a Topic Alias of 0 is answered with 0x94 (Topic Alias invalid).
            raise _protocol_error(f"{what}: {spec.name} is 0",
                                  0x94 if spec.id == PropertyId.TOPIC_ALIAS else 0x82)
    elif not value or "+" in value or "#" in value:
        raise _protocol_error(f"{what}: {spec.name} {value!r} is not a topic name (MQTT-3.3.2-14)")
