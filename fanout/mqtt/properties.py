"""MQTT 5.0 properties (section 2.2.2): identifiers, data types, where each may appear, encode/decode.

Strategy:

- :data:`PROPERTY_SPECS` is table 2-4 of the spec as data: identifier, field name, data type, the
  packets (and the Will Properties of CONNECT) that may hold it. Everything else is derived from it:
  the fields of :class:`Properties`, the decoder's per-identifier lookup list, placement checks.
- :class:`Properties` is one frozen slotted value with a field per property (``None`` = absent) and
  two tuples for the properties that may repeat: ``user_properties`` (UTF-8 string pairs, in wire
  order: MQTT-3.3.2-18 requires the order kept) and ``subscription_identifiers`` (several only in a
  PUBLISH to a client, MQTT-3.3.4-3). :data:`EMPTY_PROPERTIES` is the shared "no properties" value, and
  a zero Property Length decodes to it without building anything.
- Wire rules, checked while decoding (and by the constructor, which raises ``ValueError``):

  * an identifier not valid for its packet type, an unknown identifier, or a value cut off or not of
    the specified data type is a Malformed Packet, 0x81 (section 2.2.2.2);
  * a property other than User Property included more than once (Subscription Identifier may repeat
    only in PUBLISH), or a value the spec forbids (0 for Receive Maximum, Maximum Packet Size, Topic
    Alias, Subscription Identifier; not 0/1 for the one-byte flags; a wildcard in a Response Topic,
    MQTT-3.3.2-14) is a Protocol Error, 0x82; a Topic Alias of 0 carries 0x94 (Topic Alias invalid);
  * strings follow MQTT-1.5.4-1/2 (well-formed UTF-8, no surrogates, no U+0000), as in 3.1.1;
  * Authentication Data without an Authentication Method is a Protocol Error (3.1.2.11.10).

- Like the 3.1.1 codec, a non-minimal variable byte integer (MQTT-1.5.5-1 binds the sender) is read.
"""
from __future__ import annotations

from dataclasses import dataclass
from enum import IntEnum
from itertools import compress
from operator import is_not
from typing import Any, Callable, NamedTuple

from .decoder import _bin_at, _str_at
from .encoder import encode_varint
from .errors import MalformedPacket, ProtocolError


class PropertyHolder(IntEnum):
    """What holds a property block: a packet type (its fixed-header number), or WILL (CONNECT's will)."""

    CONNECT = 1
    CONNACK = 2
    PUBLISH = 3
    PUBACK = 4
    PUBREC = 5
    PUBREL = 6
    PUBCOMP = 7
    SUBSCRIBE = 8
    SUBACK = 9
    UNSUBSCRIBE = 10
    UNSUBACK = 11
    DISCONNECT = 14
    AUTH = 15
    WILL = 16


class PropertyId(IntEnum):
    """Property identifiers (table 2-4); all are one byte in MQTT 5.0."""

    PAYLOAD_FORMAT_INDICATOR = 0x01
    MESSAGE_EXPIRY_INTERVAL = 0x02
    CONTENT_TYPE = 0x03
    RESPONSE_TOPIC = 0x08
    CORRELATION_DATA = 0x09
    SUBSCRIPTION_IDENTIFIER = 0x0B
    SESSION_EXPIRY_INTERVAL = 0x11
    ASSIGNED_CLIENT_IDENTIFIER = 0x12
    SERVER_KEEP_ALIVE = 0x13
    AUTHENTICATION_METHOD = 0x15
    AUTHENTICATION_DATA = 0x16
    REQUEST_PROBLEM_INFORMATION = 0x17
    WILL_DELAY_INTERVAL = 0x18
    REQUEST_RESPONSE_INFORMATION = 0x19
    RESPONSE_INFORMATION = 0x1A
    SERVER_REFERENCE = 0x1C
    REASON_STRING = 0x1F
    RECEIVE_MAXIMUM = 0x21
    TOPIC_ALIAS_MAXIMUM = 0x22
    TOPIC_ALIAS = 0x23
    MAXIMUM_QOS = 0x24
    RETAIN_AVAILABLE = 0x25
    USER_PROPERTY = 0x26
    MAXIMUM_PACKET_SIZE = 0x27
    WILDCARD_SUBSCRIPTION_AVAILABLE = 0x28
    SUBSCRIPTION_IDENTIFIER_AVAILABLE = 0x29
    SHARED_SUBSCRIPTION_AVAILABLE = 0x2A


