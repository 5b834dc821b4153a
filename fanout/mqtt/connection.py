"""Sans-I/O state of one MQTT network connection (server side).

Strategy (after h11's ``Connection``): bytes go in through :meth:`Connection.receive_data`, which
returns the complete packets they finish and enforces the connection-level packet order; bytes for the
peer come out of :meth:`Connection.send`. Nothing here touches a socket, a clock or the broker's
registries; the broker owns those and keeps per-connection bookkeeping in the slots below, so one small
slotted object (plus the reader) is all an idle connection costs.

States::

    CONNECTING --CONNACK 0--> CONNECTED --close--> CLOSED
        |  \\--CONNACK != 0--> CLOSED
        \\-- ProtocolError (either state) --> ERROR

Rules enforced by :meth:`receive_data` (a violation raises :class:`ProtocolError`, moves to ERROR and
the packets before the offending one stay available in ``exc.packets``):

- the first packet must be CONNECT (MQTT-3.1.0-1), checked on its first byte: a client that starts
  with anything else is refused before the rest of its packet is read;
- the CONNECT is held to ``max_connect_size``, a small cap of its own: nothing larger is buffered from
  a client that has not authenticated;
- while CONNECTING, only the CONNECT is decoded; the bytes after it stay in the reader undecoded until
  the server accepted the connection (:meth:`send` of CONNACK 0, or the broker moving it to CONNECTED),
  so an authentication that takes time queues no packets (call ``receive_data(b"")`` then);
- a second CONNECT is a protocol violation (MQTT-3.1.0-2);
- buffered bytes of an incomplete packet never exceed the reader's ``max_packet_size + 5``, because a
  header announcing more raises :class:`PacketTooLarge` before its body is buffered.

Bytes received after CLOSED/ERROR are ignored.
"""
from __future__ import annotations

from enum import IntEnum
from typing import Any, cast

from .codec import PacketReader, encode
from .errors import NotConnectFirst, ProtocolError
from .packets import Connack, Connect, Packet, PacketType
from .packets5 import Connack5, Connect5

_CONNECTS = (Connect, Connect5)


def declared_level(head: bytes) -> int:
    """The protocol level a CONNECT's first bytes declare (``10 <length> 00 04 MQTT <level>``), 0 if unknown.

    For the answer to a CONNECT that does not decode: an MQTT 5 client gets a CONNACK with a reason code
    (MQTT 5 section 4.13), a 3.1.1 client only the close.
    """
    pos = 1
    while pos < len(head) and head[pos] & 0x80 and pos < 4:
        pos += 1
    pos += 1
    if head[pos:pos + 6] == b"\x00\x04MQTT" and len(head) > pos + 6:
        return head[pos + 6]
    return 0


class ConnState(IntEnum):
    """Connection states; CLOSED and ERROR compare greater than the live ones."""

    CONNECTING = 0
    CONNECTED = 1
    CLOSED = 2
    ERROR = 3


CONNECTING = ConnState.CONNECTING
CONNECTED = ConnState.CONNECTED
CLOSED = ConnState.CLOSED
ERROR = ConnState.ERROR


