"""Sans-I/O MQTT codec (3.1.1 and 5.0): :func:`decode`, :class:`PacketReader`, re-exported encoders.

Strategy:

- Dispatch on the whole first byte. ``DECODERS`` has 256 entries; a first byte with a reserved packet
  type or wrong reserved flags maps to ``None`` and the reason sits in ``FIRST_BYTE_ERRORS``, so flag checks
  (MQTT-2.2.2-1/2, MQTT-3.3.1-2/4, MQTT-3.6.1-1, MQTT-3.8.1-1, MQTT-3.10.1-1) cost one list index and
  a bad first byte is refused before the rest of the packet arrives.
- Decoders work on ``bytes`` by offset: ``decoder(buf, first, start, stop)`` reads the body
  ``buf[start:stop]`` without slicing it first, checks every read against ``stop`` (the buffer may hold
  the next packet after it) and requires the body to be consumed exactly. Payloads are one slice of a
  ``bytes`` object: one copy, already ``bytes``.
- Decoded packets are built with :func:`fanout.mqtt.packets.unchecked` constructors: the wire checks
  here replace the constructor checks. PUBACK objects are interned per packet id (immutable values).
- :class:`PacketReader` decodes every complete packet of a chunk by offset and keeps only the
  incomplete tail, so many small packets per chunk cost O(n); it remembers how many bytes the next
  packet needs and does not re-parse until they are there, so a large packet fed byte by byte costs
  O(n) too. Buffered bytes never exceed ``max_packet_size + 5`` because a header announcing more raises
  :class:`PacketTooLarge` at once.
- The protocol level picks the first-byte tables (:data:`fanout.mqtt.decoder5.DECODER_TABLES`): 4
  (default, MQTT 3.1.1 only, exactly the tables above), 5 (MQTT 5), or ``None`` for a server that has
  not seen the CONNECT yet: the CONNECT is decoded by its own protocol level field and the reader goes
  on at that level, also for the bytes after it in the same chunk.
"""
from __future__ import annotations

from typing import Any

from .decoder5 import DECODER_TABLES
from .encoder import (  # noqa: F401 - re-exported API
    MAX_REMAINING_LENGTH, encode, encode_connack, encode_puback, encode_pubcomp, encode_publish,
    encode_pubrec, encode_pubrel, encode_suback, encode_unsuback, encode_varint,
)
from .encoder5 import (  # noqa: F401 - re-exported API; importing it registers MQTT 5 in encode()
    encode_auth5, encode_connack5, encode_disconnect5, encode_puback5, encode_pubcomp5,
    encode_publish5, encode_pubrec5, encode_pubrel5, encode_suback5, encode_unsuback5, encode_within,
)
from .errors import MalformedPacket, NeedData, PacketTooLarge, ProtocolError
from .packets import Packet

_RL_TOO_LONG = "remaining length longer than 4 bytes (section 2.2.3)"


def _long_length(buf: Any, pos: int, end: int) -> tuple[int, int]:
    """Parse a remaining length whose first byte (at ``pos``) has the continuation bit.

    Returns (value, body start), or (-1, -1) when the varint is cut off by ``end``.
    """
    value = buf[pos] & 0x7F
    for i in (1, 2, 3):
        if pos + i >= end:
            return -1, -1
        b = buf[pos + i]
        value |= (b & 0x7F) << (7 * i)
        if b < 0x80:
            return value, pos + i + 1
    raise MalformedPacket(_RL_TOO_LONG)


def _too_large(rl: int, max_packet_size: int) -> PacketTooLarge:
    return PacketTooLarge(f"remaining length {rl} exceeds the maximum packet size {max_packet_size}")


def _bad_level(protocol_level: Any) -> ValueError:
    return ValueError(f"protocol_level must be 4, 5 or None, got {protocol_level!r}")


