"""The wire format of a direct channel between two actors: a mutual handshake, then length-prefixed frames.

Strategy (sans-I/O, as :mod:`fanout.mqtt`): this module turns bytes into handshake steps and frames and back;
:mod:`fanout.channel.peer` moves the bytes. Why a channel at all: a Ray actor call costs ~1.8 ms of CPU here
(caller ~0.9, callee ~1.0 for a 1-32 KB argument, async or threaded actor alike), a request/reply over a
loopback TCP connection ~50 µs; the hot calls (replication, appends, events, deliveries) go over channels,
Ray keeps placement, discovery and everything rare.

Handshake (both sides prove they hold the cluster's channel secret before a single frame is read, and no
frame is unpickled before that; the secret itself never travels):

1. server -> client: ``MAGIC`` + 16-byte server nonce;
2. client -> server: 16-byte client nonce + ``HMAC(secret, b"c" + snonce + cnonce + service)`` + service
   name (1-byte length + UTF-8);
3. server -> client: ``HMAC(secret, b"s" + snonce + cnonce + service)``.

A wrong proof on either side closes the connection (the server logs the peer address). ``service`` names what
the client wants to reach (``replica/0/r1``): a proof for one service is no proof for another.

Frame: ``>IIB`` header (payload length, request id, kind) + payload. Kinds: ``REQUEST`` (payload = pickled
``(method, args)``), ``REPLY`` (pickled result), ``ERROR`` (pickled exception). A header announcing more than
``max_frame`` bytes is a protocol error: the connection closes, nothing is buffered.
"""
from __future__ import annotations

import hashlib
import hmac
import os
import struct

MAGIC = b"SDVC\x01"
NONCE_BYTES = 16
PROOF_BYTES = 32
HEADER = struct.Struct(">IIB")
HEADER_BYTES = HEADER.size
REQUEST, REPLY, ERROR = 0, 1, 2
KINDS = (REQUEST, REPLY, ERROR)


class ChannelError(ConnectionError):
    """The channel is closed, was refused, or the peer broke the protocol."""


class HandshakeError(ChannelError):
    """The peer did not prove it holds the channel secret (or spoke another protocol)."""


def proof(secret: bytes, side: bytes, snonce: bytes, cnonce: bytes, service: bytes) -> bytes:
    return hmac.new(secret, side + snonce + cnonce + service, hashlib.sha256).digest()


def server_hello() -> tuple[bytes, bytes]:
    """``(bytes to send, server nonce)``."""
    snonce = os.urandom(NONCE_BYTES)
    return MAGIC + snonce, snonce


def client_reply(secret: bytes, hello: bytes, service: str) -> tuple[bytes, bytes]:
    """The client's answer to the server's hello and the proof it expects back: ``(bytes to send, expected)``.

    Raises:
        HandshakeError: ``hello`` is not this protocol's.
    """
    if len(hello) != len(MAGIC) + NONCE_BYTES or not hello.startswith(MAGIC):
        raise HandshakeError("peer is not a channel server (bad hello)")
    snonce = hello[len(MAGIC):]
    cnonce = os.urandom(NONCE_BYTES)
    name = service.encode()
    if len(name) > 255:
        raise ValueError(f"service name too long: {service!r}")
    out = cnonce + proof(secret, b"c", snonce, cnonce, name) + bytes([len(name)]) + name
    return out, proof(secret, b"s", snonce, cnonce, name)


def client_reply_size(first: bytes) -> int:
    """Length of the whole client reply, known once its first ``NONCE_BYTES + PROOF_BYTES + 1`` bytes are in."""
    return NONCE_BYTES + PROOF_BYTES + 1 + first[NONCE_BYTES + PROOF_BYTES]


def check_client(secret: bytes, snonce: bytes, reply: bytes) -> tuple[str, bytes]:
    """Verify the client's reply: ``(service, bytes to send back)``.

    Raises:
        HandshakeError: a wrong proof.
    """
    cnonce = reply[:NONCE_BYTES]
    got = reply[NONCE_BYTES:NONCE_BYTES + PROOF_BYTES]
    name = reply[NONCE_BYTES + PROOF_BYTES + 1:]
    if not hmac.compare_digest(got, proof(secret, b"c", snonce, cnonce, name)):
        raise HandshakeError("client proof does not match the channel secret")
    return name.decode(errors="replace"), proof(secret, b"s", snonce, cnonce, name)


def encode_header(length: int, rid: int, kind: int) -> bytes:
    return HEADER.pack(length, rid, kind)


class FrameDecoder:
    """Bytes in, ``(request id, kind, payload)`` frames out; bounded by ``max_frame``.

    Raises (from :meth:`feed`):
        ChannelError: a frame over ``max_frame`` or of an unknown kind.
    """

    __slots__ = ("_buf", "_pos", "max_frame")

    def __init__(self, max_frame: int) -> None:
        self._buf = bytearray()
        self._pos = 0
        self.max_frame = max_frame

    @property
    def buffered(self) -> int:
        return len(self._buf) - self._pos

    def feed(self, data: bytes) -> list[tuple[int, int, bytes]]:
        buf = self._buf
        buf += data
        pos = self._pos
        end = len(buf)
        out = []
        unpack = HEADER.unpack_from
        while end - pos >= HEADER_BYTES:
            length, rid, kind = unpack(buf, pos)
            if length > self.max_frame:
                raise ChannelError(f"frame of {length} bytes over the channel's max_frame {self.max_frame}")
            if kind not in KINDS:
                raise ChannelError(f"frame of unknown kind {kind}")
            stop = pos + HEADER_BYTES + length
            if stop > end:
                break
            out.append((rid, kind, bytes(buf[pos + HEADER_BYTES:stop])))
            pos = stop
        if pos == end:
            buf.clear()
            pos = 0
        elif pos > 65536:
            del buf[:pos]
            pos = 0
        self._pos = pos
        return out


__all__ = ["MAGIC", "REQUEST", "REPLY", "ERROR", "ChannelError", "HandshakeError", "FrameDecoder", "encode_header",
           "server_hello", "client_reply", "client_reply_size", "check_client", "NONCE_BYTES", "PROOF_BYTES"]