class DataType(IntEnum):
    """Data types of section 1.5."""

    BYTE = 1
    TWO_BYTE_INTEGER = 2
    FOUR_BYTE_INTEGER = 4
    VARIABLE_BYTE_INTEGER = 5
    UTF8_STRING = 6
    BINARY_DATA = 7
    UTF8_STRING_PAIR = 8


class ValueRule(IntEnum):
    """A constraint beyond the data type; a violation is a Protocol Error."""

    ANY = 0
    ZERO_OR_ONE = 1
    NOT_ZERO = 2
    TOPIC_NAME = 3


@dataclass(frozen=True, slots=True)
class PropertySpec:
    """One row of table 2-4."""

    id: PropertyId
    name: str
    data_type: DataType
    holders: frozenset[PropertyHolder]
    rule: ValueRule = ValueRule.ANY
    repeat_in: frozenset[PropertyHolder] = frozenset()


H = PropertyHolder
T = DataType
_PUB_WILL = frozenset((H.PUBLISH, H.WILL))
_ACKS = (H.PUBACK, H.PUBREC, H.PUBREL, H.PUBCOMP, H.SUBACK, H.UNSUBACK)
_ALL = frozenset(H)

PROPERTY_SPECS: tuple[PropertySpec, ...] = (
    PropertySpec(PropertyId(0x01), "payload_format_indicator", T.BYTE, _PUB_WILL,
                 ValueRule.ZERO_OR_ONE),
    PropertySpec(PropertyId(0x02), "message_expiry_interval", T.FOUR_BYTE_INTEGER, _PUB_WILL),
    PropertySpec(PropertyId(0x03), "content_type", T.UTF8_STRING, _PUB_WILL),
    PropertySpec(PropertyId(0x08), "response_topic", T.UTF8_STRING, _PUB_WILL, ValueRule.TOPIC_NAME),
    PropertySpec(PropertyId(0x09), "correlation_data", T.BINARY_DATA, _PUB_WILL),
    # MQTT-3.3.4-3: a PUBLISH to a client carries one Subscription Identifier per matching
    # subscription; "It is a Protocol Error to include the Subscription Identifier more than once"
    # in SUBSCRIBE (3.8.2.1.2).
    PropertySpec(PropertyId(0x0B), "subscription_identifiers", T.VARIABLE_BYTE_INTEGER,
                 frozenset((H.PUBLISH, H.SUBSCRIBE)), ValueRule.NOT_ZERO, frozenset((H.PUBLISH,))),
    PropertySpec(PropertyId(0x11), "session_expiry_interval", T.FOUR_BYTE_INTEGER,
                 frozenset((H.CONNECT, H.CONNACK, H.DISCONNECT))),
    PropertySpec(PropertyId(0x12), "assigned_client_identifier", T.UTF8_STRING, frozenset((H.CONNACK,))),
    PropertySpec(PropertyId(0x13), "server_keep_alive", T.TWO_BYTE_INTEGER, frozenset((H.CONNACK,))),
    PropertySpec(PropertyId(0x15), "authentication_method", T.UTF8_STRING,
                 frozenset((H.CONNECT, H.CONNACK, H.AUTH))),
    PropertySpec(PropertyId(0x16), "authentication_data", T.BINARY_DATA,
                 frozenset((H.CONNECT, H.CONNACK, H.AUTH))),
    PropertySpec(PropertyId(0x17), "request_problem_information", T.BYTE, frozenset((H.CONNECT,)),
                 ValueRule.ZERO_OR_ONE),
    PropertySpec(PropertyId(0x18), "will_delay_interval", T.FOUR_BYTE_INTEGER, frozenset((H.WILL,))),
    PropertySpec(PropertyId(0x19), "request_response_information", T.BYTE, frozenset((H.CONNECT,)),
                 ValueRule.ZERO_OR_ONE),
    PropertySpec(PropertyId(0x1A), "response_information", T.UTF8_STRING, frozenset((H.CONNACK,))),
    PropertySpec(PropertyId(0x1C), "server_reference", T.UTF8_STRING,
                 frozenset((H.CONNACK, H.DISCONNECT))),
    PropertySpec(PropertyId(0x1F), "reason_string", T.UTF8_STRING,
                 frozenset((H.CONNACK, *_ACKS, H.DISCONNECT, H.AUTH))),
    PropertySpec(PropertyId(0x21), "receive_maximum", T.TWO_BYTE_INTEGER,
                 frozenset((H.CONNECT, H.CONNACK)), ValueRule.NOT_ZERO),
    PropertySpec(PropertyId(0x22), "topic_alias_maximum", T.TWO_BYTE_INTEGER,
                 frozenset((H.CONNECT, H.CONNACK))),
    PropertySpec(PropertyId(0x23), "topic_alias", T.TWO_BYTE_INTEGER, frozenset((H.PUBLISH,)),
                 ValueRule.NOT_ZERO),
    PropertySpec(PropertyId(0x24), "maximum_qos", T.BYTE, frozenset((H.CONNACK,)), ValueRule.ZERO_OR_ONE),
    PropertySpec(PropertyId(0x25), "retain_available", T.BYTE, frozenset((H.CONNACK,)),
                 ValueRule.ZERO_OR_ONE),
    # "The User Property is allowed to appear multiple times to represent multiple name, value pairs."
    PropertySpec(PropertyId(0x26), "user_properties", T.UTF8_STRING_PAIR, _ALL, ValueRule.ANY, _ALL),
    PropertySpec(PropertyId(0x27), "maximum_packet_size", T.FOUR_BYTE_INTEGER,
                 frozenset((H.CONNECT, H.CONNACK)), ValueRule.NOT_ZERO),
    PropertySpec(PropertyId(0x28), "wildcard_subscription_available", T.BYTE, frozenset((H.CONNACK,)),
                 ValueRule.ZERO_OR_ONE),
    PropertySpec(PropertyId(0x29), "subscription_identifier_available", T.BYTE,
                 frozenset((H.CONNACK,)), ValueRule.ZERO_OR_ONE),
    PropertySpec(PropertyId(0x2A), "shared_subscription_available", T.BYTE, frozenset((H.CONNACK,)),
                 ValueRule.ZERO_OR_ONE),
)
SPEC_BY_NAME = {s.name: s for s in PROPERTY_SPECS}
_INDEX = {s.id: i for i, s in enumerate(PROPERTY_SPECS)}
_USER = _INDEX[PropertyId.USER_PROPERTY]
_SUB_ID = _INDEX[PropertyId.SUBSCRIPTION_IDENTIFIER]
_CORRELATION = _INDEX[PropertyId.CORRELATION_DATA]
_AUTH_DATA = _INDEX[PropertyId.AUTHENTICATION_DATA]
_AUTH_METHOD = _INDEX[PropertyId.AUTHENTICATION_METHOD]
_MAX = {T.BYTE: 0xFF, T.TWO_BYTE_INTEGER: 0xFFFF, T.FOUR_BYTE_INTEGER: 0xFFFF_FFFF,
        T.VARIABLE_BYTE_INTEGER: 268_435_455}
