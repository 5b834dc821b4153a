"""MQTT 3.1.1 control packets as immutable values.

Strategy (after h11's events): every packet is a frozen slotted dataclass. Constructors called by user
code validate cheaply (QoS range, packet identifier range) and raise ``ValueError``; the decoder has
already checked the wire bytes and builds packets through :func:`unchecked`, which fills the slots
directly and skips both the frozen ``__setattr__`` and ``__post_init__`` (about half the cost of the
generated ``__init__``). Packets are hashable and compare by value, so tests can compare lists of them.
"""
from __future__ import annotations

from dataclasses import dataclass, fields
from enum import IntEnum
from typing import Any, Callable, Union


class PacketType(IntEnum):
    """Control packet type: the high nibble of the first byte of the fixed header."""

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
    PINGREQ = 12
    PINGRESP = 13
    DISCONNECT = 14


CONNACK_ACCEPTED = 0
CONNACK_BAD_PROTOCOL = 1
CONNACK_ID_REJECTED = 2
CONNACK_SERVER_UNAVAILABLE = 3
CONNACK_BAD_CREDENTIALS = 4
CONNACK_NOT_AUTHORIZED = 5
SUBACK_FAILURE = 0x80
# MQTT-3.9.3-2: SUBACK return codes other than 0x00, 0x01, 0x02 and 0x80 are reserved.
SUBACK_CODES = frozenset((0, 1, 2, SUBACK_FAILURE))
MAX_PACKET_ID = 0xFFFF


def _check_qos(qos: int) -> None:
    if qos not in (0, 1, 2):
        raise ValueError(f"QoS must be 0, 1 or 2, got {qos!r}")


def _check_packet_id(packet_id: Any) -> None:
    # MQTT-2.3.1-1: packet identifiers are non-zero 16-bit integers.
    if type(packet_id) is not int or not 0 < packet_id <= MAX_PACKET_ID:
        raise ValueError(f"packet_id must be an int in 1..65535, got {packet_id!r}")


@dataclass(frozen=True, slots=True)
class Will:
    """Will message carried in CONNECT, published by the server on an abnormal close."""

    topic: str
    payload: bytes
    qos: int = 0
    retain: bool = False

    def __post_init__(self) -> None:
        _check_qos(self.qos)


@dataclass(frozen=True, slots=True)
class Connect:
    """CONNECT: first packet from client to server."""

    client_id: str
    clean_session: bool = True
    keepalive: int = 60
    username: str | None = None
    password: bytes | None = None
    will: Will | None = None
    protocol_name: str = "MQTT"
    protocol_level: int = 4

    def __post_init__(self) -> None:
        if not 0 <= self.keepalive <= 0xFFFF:
            raise ValueError(f"keepalive must be in 0..65535, got {self.keepalive!r}")
        if self.password is not None and self.username is None:
            raise ValueError("a password needs a username (MQTT-3.1.2-22)")
        if not 0 <= self.protocol_level <= 0xFF:
            raise ValueError(f"protocol_level must be in 0..255, got {self.protocol_level!r}")


@dataclass(frozen=True, slots=True)
class Connack:
    """CONNACK: server's answer to CONNECT."""

    session_present: bool
    return_code: int

    def __post_init__(self) -> None:
        if not 0 <= self.return_code <= 0xFF:
            raise ValueError(f"return_code must be in 0..255, got {self.return_code!r}")


@dataclass(frozen=True, slots=True)
class Publish:
    """PUBLISH: an application message, in either direction."""

    topic: str
    payload: bytes
    qos: int = 0
    retain: bool = False
    dup: bool = False
    packet_id: int | None = None

    def __post_init__(self) -> None:
        _check_qos(self.qos)
        if self.qos:
            _check_packet_id(self.packet_id)
        else:
            if self.packet_id is not None:
                # MQTT-2.3.1-5: a QoS 0 PUBLISH must not contain a packet identifier.
                raise ValueError("a QoS 0 PUBLISH has no packet_id (MQTT-2.3.1-5)")
            if self.dup:
                raise ValueError("DUP must be 0 for QoS 0 (MQTT-3.3.1-2)")


@dataclass(frozen=True, slots=True)
class Puback:
    """PUBACK: acknowledges a QoS 1 PUBLISH."""

    packet_id: int

    def __post_init__(self) -> None:
        _check_packet_id(self.packet_id)


@dataclass(frozen=True, slots=True)
class Pubrec:
    """PUBREC: first acknowledgement of a QoS 2 PUBLISH."""

    packet_id: int

    def __post_init__(self) -> None:
        _check_packet_id(self.packet_id)


@dataclass(frozen=True, slots=True)
class Pubrel:
    """PUBREL: answer to PUBREC."""

    packet_id: int

    def __post_init__(self) -> None:
        _check_packet_id(self.packet_id)