def decode(buf: bytes | bytearray | memoryview, max_packet_size: int = MAX_REMAINING_LENGTH,
           protocol_level: int | None = 4) -> tuple[Packet, int]:
    """Decode one packet from the start of ``buf``.

    Args:
        buf: bytes received; may hold more than one packet.
        max_packet_size: largest accepted remaining length (variable header + payload).
        protocol_level: 4 (MQTT 3.1.1), 5 (MQTT 5) or ``None`` (only a CONNECT of either level is
            decoded as such; see the module docstring).

    Returns:
        (packet, number of bytes consumed).

    Raises:
        NeedData: ``buf`` ends before the packet does (including inside the remaining length).
        PacketTooLarge: the remaining length exceeds ``max_packet_size`` (raised before the body
            arrives).
        UnsupportedProtocol: CONNECT with another protocol name or level than the reader accepts.
        MalformedPacket: bytes that do not parse (MQTT 5 reason code 0x81).
        ProtocolError: anything else invalid (``reason_code`` says which, for MQTT 5).
    """
    tables = DECODER_TABLES.get(protocol_level)
    if tables is None:
        raise _bad_level(protocol_level)
    end = len(buf)
    if not end:
        raise NeedData("empty buffer")
    first = buf[0]
    decoder = tables[0][first]
    if decoder is None:
        raise MalformedPacket(tables[1][first])
    if end < 2:
        raise NeedData("remaining length missing")
    rl = buf[1]
    start = 2
    if rl >= 0x80:
        rl, start = _long_length(buf, 1, end)
        if start < 0:
            raise NeedData("remaining length incomplete")
    if rl > max_packet_size:
        raise _too_large(rl, max_packet_size)
    stop = start + rl
    if stop > end:
        fixed = tables[2][first]
        if fixed >= 0 and rl != fixed:
            decoder(b"", first, 0, rl)  # raises the length error
        raise NeedData(f"{stop - end} more bytes needed")
    if type(buf) is not bytes:
        # Decoders slice bytes; copy only this packet, once.
        buf = bytes(memoryview(buf)[:stop])
    return decoder(buf, first, start, stop), stop


