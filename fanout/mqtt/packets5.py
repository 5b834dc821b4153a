"""MQTT 5.0 control packets as immutable values, beside the 3.1.1 ones of :mod:`fanout.mqtt.packets`.

Strategy: as in :mod:`fanout.mqtt.packets`, every packet is a frozen slotted dataclass whose constructor
validates (``ValueError``) and which the decoder builds through :func:`~fanout.mqtt.packets.unchecked`.
The classes carry a ``5`` suffix so code handling both versions tells them apart at a glance (PINGREQ
and PINGRESP are identical on the wire and reuse the 3.1.1 classes). Every packet that has properties
holds one :class:`~fanout.mqtt.properties.Properties` value (``EMPTY_PROPERTIES`` by default), and its
constructor refuses a property the spec does not allow in that packet (table 2-4). Reason codes are
checked against the packet's list (:mod:`fanout.mqtt.reason_codes`).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar, Union

from .packets import Pingreq, Pingresp, _check_packet_id, _check_qos
from .properties import EMPTY_PROPERTIES, Properties, PropertyHolder, check_placement
from .reason_codes import (
    AUTH_REASON_CODES, CONNACK_REASON_CODES, DISCONNECT_REASON_CODES, PUBACK_REASON_CODES,
    PUBCOMP_REASON_CODES, PUBREC_REASON_CODES, PUBREL_REASON_CODES, SUBACK_REASON_CODES,
    UNSUBACK_REASON_CODES,
)

PROTOCOL_LEVEL_5 = 5
SHARED_PREFIX = "$share/"


def _check_properties(props: Any, holder: PropertyHolder) -> None:
    if props is EMPTY_PROPERTIES:
        return
    if type(props) is not Properties:
        raise ValueError(f"properties must be a Properties value, got {type(props).__name__}")
    check_placement(props, holder)


def _check_code(code: Any, allowed: frozenset[int], name: str) -> None:
    if code not in allowed:
        raise ValueError(f"{code!r} is not a {name} reason code")


def _as_tuple(obj: Any, name: str) -> None:
    value = getattr(obj, name)
    if type(value) is not tuple:
        object.__setattr__(obj, name, tuple(value))


@dataclass(frozen=True, slots=True)
class Will5:
    """Will message of a CONNECT, with its Will Properties (3.1.3.2)."""

    topic: str
    payload: bytes
    qos: int = 0
    retain: bool = False
    properties: Properties = EMPTY_PROPERTIES

    def __post_init__(self) -> None:
        _check_qos(self.qos)
        _check_properties(self.properties, PropertyHolder.WILL)


@dataclass(frozen=True, slots=True)
class Connect5:
    """CONNECT at protocol level 5. Clean Start replaces 3.1.1's clean session (3.1.2.4).

    Unlike 3.1.1, a password may come without a user name (3.1.2.9).
    """

    client_id: str
    clean_start: bool = True
    keepalive: int = 60
    username: str | None = None
    password: bytes | None = None
    will: Will5 | None = None
    properties: Properties = EMPTY_PROPERTIES

    # Not fields: the same for every instance, and what Connect (3.1.1) exposes as fields.
    protocol_name = "MQTT"
    protocol_level = PROTOCOL_LEVEL_5

    def __post_init__(self) -> None:
        if not 0 <= self.keepalive <= 0xFFFF:
            raise ValueError(f"keepalive must be in 0..65535, got {self.keepalive!r}")
        if self.will is not None and type(self.will) is not Will5:
            raise ValueError("an MQTT 5 CONNECT takes a Will5")
        _check_properties(self.properties, PropertyHolder.CONNECT)


@dataclass(frozen=True, slots=True)
class Connack5:
    """CONNACK: the server's answer to a CONNECT, with a reason code (3.2.2.2)."""

    session_present: bool = False
    reason_code: int = 0
    properties: Properties = EMPTY_PROPERTIES

    def __post_init__(self) -> None:
        _check_code(self.reason_code, CONNACK_REASON_CODES, "CONNACK")
        if self.session_present and self.reason_code:
            raise ValueError("session present with a refusal (MQTT-3.2.2-6)")
        _check_properties(self.properties, PropertyHolder.CONNACK)


