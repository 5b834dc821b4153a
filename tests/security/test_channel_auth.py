"""Attacks on the actors' direct channels (fanout.channel): nobody without the cluster's secret gets a frame
unpickled, a wrong service or an oversize frame closes only that connection, and pre-auth bytes are bounded."""
from __future__ import annotations

import asyncio
import pickle

import pytest

from fanout.channel import ChannelClient, ChannelError, ChannelServer, HandshakeError
from fanout.channel import frames as fr

SECRET = b"S" * 32


class Boom:
    """Unpickling this runs code: a server that unpickled an unauthenticated frame would set the flag."""

    ran = False

    def __reduce__(self):
        return (_mark, ())


def _mark():
    Boom.ran = True
    return None


async def _server(service: str = "replica/0/r1") -> tuple[ChannelServer, list]:
    seen: list = []

    async def echo(x):
        seen.append(x)
        return x

    server = ChannelServer(SECRET, service, {"echo": echo}, max_frame=4096)
    await server.start("127.0.0.1", 0)
    return server, seen


async def _read_closed(reader: asyncio.StreamReader, limit: float = 3.0) -> bytes:
    """What the server sends until it closes the connection (fails if it does not close in time)."""
    return await asyncio.wait_for(reader.read(), limit)


async def test_a_client_with_another_secret_is_refused_and_no_frame_is_unpickled():
    server, seen = await _server()
    try:
        Boom.ran = False
        reader, writer = await asyncio.open_connection(*server.address)
        hello = await reader.readexactly(len(fr.MAGIC) + fr.NONCE_BYTES)
        reply, _expected = fr.client_reply(b"wrong" * 8, hello, "replica/0/r1")
        payload = pickle.dumps(("echo", (Boom(),)))
        writer.write(reply + fr.encode_header(len(payload), 1, fr.REQUEST) + payload)
        await writer.drain()
        assert await _read_closed(reader) == b""  # no proof, no reply: closed
        assert not Boom.ran and seen == []
        assert server.stats["refused"] == 1
        writer.close()
    finally:
        await server.close()


async def test_frames_sent_before_the_handshake_are_never_unpickled():
    server, seen = await _server()
    try:
        Boom.ran = False
        reader, writer = await asyncio.open_connection(*server.address)
        payload = pickle.dumps(("echo", (Boom(),)))
        writer.write((fr.encode_header(len(payload), 1, fr.REQUEST) + payload) * 3)
        await writer.drain()
        data = await _read_closed(reader)
        assert data.startswith(fr.MAGIC)  # the hello, then the close
        assert not Boom.ran and seen == []
        writer.close()
    finally:
        await server.close()


async def test_the_client_refuses_a_server_that_cannot_prove_the_secret():
    impostor = ChannelServer(b"other" * 8, "replica/0/r1", {})
    await impostor.start("127.0.0.1", 0)

    async def resolve():
        return impostor.address

    client = ChannelClient(SECRET, "replica/0/r1", resolve)
    try:
        with pytest.raises(ChannelError):  # the impostor refuses our proof, or we refuse its
            await client.call("echo", b"replicated rows must not reach an impostor")
    finally:
        client.close()
        await impostor.close()


async def test_an_impostor_server_gets_no_request_from_the_client():
    received = bytearray()

    async def handle(reader, writer):
        hello, _snonce = fr.server_hello()
        writer.write(hello)
        received.extend(await reader.read(1 << 16))
        writer.write(b"\x00" * fr.PROOF_BYTES)  # a made-up answer
        await writer.drain()
        try:
            received.extend(await asyncio.wait_for(reader.read(1 << 16), 1.0))
        except asyncio.TimeoutError:
            pass
        writer.close()

    fake = await asyncio.start_server(handle, "127.0.0.1", 0)
    address = fake.sockets[0].getsockname()[:2]

    async def resolve():
        return address

    client = ChannelClient(SECRET, "replica/0/r1", resolve)
    try:
        with pytest.raises(HandshakeError):
            await client.call("echo", b"SECRET-ROWS")
        assert b"SECRET-ROWS" not in received
    finally:
        client.close()
        fake.close()
        await fake.wait_closed()


async def test_a_proof_for_another_service_is_refused():
    server, seen = await _server("replica/0/r1")

    async def resolve():
        return server.address

    client = ChannelClient(SECRET, "dispatcher/0", resolve)
    try:
        with pytest.raises(ChannelError):
            await client.call("echo", 1)
        assert seen == [] and server.stats["refused"] == 1
    finally:
        client.close()
        await server.close()


async def test_an_oversize_frame_header_closes_only_that_connection():
    server, seen = await _server()

    async def resolve():
        return server.address

    good = ChannelClient(SECRET, "replica/0/r1", resolve)
    bad = ChannelClient(SECRET, "replica/0/r1", resolve)
    try:
        assert await good.call("echo", 1) == 1
        assert await bad.call("echo", 2) == 2
        conn = bad._conn
        conn.transport.write(fr.encode_header(1 << 30, 7, fr.REQUEST))  # claims a 1 GiB frame
        for _ in range(100):
            if conn.closed:
                break
            await asyncio.sleep(0.02)
        assert conn.closed and server.stats["protocol_errors"] == 1
        assert await good.call("echo", 3) == 3  # the other connection is untouched
    finally:
        good.close()
        bad.close()
        await server.close()


async def test_a_silent_peer_is_closed_after_the_handshake_timeout(monkeypatch):
    from fanout.channel import peer

    monkeypatch.setattr(peer, "HANDSHAKE_TIMEOUT_S", 0.3)
    server, _seen = await _server()
    try:
        reader, writer = await asyncio.open_connection(*server.address)
        writer.write(b"\x00" * 10)  # less than a handshake, then nothing
        await writer.drain()
        assert (await _read_closed(reader)).startswith(fr.MAGIC)
        assert server.stats["refused"] == 1
        writer.close()
    finally:
        await server.close()
