"""MQTT 5.0 properties (section 2.2.2): identifiers, data types, where each may appear, the value type.

Strategy:

- :data:`PROPERTY_SPECS` is table 2-4 of the spec as data: identifier, field name, data type, the
  packets (and the Will Properties of CONNECT) that may hold it. Everything else is derived from it:
  the fields of :class:`Properties`, placement checks, and the wire format in
  :mod:`fanout.mqtt.property_block`.
- :class:`Properties` is one frozen slotted value with a field per property (``None`` = absent) and
  two tuples for the properties that may repeat: ``user_properties`` (UTF-8 string pairs, in wire
  order: MQTT-3.3.2-18 requires the order kept) and ``subscription_identifiers`` (several only in a
  PUBLISH to a client, MQTT-3.3.4-3). :data:`EMPTY_PROPERTIES` is the shared "no properties" value, and
  a zero Property Length decodes to it without building anything.
- Wire rules, checked by :func:`fanout.mqtt.property_block.properties_at` while decoding (and by the
  constructor, which raises ``ValueError``):

  * an identifier not valid for its packet type, an unknown identifier, or a value cut off or not of
    the specified data type is a Malformed Packet, 0x81 (section 2.2.2.2);
  * a property other than User Property included more than once (Subscription Identifier may repeat
    only in PUBLISH), or a value the spec forbids (0 for Receive Maximum, Maximum Packet Size, Topic
    Alias, Subscription Identifier; not 0/1 for the one-byte flags; a wildcard in a Response Topic,
    MQTT-3.3.2-14) is a Protocol Error, 0x82; a Topic Alias of 0 carries 0x94 (Topic Alias invalid);
  * strings follow MQTT-1.5.4-1/2 (well-formed UTF-8, no surrogates, no U+0000), as in 3.1.1;
  * Authentication Data without an Authentication Method is a Protocol Error (3.1.2.11.10).
"""
from __future__ import annotations

from dataclasses import dataclass
from enum import IntEnum
from typing import Any, NamedTuple



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


def unchecked_properties(values: list[Any]) -> Properties:
    """Build from already validated values (the decoder), skipping :meth:`Properties.__new__`."""
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
