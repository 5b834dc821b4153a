"""Exceptions raised by the sans-I/O MQTT core (3.1.1 and 5.0).

Strategy: the codec never logs and never closes anything; it raises. The broker maps the classes to actions:

- :class:`NeedData` - the input is incomplete; wait for more bytes (not an error of the peer).
- :class:`ProtocolError` and subclasses - the peer broke the protocol; close that connection only
  (MQTT-4.8.0-1). :class:`UnsupportedProtocol` additionally asks for CONNACK 0x01 before the close
  (MQTT-3.1.2-2).

Every :class:`ProtocolError` carries ``packets``: the complete packets that :class:`PacketReader.feed`
decoded from the same chunk before the offending one, so the broker can still act on them, and
``reason_code``: the MQTT 5 reason code for the CONNACK or DISCONNECT sent before the close (section
4.13): a class default (0x81 malformed, 0x82 protocol error, 0x95 too large, 0x84 unsupported version)
that the raiser may override on the instance with a more precise code (0x94 for a Topic Alias of 0).
"""
from __future__ import annotations

from typing import Any


class MQTTError(Exception):
    """Base class of every error raised by ``fanout.mqtt``."""


class NeedData(MQTTError):
    """The buffer ends before the packet does; feed more bytes and retry."""


class ProtocolError(MQTTError):
    """A malformed packet or protocol violation by the peer: the connection must be closed.

    Attributes:
        reason: human readable reason, citing the MQTT 3.1.1 normative statement when there is one.
        packets: packets decoded from the same ``feed`` call before the error (possibly empty).
        reason_code: MQTT 5 reason code for CONNACK/DISCONNECT (0x82 Protocol Error by default).
    """

    reason_code = 0x82

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason
        self.packets: list[Any] = []

    def __str__(self) -> str:
        return self.reason


class MalformedPacket(ProtocolError):
    """The bytes do not form a valid MQTT packet (MQTT 5 reason code 0x81)."""

    reason_code = 0x81


class PacketTooLarge(ProtocolError):
    """The remaining length announces more than the configured maximum packet size (MQTT 5: 0x95)."""

    reason_code = 0x95


class NotConnectFirst(ProtocolError):
    """The first packet of a connection is not CONNECT (MQTT-3.1.0-1); raised on its first byte."""


class UnsupportedProtocol(ProtocolError):
    """CONNECT names a protocol or level this server does not speak (MQTT-3.1.2-1, MQTT-3.1.2-2).

    The broker answers CONNACK with ``return_code`` (0x01, unacceptable protocol version) and closes.

    Attributes:
        return_code: CONNACK return code to send before closing (always 0x01).
        protocol_name: the protocol name found in the CONNECT.
        protocol_level: the protocol level found in the CONNECT.
        reason_code: the MQTT 5 answer, 0x84 Unsupported Protocol Version (MQTT-3.1.2-2 of 5.0).
    """

    reason_code = 0x84

    def __init__(self, reason: str, protocol_name: str = "", protocol_level: int = 0) -> None:
        super().__init__(reason)
        self.return_code = 0x01
        self.protocol_name = protocol_name
        self.protocol_level = protocol_level