_REPEATED = (T.UTF8_STRING_PAIR, T.VARIABLE_BYTE_INTEGER)


class _PropertyFields(NamedTuple):
    payload_format_indicator: int | None = None
    message_expiry_interval: int | None = None
    content_type: str | None = None
    response_topic: str | None = None
    correlation_data: bytes | None = None
    subscription_identifiers: tuple[int, ...] = ()
    session_expiry_interval: int | None = None
    assigned_client_identifier: str | None = None
    server_keep_alive: int | None = None
    authentication_method: str | None = None
    authentication_data: bytes | None = None
    request_problem_information: int | None = None
    will_delay_interval: int | None = None
    request_response_information: int | None = None
    response_information: str | None = None
    server_reference: str | None = None
    reason_string: str | None = None
    receive_maximum: int | None = None
    topic_alias_maximum: int | None = None
    topic_alias: int | None = None
    maximum_qos: int | None = None
    retain_available: int | None = None
    user_properties: tuple[tuple[str, str], ...] = ()
    maximum_packet_size: int | None = None
    wildcard_subscription_available: int | None = None
    subscription_identifier_available: int | None = None
    shared_subscription_available: int | None = None


class Properties(_PropertyFields):
    """The properties of one packet or will; a field per property of table 2-4, ``None`` when absent.

    Byte-valued flags keep their wire value (0 or 1). ``user_properties`` keeps (name, value) pairs in
    wire order; ``subscription_identifiers`` holds every Subscription Identifier (at most one outside
    PUBLISH). Raises ``ValueError`` for a value outside its data type or a rule of the spec.

    Why a NamedTuple and not a slotted dataclass like the packets: with 27 optional fields, building
    one is a single C call (0.36 µs here) where a slotted dataclass sets 27 slots one by one (2.1 µs),
    and the encoder walks the values as the tuple itself. It is immutable and compares by value;
    test for "no properties" with ``props is EMPTY_PROPERTIES`` or :meth:`set_names`, not ``bool()``.
    """

    __slots__ = ()

    def __new__(cls, *args: Any, **kwargs: Any) -> Properties:
        values = list(_PropertyFields.__new__(cls, *args, **kwargs))
        users, sub_ids = values[_USER], values[_SUB_ID]
        if type(users) is not tuple or any(type(p) is not tuple for p in users):
            values[_USER] = tuple(tuple(p) if type(p) is list else p for p in users)
        if type(sub_ids) is not tuple:
            values[_SUB_ID] = tuple(sub_ids)
        for index in (_CORRELATION, _AUTH_DATA):
            if isinstance(values[index], (bytearray, memoryview)):
                values[index] = bytes(values[index])
        for spec, value in zip(PROPERTY_SPECS, values):
            if value is None or value == ():
                continue
            for item in (value if spec.data_type in _REPEATED else (value,)):
                problem = _value_problem(spec, item)
                if problem:
                    raise ValueError(f"{spec.name}: {problem}")
        if values[_AUTH_DATA] is not None and values[_AUTH_METHOD] is None:
            raise ValueError("authentication_data needs an authentication_method (3.1.2.11.10)")
        return tuple.__new__(cls, values)

    def __repr__(self) -> str:
        shown = ", ".join(f"{s.name}={v!r}" for s, v in zip(PROPERTY_SPECS, self)
                          if v is not None and v != ())
        return f"Properties({shown})"

    def set_names(self) -> list[str]:
        """Names of the properties present, in identifier order."""
        return [s.name for s, v in zip(PROPERTY_SPECS, self) if v is not None and v != ()]

    def replace(self, **changes: Any) -> Properties:
        """A copy with ``changes`` applied (validated like the constructor)."""
        return Properties(**{**self._asdict(), **changes})