class PacketReader:
    """Incremental decoder over a byte stream (one per connection and direction).

    After a :class:`ProtocolError` the reader is dead: every later :meth:`feed` raises again.
    """

    __slots__ = ("_buf", "_need", "_max", "_error", "_level", "_decoders", "_tables")

    def __init__(self, max_packet_size: int = MAX_REMAINING_LENGTH,
                 protocol_level: int | None = 4) -> None:
        """Args:
            max_packet_size: largest accepted remaining length (variable header + payload).
            protocol_level: 4 (MQTT 3.1.1 only, a level-5 CONNECT raises UnsupportedProtocol), 5
                (MQTT 5, e.g. a client that connected with level 5), or ``None`` (a server before the
                CONNECT: the CONNECT's own level, 4 or 5, applies from then on).
        """
        self._buf = bytearray()
        self._need = 1  # buffered bytes needed before parsing can make progress
        self._max = max_packet_size
        self._error: ProtocolError | None = None
        self._use_level(protocol_level)

    def _use_level(self, protocol_level: int | None) -> list[Any]:
        # (decoders, first-byte errors, fixed remaining lengths); the loop keeps only the decoders.
        tables = DECODER_TABLES.get(protocol_level)
        if tables is None:
            raise _bad_level(protocol_level)
        self._tables = tables
        self._decoders = tables[0]
        self._level = protocol_level
        return tables[0]

    @property
    def protocol_level(self) -> int | None:
        """4 or 5, or ``None`` while a negotiating reader has not decoded a CONNECT."""
        return self._level

    @property
    def buffered(self) -> int:
        """Bytes received but not yet decoded (an incomplete packet)."""
        return len(self._buf)

    @property
    def max_packet_size(self) -> int:
        """Largest accepted remaining length; the broker raises it for platform connections."""
        return self._max

    @max_packet_size.setter
    def max_packet_size(self, value: int) -> None:
        if not 0 < value <= MAX_REMAINING_LENGTH:
            raise ValueError(f"max_packet_size must be 1..{MAX_REMAINING_LENGTH}, got {value}")
        self._max = value

    def feed_first(self, data: bytes | bytearray | memoryview) -> Packet | None:
        """Add received bytes and decode at most one packet; whatever follows it stays buffered undecoded.

        For the first packet of a connection (the CONNECT): the bytes after it are decoded by a later
        :meth:`feed` (``feed(b"")``), once the server decided to accept the connection and under the
        limit that applies then.

        Returns:
            The first complete packet, or None while it is incomplete.

        Raises:
            ProtocolError: as :meth:`feed` (oversize as soon as the header announces it).
        """
        if self._error is not None:
            raise type(self._error)(f"reader already failed: {self._error.reason}")
        buf = self._buf
        buf += data
        if len(buf) < self._need:
            return None
        try:
            packet, used = decode(bytes(buf), self._max, self._level)
        except NeedData:
            self._need = len(buf) + 1  # the header says how much more, but one more byte is enough to retry
            return None
        except ProtocolError as exc:
            self._error = exc
            raise
        del buf[:used]
        self._need = 1
        if self._level is None:  # a negotiating reader: the CONNECT's level applies from here on
            level = getattr(packet, "protocol_level", None)
            if level in (4, 5):
                self._use_level(level)
        return packet

    def head(self, n: int) -> bytes:
        """The first ``n`` buffered bytes, undecoded (e.g. of a CONNECT that failed to decode)."""
        return bytes(self._buf[:n])

    def hold(self, data: bytes | bytearray | memoryview) -> None:
        """Buffer received bytes without decoding them (while the server authenticates the CONNECT)."""
        self._buf += data

    def feed(self, data: bytes | bytearray | memoryview) -> list[Packet]:
        """Add received bytes and return every packet they complete.

        Args:
            data: the next bytes of the stream, any split.

        Returns:
            Complete packets in stream order (empty when none is complete yet).

        Raises:
            ProtocolError: a subclass for the first invalid packet; its ``packets`` attribute holds
                the packets decoded from this chunk before it. The reader is unusable afterwards.
        """
        if self._error is not None:
            raise type(self._error)(f"reader already failed: {self._error.reason}")
        buf = self._buf
        if buf:
            buf += data
            if len(buf) < self._need:
                return []
            data = bytes(buf)
            buf.clear()
        elif type(data) is not bytes:
            data = bytes(data)
        out: list[Packet] = []
        pos = 0
        end = len(data)
        decoders = self._decoders
        max_size = self._max
        negotiating = self._level is None  # a server before the CONNECT
        try:
            while pos < end:
                first = data[pos]
                decoder = decoders[first]
                if decoder is None:
                    raise MalformedPacket(self._tables[1][first])
                if pos + 1 == end:
                    self._need = 2
                    break
                rl = data[pos + 1]
                start = pos + 2
                if rl >= 0x80:
                    rl, start = _long_length(data, pos + 1, end)
                    if start < 0:
                        self._need = end - pos + 1
                        break
                if rl > max_size:
                    raise _too_large(rl, max_size)
                stop = start + rl
                if stop > end:
                    fixed = self._tables[2][first]
                    if fixed >= 0 and rl != fixed:
                        decoder(b"", first, 0, rl)  # raises the length error
                    self._need = stop - pos
                    break
                packet = decoder(data, first, start, stop)
                out.append(packet)
                if negotiating and first == 0x10:  # the CONNECT's level (4 or 5) applies from the next packet on
                    negotiating = False
                    decoders = self._use_level(packet.protocol_level)
                pos = stop
            else:
                self._need = 1
        except ProtocolError as exc:
            exc.packets = out
            self._error = exc
            raise
        if pos < end:
            buf += memoryview(data)[pos:]
        return out