@dataclass(frozen=True, slots=True)
class Pubcomp:
    """PUBCOMP: answer to PUBREL, ends a QoS 2 exchange."""

    packet_id: int

    def __post_init__(self) -> None:
        _check_packet_id(self.packet_id)


@dataclass(frozen=True, slots=True)
class Subscribe:
    """SUBSCRIBE: ``topics`` holds (topic filter, requested QoS) pairs, at least one."""

    packet_id: int
    topics: tuple[tuple[str, int], ...]

    def __post_init__(self) -> None:
        _check_packet_id(self.packet_id)
        if type(self.topics) is not tuple:
            object.__setattr__(self, "topics", tuple(tuple(t) for t in self.topics))
        if not self.topics:
            raise ValueError("SUBSCRIBE needs at least one topic filter (MQTT-3.8.3-3)")
        for _, qos in self.topics:
            _check_qos(qos)


@dataclass(frozen=True, slots=True)
class Suback:
    """SUBACK: one return code per requested filter (granted QoS or 0x80)."""

    packet_id: int
    return_codes: tuple[int, ...]

    def __post_init__(self) -> None:
        _check_packet_id(self.packet_id)
        if type(self.return_codes) is not tuple:
            object.__setattr__(self, "return_codes", tuple(self.return_codes))
        if not self.return_codes:
            raise ValueError("SUBACK needs at least one return code")
        for code in self.return_codes:
            if code not in SUBACK_CODES:
                raise ValueError(f"SUBACK return code {code!r} is reserved (MQTT-3.9.3-2)")


@dataclass(frozen=True, slots=True)
class Unsubscribe:
    """UNSUBSCRIBE: at least one topic filter."""

    packet_id: int
    topics: tuple[str, ...]

    def __post_init__(self) -> None:
        _check_packet_id(self.packet_id)
        if type(self.topics) is not tuple:
            object.__setattr__(self, "topics", tuple(self.topics))
        if not self.topics:
            raise ValueError("UNSUBSCRIBE needs at least one topic filter (MQTT-3.10.3-2)")


@dataclass(frozen=True, slots=True)
class Unsuback:
    """UNSUBACK: acknowledges an UNSUBSCRIBE."""

    packet_id: int

    def __post_init__(self) -> None:
        _check_packet_id(self.packet_id)


@dataclass(frozen=True, slots=True)
class Pingreq:
    """PINGREQ: keepalive probe from the client."""


@dataclass(frozen=True, slots=True)
class Pingresp:
    """PINGRESP: answer to PINGREQ."""


@dataclass(frozen=True, slots=True)
class Disconnect:
    """DISCONNECT: clean close by the client (the will is discarded)."""


Packet = Union[
    Connect, Connack, Publish, Puback, Pubrec, Pubrel, Pubcomp, Subscribe, Suback, Unsubscribe,
    Unsuback, Pingreq, Pingresp, Disconnect,
]

PINGREQ = Pingreq()
PINGRESP = Pingresp()
DISCONNECT = Disconnect()
PINGREQ_BYTES = b"\xc0\x00"
PINGRESP_BYTES = b"\xd0\x00"
DISCONNECT_BYTES = b"\xe0\x00"

PACKET_TYPE_OF: dict[type, PacketType] = {
    Connect: PacketType.CONNECT, Connack: PacketType.CONNACK, Publish: PacketType.PUBLISH,
    Puback: PacketType.PUBACK, Pubrec: PacketType.PUBREC, Pubrel: PacketType.PUBREL,
    Pubcomp: PacketType.PUBCOMP, Subscribe: PacketType.SUBSCRIBE, Suback: PacketType.SUBACK,
    Unsubscribe: PacketType.UNSUBSCRIBE, Unsuback: PacketType.UNSUBACK, Pingreq: PacketType.PINGREQ,
    Pingresp: PacketType.PINGRESP, Disconnect: PacketType.DISCONNECT,
}


def unchecked(cls: type) -> Callable[..., Any]:
    """Return a constructor for ``cls`` that takes every field positionally and skips validation.

    Only for values already validated (the decoder). It sets the slots through their member
    descriptors, bypassing the frozen ``__setattr__`` and ``__post_init__``.

    Args:
        cls: one of the packet dataclasses (or :class:`Will`).

    Returns:
        A function ``(field1, field2, ...) -> instance``.
    """
    names = [f.name for f in fields(cls)]
    namespace: dict[str, Any] = {"_new": object.__new__, "_cls": cls}
    lines = [f"def build({', '.join(names)}):", "    obj = _new(_cls)"]
    for name in names:
        # Member descriptors of __slots__ write the slot directly; the frozen check lives in
        # the class's __setattr__, which this does not call.
        namespace[f"_set_{name}"] = getattr(cls, name).__set__
        lines.append(f"    _set_{name}(obj, {name})")
    lines.append("    return obj")
    exec("\n".join(lines), namespace)  # noqa: S102 - generated from field names only
    build = namespace["build"]
    build.__name__ = build.__qualname__ = f"unchecked_{cls.__name__}"
    return build