if Properties._fields != tuple(s.name for s in PROPERTY_SPECS):
    raise RuntimeError("Properties fields and PROPERTY_SPECS disagree")


def _new_properties(values: list[Any]) -> Properties:
    """Build from already validated values (the decoder), without :meth:`Properties.__new__`."""
    return tuple.__new__(Properties, values)


EMPTY_PROPERTIES = Properties()


def _value_problem(spec: PropertySpec, value: Any) -> str:
    """Why ``value`` is not valid for ``spec`` (empty string when it is)."""
    dt = spec.data_type
    if dt in _MAX:
        if not isinstance(value, int):
            return f"must be an int, got {value!r}"
        if not 0 <= value <= _MAX[dt]:
            return f"{value} outside 0..{_MAX[dt]}"
    elif dt is T.UTF8_STRING:
        problem = _text_problem(value)
        if problem:
            return problem
    elif dt is T.BINARY_DATA:
        if type(value) is not bytes:
            return f"must be bytes, got {type(value).__name__}"
        if len(value) > 0xFFFF:
            return f"{len(value)} bytes, the maximum is 65535 (1.5.6)"
    else:  # a User Property pair
        if type(value) is not tuple or len(value) != 2:
            return f"a user property is a (name, value) pair, got {value!r}"
        for text in value:
            problem = _text_problem(text)
            if problem:
                return problem
    rule = spec.rule
    if rule is ValueRule.ZERO_OR_ONE and value > 1:
        return f"must be 0 or 1, got {value}"
    if rule is ValueRule.NOT_ZERO and value == 0:
        return "must not be 0"
    if rule is ValueRule.TOPIC_NAME and (not value or "+" in value or "#" in value):
        return f"{value!r} is not a topic name (no wildcards, not empty; MQTT-3.3.2-14)"
    return ""


