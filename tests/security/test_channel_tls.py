"""The direct channels with TLS (fanout.channel.tls; ``cluster.channel_tls``): what crosses the wire between
machines is encrypted, a client accepts the cluster's own certificate only, and a peer that speaks plain TCP
or stalls in the TLS handshake is closed without being served.

A recording TCP relay between client and server plays the network: without TLS it sees the call's bytes in
clear (the check that it can see them at all), with TLS it does not."""
from __future__ import annotations

import asyncio
import gc

import pytest

from fanout.channel import ChannelClient, ChannelError, ChannelServer, tls
from fanout.channel import peer

SECRET = b"S" * 32
MARKER = b"WVW-SECRET-ROW-0123456789"


@pytest.fixture(scope="module")
def identity() -> bytes:
    return tls.new_identity()


class Relay:
    """Forwards one client's TCP connections to ``target`` and keeps every byte it carried, both ways."""

    def __init__(self, target: tuple[str, int]) -> None:
        self.target = target
        self.seen = bytearray()
        self.server: asyncio.base_events.Server | None = None
        self.tasks: set[asyncio.Task] = set()

    async def start(self) -> tuple[str, int]:
        self.server = await asyncio.start_server(self._handle, "127.0.0.1", 0)
        return self.server.sockets[0].getsockname()[:2]

    async def _pipe(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while data := await reader.read(1 << 16):
                self.seen += data
                writer.write(data)
                await writer.drain()
        except (ConnectionError, asyncio.CancelledError):
            pass
        finally:
            writer.close()

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        up_reader, up_writer = await asyncio.open_connection(*self.target)
        for t in (asyncio.ensure_future(self._pipe(reader, up_writer)),
                  asyncio.ensure_future(self._pipe(up_reader, writer))):
            self.tasks.add(t)
            t.add_done_callback(self.tasks.discard)

    async def close(self) -> None:
        self.server.close()
        for t in list(self.tasks):
            t.cancel()
        await asyncio.gather(*self.tasks, return_exceptions=True)
        await self.server.wait_closed()


async def _tls_failed(server: ChannelServer, at_least: int = 1) -> int:
    """``tls_failed`` once it reaches ``at_least`` (asyncio's own loop frees an abandoned handshake's SSL
    object at a garbage collection; uvloop at once)."""
    for _ in range(100):
        gc.collect()
        if (n := server.figures()["tls_failed"]) >= at_least:
            return n
        await asyncio.sleep(0.05)
    raise AssertionError(f"tls_failed stayed at {server.figures()['tls_failed']}")


async def _server(ctx) -> tuple[ChannelServer, list]:
    seen: list = []

    async def echo(x):
        seen.append(x)
        return x

    server = ChannelServer(SECRET, "replica/0/r1", {"echo": echo}, ssl=ctx)
    await server.start("127.0.0.1", 0)
    return server, seen


@pytest.mark.parametrize("encrypted", [False, True], ids=["plain", "tls"])
async def test_what_crosses_the_wire_is_encrypted_with_tls(identity, encrypted):
    server, seen = await _server(tls.server_context(identity) if encrypted else None)
    relay = Relay(server.address)
    address = await relay.start()
    client_ctx = tls.client_context(identity) if encrypted else None

    async def resolve():
        return (*address, client_ctx) if encrypted else address

    client = ChannelClient(SECRET, "replica/0/r1", resolve)
    try:
        assert await client.call("echo", MARKER) == MARKER  # there and back through the relay
        assert seen == [MARKER]
        assert (MARKER in relay.seen) is not encrypted  # plain: the relay reads the row; TLS: it cannot
        if encrypted:
            assert relay.seen[:1] == b"\x16"  # a TLS handshake record, not the channel's hello
    finally:
        client.close()
        await relay.close()
        await server.close()


async def test_a_client_accepts_the_clusters_certificate_only(identity):
    server, seen = await _server(tls.server_context(identity))
    other = tls.client_context(tls.new_identity())  # another cluster's (or an impostor's) pin

    async def resolve():
        return (*server.address, other)

    client = ChannelClient(SECRET, "replica/0/r1", resolve)
    try:
        with pytest.raises(ChannelError, match="CERTIFICATE_VERIFY_FAILED"):
            await client.call("echo", MARKER)
        assert seen == [] and server.stats["requests"] == 0
        assert await _tls_failed(server) >= 1  # the server counts the handshake that never finished
    finally:
        client.close()
        await server.close()


async def test_a_plain_client_of_a_tls_server_is_served_nothing(identity, monkeypatch):
    monkeypatch.setattr(peer, "CONNECT_TIMEOUT_S", 0.5)  # each side waits for the other's first bytes
    server, seen = await _server(tls.server_context(identity))

    async def resolve():
        return server.address  # no TLS context: the client speaks the plain handshake

    client = ChannelClient(SECRET, "replica/0/r1", resolve)
    try:
        with pytest.raises(ChannelError):
            await client.call("echo", MARKER)
        assert seen == [] and server.stats["requests"] == 0
        assert await _tls_failed(server) >= 1
        # the server is unharmed: a TLS client is served afterwards
        good = ChannelClient(SECRET, "replica/0/r1",
                             lambda: _ready((*server.address, tls.client_context(identity))))
        try:
            assert await good.call("echo", 7) == 7
        finally:
            good.close()
    finally:
        client.close()
        await server.close()


async def _ready(value):
    return value


async def test_a_peer_stalling_in_the_tls_handshake_is_closed(identity, monkeypatch):
    monkeypatch.setattr(peer, "HANDSHAKE_TIMEOUT_S", 0.3)  # read when the server starts listening
    server, _ = await _server(tls.server_context(identity))
    try:
        reader, writer = await asyncio.open_connection(*server.address)
        writer.write(b"\x16\x03\x01")  # the start of a ClientHello, and nothing more
        await writer.drain()
        assert await asyncio.wait_for(reader.read(), 5.0) == b""  # closed by the server, well within 5 s
        writer.close()
        assert await _tls_failed(server) == 1 and server.handshakes.abandoned == 1
    finally:
        await server.close()


def test_identity_parts(identity):
    cert = tls.certificate_of(identity)
    assert identity.startswith(b"-----BEGIN PRIVATE KEY-----") and cert.startswith(b"-----BEGIN CERTIFICATE-----")
    assert b"PRIVATE KEY" not in cert  # what a client pins carries no key
    with pytest.raises(ValueError, match="no certificate"):
        tls.certificate_of(b"-----BEGIN PRIVATE KEY-----\n...")