@dataclass(frozen=True, slots=True)
class Publish5:
    """PUBLISH. ``topic`` may be empty when ``properties.topic_alias`` names it (3.3.2.3.4)."""

    topic: str
    payload: bytes
    qos: int = 0
    retain: bool = False
    dup: bool = False
    packet_id: int | None = None
    properties: Properties = EMPTY_PROPERTIES

    def __post_init__(self) -> None:
        _check_qos(self.qos)
        if self.qos:
            _check_packet_id(self.packet_id)
        else:
            if self.packet_id is not None:
                raise ValueError("a QoS 0 PUBLISH has no packet_id (MQTT-2.2.1-2)")
            if self.dup:
                raise ValueError("DUP must be 0 for QoS 0 (MQTT-3.3.1-2)")
        if not self.topic and self.properties.topic_alias is None:
            raise ValueError("an empty topic needs a topic alias (3.3.2.3.4)")
        if "+" in self.topic or "#" in self.topic:
            raise ValueError(f"wildcard in topic name {self.topic!r} (MQTT-3.3.2-2)")
        _check_properties(self.properties, PropertyHolder.PUBLISH)


@dataclass(frozen=True, slots=True)
class _PublishAck5:
    """Fields and checks shared by PUBACK, PUBREC, PUBREL and PUBCOMP (they differ in codes only)."""

    packet_id: int
    reason_code: int = 0
    properties: Properties = EMPTY_PROPERTIES

    _holder: ClassVar[PropertyHolder]
    _codes: ClassVar[frozenset[int]]

    def __post_init__(self) -> None:
        _check_packet_id(self.packet_id)
        _check_code(self.reason_code, self._codes, self._holder.name)
        _check_properties(self.properties, self._holder)


@dataclass(frozen=True, slots=True)
class Puback5(_PublishAck5):
    """PUBACK: acknowledges a QoS 1 PUBLISH, with a reason code (3.4.2.1)."""

    _holder = PropertyHolder.PUBACK
    _codes = PUBACK_REASON_CODES


@dataclass(frozen=True, slots=True)
class Pubrec5(_PublishAck5):
    """PUBREC: first answer to a QoS 2 PUBLISH; a code >= 0x80 ends the exchange (3.5.2.1)."""

    _holder = PropertyHolder.PUBREC
    _codes = PUBREC_REASON_CODES


@dataclass(frozen=True, slots=True)
class Pubrel5(_PublishAck5):
    """PUBREL: answer to PUBREC (3.6.2.1)."""

    _holder = PropertyHolder.PUBREL
    _codes = PUBREL_REASON_CODES


@dataclass(frozen=True, slots=True)
class Pubcomp5(_PublishAck5):
    """PUBCOMP: answer to PUBREL, ends a QoS 2 exchange (3.7.2.1)."""

    _holder = PropertyHolder.PUBCOMP
    _codes = PUBCOMP_REASON_CODES


@dataclass(frozen=True, slots=True)
class Subscription:
    """One topic filter of a SUBSCRIBE with its Subscription Options (3.8.3.1).

    ``retain_handling``: 0 send retained messages at subscribe, 1 only if the subscription is new,
    2 never.
    """

    topic_filter: str
    qos: int = 0
    no_local: bool = False
    retain_as_published: bool = False
    retain_handling: int = 0

    def __post_init__(self) -> None:
        _check_qos(self.qos)
        if self.retain_handling not in (0, 1, 2):
            raise ValueError(f"retain_handling must be 0, 1 or 2, got {self.retain_handling!r}")
        if self.no_local and self.topic_filter.startswith(SHARED_PREFIX):
            raise ValueError("No Local on a shared subscription (MQTT-3.8.3-4)")

    @property
    def options(self) -> int:
        """The Subscription Options byte."""
        return (self.qos | (4 if self.no_local else 0) | (8 if self.retain_as_published else 0)
                | (self.retain_handling << 4))


@dataclass(frozen=True, slots=True)
class Subscribe5:
    """SUBSCRIBE: at least one :class:`Subscription` (MQTT-3.8.3-2)."""

    packet_id: int
    subscriptions: tuple[Subscription, ...]
    properties: Properties = EMPTY_PROPERTIES

    def __post_init__(self) -> None:
        _check_packet_id(self.packet_id)
        _as_tuple(self, "subscriptions")
        if not self.subscriptions:
            raise ValueError("SUBSCRIBE needs at least one topic filter (MQTT-3.8.3-2)")
        for sub in self.subscriptions:
            if type(sub) is not Subscription:
                raise ValueError(f"subscriptions hold Subscription values, got {sub!r}")
        _check_properties(self.properties, PropertyHolder.SUBSCRIBE)