def _text_problem(text: Any) -> str:
    if type(text) is not str:
        return f"must be a str, got {type(text).__name__}"
    try:
        size = len(text.encode("utf-8"))
    except UnicodeEncodeError:
        return "contains a surrogate (MQTT-1.5.4-1)"
    if "\x00" in text:
        return "contains U+0000 (MQTT-1.5.4-2)"
    if size > 0xFFFF:
        return f"{size} bytes of UTF-8, the maximum is 65535 (1.5.4)"
    return ""


def check_placement(props: Properties, holder: PropertyHolder) -> None:
    """Raise ``ValueError`` if ``props`` holds a property not valid in ``holder`` (or repeated there).

    Args:
        props: the properties of a packet being built.
        holder: the packet type (or WILL) they belong to.
    """
    if props is EMPTY_PROPERTIES:
        return
    for spec, value in zip(PROPERTY_SPECS, props):
        if value is None or value == ():
            continue
        if holder not in spec.holders:
            raise ValueError(f"{spec.name} is not valid in {holder.name} (section 2.2.2.2)")
        if spec.data_type is T.VARIABLE_BYTE_INTEGER and len(value) > 1 and holder not in spec.repeat_in:
            raise ValueError(f"{spec.name}: at most one in {holder.name}")


# ---------------------------------------------------------------------------------------------------
# encoding

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


def topic_alias_property(alias: int) -> bytes:
    """The encoded Topic Alias property (``23 <alias>``), to prepend to a shared properties body."""
    return b"\x23" + alias.to_bytes(2, "big")


def subscription_identifier_property(identifier: int) -> bytes:
    """The encoded Subscription Identifier property (``0b <varint>``)."""
    return b"\x0b" + encode_varint(identifier)


def message_expiry_property(seconds: int) -> bytes:
    """The encoded Message Expiry Interval property (``02 <u32>``): the remaining interval to send."""
    return b"\x02" + seconds.to_bytes(4, "big")


# ---------------------------------------------------------------------------------------------------
# decoding

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
    props = _new_properties(values)
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


def _read_str(buf: bytes, pos: int, end: int, what: str, spec: PropertySpec) -> tuple[str, int]:
    return _str_at(buf, pos, end, f"{what} {spec.name}")


def _read_bin(buf: bytes, pos: int, end: int, what: str, spec: PropertySpec) -> tuple[bytes, int]:
    return _bin_at(buf, pos, end, f"{what} {spec.name}")


def _read_pair(buf: bytes, pos: int, end: int, what: str, spec: PropertySpec
               ) -> tuple[tuple[str, str], int]:
    key, pos = _str_at(buf, pos, end, f"{what} user property name")
    value, pos = _str_at(buf, pos, end, f"{what} user property value")
    return (key, value), pos


_READERS: dict[DataType, Callable[[bytes, int, int, str, PropertySpec], tuple[Any, int]]] = {
    T.BYTE: _read_byte, T.TWO_BYTE_INTEGER: _read_u16, T.FOUR_BYTE_INTEGER: _read_u32,
    T.VARIABLE_BYTE_INTEGER: _read_varint, T.UTF8_STRING: _read_str, T.BINARY_DATA: _read_bin,
    T.UTF8_STRING_PAIR: _read_pair,
}
_N = len(PROPERTY_SPECS)
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