class Connection:
    """One network connection as the broker sees it.

    Args:
        max_packet_size: largest accepted remaining length once connected; bigger packets raise
            PacketTooLarge (the broker raises it for platform logins).
        now_ms: creation time (for the connect timeout).
        peer: peer address for logs (opaque).
        max_connect_size: largest accepted remaining length of the CONNECT (default: ``max_packet_size``).

    Attributes the broker maintains (public slots, no behaviour):
        client_id, session, principal, will, generation: set on an accepted CONNECT.
        keepalive_ms: 1.5 x the CONNECT keep alive in ms (0 = none), MQTT-3.1.2-24.
        last_rx_ms: time of the last received bytes; created_ms: time of creation.
        out: encoded packets waiting to be written (joined and flushed once per loop iteration).
        transport: the adapter's handle (opaque to the core).
        close_reason: why the broker closed it (set with the state).
        wheel_slot: deadline-wheel bucket the connection is scheduled in (see :mod:`deadlines`).
        acl_cache: per-connection publish decisions by topic (created on first publish).
        pending_connect: the CONNECT whose authentication runs (its bytes-after stay in the reader), or None.
        pending_ingest: packet id -> QoS of intercepted publishes awaiting complete/reject, or None.
        write_paused: the transport asked to stop writing (QoS 0 to this connection is dropped).
        held_output: while the CONNACK is held (:mod:`connack_hold`), the output written since, else None.
        v5: None for MQTT 3.1.1; for MQTT 5 the :class:`~fanout.mqtt.link5.Link5` of the CONNECT.
    """

    __slots__ = (
        "reader", "state", "connect_seen", "client_id", "session", "principal", "will", "generation",
        "keepalive_ms", "last_rx_ms", "created_ms", "out", "transport", "peer", "close_reason",
        "wheel_slot", "acl_cache", "pending_connect", "pending_ingest", "write_paused", "max_packet_size", "v5",
        "held_output",
    )

    def __init__(self, max_packet_size: int, now_ms: int = 0, peer: Any = None, *,
                 max_connect_size: int | None = None) -> None:
        # protocol level None: the CONNECT's own level (4 or 5) picks the codec of the rest of the stream
        self.reader = PacketReader(max_packet_size if max_connect_size is None else min(max_connect_size, max_packet_size),
                                   protocol_level=None)
        self.max_packet_size = max_packet_size
        self.state = CONNECTING
        self.connect_seen = False
        self.client_id: str | None = None
        self.session: Any = None
        self.principal: Any = None
        self.will: Any = None
        self.generation = 0
        self.keepalive_ms = 0
        self.last_rx_ms = now_ms
        self.created_ms = now_ms
        self.out: list[bytes] = []
        self.transport: Any = None
        self.peer = peer
        self.close_reason: str | None = None
        self.wheel_slot = -1
        self.acl_cache: dict[str, bool] | None = None
        self.pending_connect: Connect | Connect5 | None = None
        self.pending_ingest: dict[int, int] | None = None
        self.write_paused = False
        self.held_output: list[bytes] | None = None
        self.v5: Any = None  # MQTT 5: the connection's negotiated parameters (fanout.mqtt.link5.Link5)

    def __repr__(self) -> str:
        return f"<Connection {self.client_id!r} {self.state.name} peer={self.peer!r}>"

    @property
    def buffered(self) -> int:
        """Bytes of an incomplete packet held by the reader."""
        return self.reader.buffered

    def receive_data(self, data: bytes) -> list[Packet]:
        """Feed received bytes; return the complete packets, in order.

        Args:
            data: the next chunk of the byte stream (any split).

        Returns:
            Packets completed by ``data`` (possibly none). Empty once CLOSED or ERROR; while
            CONNECTING at most the CONNECT (the bytes after it are kept for later).

        Raises:
            ProtocolError: malformed or oversize packet, a first packet that is not CONNECT, or a second
                CONNECT. ``exc.packets`` holds the valid packets before it; the state is ERROR.
        """
        state = self.state
        if state >= CLOSED:
            return []
        if state is CONNECTING:
            return self._receive_connect(data)
        try:
            packets = self.reader.feed(data)
        except ProtocolError as exc:
            self.state = ERROR
            try:
                self._check_order(exc.packets)
            except ProtocolError as order_exc:
                raise order_exc from exc
            raise
        if self.connect_seen:
            for p in packets:
                if p.__class__ in _CONNECTS:
                    self._check_order(packets)  # raises
        elif packets:
            self._check_order(packets)
        return packets

    def _receive_connect(self, data: bytes) -> list[Packet]:
        reader = self.reader
        if self.connect_seen:
            reader.hold(data)  # the CONNECT is being authenticated: keep what follows it undecoded
            return []
        if data and not reader.buffered and data[0] >> 4 != PacketType.CONNECT:
            kind = data[0] >> 4
            name = PacketType(kind).name if kind in PacketType._value2member_map_ else f"type {kind}"
            self.state = ERROR
            raise NotConnectFirst(f"first packet is {name}, not CONNECT (MQTT-3.1.0-1)")
        try:
            packet = reader.feed_first(data)
        except ProtocolError as exc:
            self.state = ERROR
            exc.connect_level = declared_level(reader.head(16))  # type: ignore[attr-defined]
            raise
        if packet is None:
            return []
        self.connect_seen = True  # the first byte said CONNECT, so this is one
        return [packet]

    def accepted(self) -> None:
        """The server accepted the CONNECT: CONNECTED, and the connected packet size limit applies."""
        self.state = CONNECTED
        self.reader.max_packet_size = self.max_packet_size

    def _check_order(self, packets: list[Packet]) -> None:
        for i, p in enumerate(packets):
            if p.__class__ in _CONNECTS:
                if self.connect_seen:
                    self._violation(packets, i, "second CONNECT on one connection (MQTT-3.1.0-2)")
                self.connect_seen = True
            elif not self.connect_seen:
                self._violation(packets, i, f"first packet is {type(p).__name__}, not CONNECT (MQTT-3.1.0-1)")

    def _violation(self, packets: list[Packet], i: int, reason: str) -> None:
        self.state = ERROR
        exc = ProtocolError(reason)
        exc.packets = packets[:i]
        raise exc

    def send(self, packet: Packet) -> bytes:
        """Encode ``packet`` for the peer and apply its state change.

        A CONNACK with return code 0 moves CONNECTING to CONNECTED; any other CONNACK moves to CLOSED
        (the server closes after a refusal, MQTT-3.2.2-5).

        Args:
            packet: a server-to-client packet.

        Returns:
            The encoded bytes (the caller queues them).

        Raises:
            ProtocolError: sending on a CLOSED/ERROR connection, or a CONNACK when not CONNECTING.
        """
        if self.state >= CLOSED:
            raise ProtocolError(f"cannot send {type(packet).__name__} on a {self.state.name} connection")
        cls = packet.__class__
        if cls is Connack or cls is Connack5:
            if self.state is not CONNECTING:
                raise ProtocolError("CONNACK sent twice")
            code = packet.return_code if isinstance(packet, Connack) else cast(Connack5, packet).reason_code
            if code == 0:
                self.accepted()
            else:
                self.state = CLOSED
        return encode(packet)

    def close(self, reason: str, *, error: bool = False) -> bool:
        """Record that the owner closes this connection.

        Moves a live connection to CLOSED (ERROR when ``error``); an ERROR set by
        :meth:`receive_data` stays. ``close_reason`` marks the close as handled.

        Returns:
            True the first time (the caller must do its close bookkeeping), False afterwards.
        """
        if self.close_reason is not None:
            return False
        self.close_reason = reason
        if self.state < CLOSED:
            self.state = ERROR if error else CLOSED
        return True


__all__ = ["Connection", "ConnState", "CONNECTING", "CONNECTED", "CLOSED", "ERROR"]