@dataclass(frozen=True, slots=True)
class Unsubscribe5:
    """UNSUBSCRIBE: at least one topic filter (MQTT-3.10.3-2)."""

    packet_id: int
    topics: tuple[str, ...]
    properties: Properties = EMPTY_PROPERTIES

    def __post_init__(self) -> None:
        _check_packet_id(self.packet_id)
        _as_tuple(self, "topics")
        if not self.topics:
            raise ValueError("UNSUBSCRIBE needs at least one topic filter (MQTT-3.10.3-2)")
        _check_properties(self.properties, PropertyHolder.UNSUBSCRIBE)


@dataclass(frozen=True, slots=True)
class _ReasonCodeList5:
    """Fields and checks shared by SUBACK and UNSUBACK: one reason code per topic filter, in order."""

    packet_id: int
    reason_codes: tuple[int, ...]
    properties: Properties = EMPTY_PROPERTIES

    _holder: ClassVar[PropertyHolder]
    _codes: ClassVar[frozenset[int]]

    def __post_init__(self) -> None:
        _check_packet_id(self.packet_id)
        _as_tuple(self, "reason_codes")
        if not self.reason_codes:
            raise ValueError(f"{self._holder.name} needs at least one reason code")
        for code in self.reason_codes:
            _check_code(code, self._codes, self._holder.name)
        _check_properties(self.properties, self._holder)


@dataclass(frozen=True, slots=True)
class Suback5(_ReasonCodeList5):
    """SUBACK: granted QoS or a failure code per requested filter (MQTT-3.9.3-1)."""

    _holder = PropertyHolder.SUBACK
    _codes = SUBACK_REASON_CODES


@dataclass(frozen=True, slots=True)
class Unsuback5(_ReasonCodeList5):
    """UNSUBACK: a reason code per topic filter (MQTT-3.11.3-1)."""

    _holder = PropertyHolder.UNSUBACK
    _codes = UNSUBACK_REASON_CODES


@dataclass(frozen=True, slots=True)
class _ReasonCodeOnly5:
    """Fields and checks shared by DISCONNECT and AUTH: a reason code and properties."""

    reason_code: int = 0
    properties: Properties = EMPTY_PROPERTIES

    _holder: ClassVar[PropertyHolder]
    _codes: ClassVar[frozenset[int]]

    def __post_init__(self) -> None:
        _check_code(self.reason_code, self._codes, self._holder.name)
        _check_properties(self.properties, self._holder)


@dataclass(frozen=True, slots=True)
class Disconnect5(_ReasonCodeOnly5):
    """DISCONNECT, in either direction, with a reason code (3.14.2.1)."""

    _holder = PropertyHolder.DISCONNECT
    _codes = DISCONNECT_REASON_CODES


@dataclass(frozen=True, slots=True)
class Auth5(_ReasonCodeOnly5):
    """AUTH: a step of extended authentication (3.15).

    "It is a Protocol Error to omit the Authentication Method" (3.15.2.2.2), except in the short form
    the spec allows: reason code 0x00 without properties (remaining length 0, 3.15.2.1).
    """

    _holder = PropertyHolder.AUTH
    _codes = AUTH_REASON_CODES

    def __post_init__(self) -> None:
        _ReasonCodeOnly5.__post_init__(self)
        if self.properties.authentication_method is None and (
                self.reason_code or self.properties != EMPTY_PROPERTIES):
            raise ValueError("AUTH needs an authentication_method (3.15.2.2.2)")


Packet5 = Union[
    Connect5, Connack5, Publish5, Puback5, Pubrec5, Pubrel5, Pubcomp5, Subscribe5, Suback5,
    Unsubscribe5, Unsuback5, Pingreq, Pingresp, Disconnect5, Auth5,
]

# Packets whose properties may hold a Reason String (and User Properties) that the sender must leave
# out when they would exceed the receiver's Maximum Packet Size.
ACKS_WITH_REASON_STRING = (Connack5, Puback5, Pubrec5, Pubrel5, Pubcomp5, Suback5, Unsuback5,
                           Disconnect5, Auth5)
