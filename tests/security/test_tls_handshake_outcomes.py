"""fanout.mqtt.tls_handshakes with real handshakes over loopback sockets, under both event loops the broker
runs on (uvloop and asyncio's own): each outcome counted once, and the bound on handshakes in progress
closing one more at once while a timed-out one frees its place."""
from __future__ import annotations

import asyncio
import datetime
import gc
import ssl

import pytest
import trustme
import uvloop

from fanout.mqtt.tls_handshakes import HandshakeStats

LOOPS = {"uvloop": uvloop.new_event_loop, "asyncio": asyncio.new_event_loop}


class _Quiet(asyncio.Protocol):
    """Serves nothing: the handshake's outcome is what these tests read."""


def _run(loop_name: str, coro_fn):
    loop = LOOPS[loop_name]()
    try:
        return loop.run_until_complete(coro_fn())
    finally:
        loop.close()


@pytest.fixture(scope="module")
def ca() -> trustme.CA:
    return trustme.CA()


def _server_ctx(ca: trustme.CA, client_auth: bool) -> ssl.SSLContext:
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    ca.issue_cert("127.0.0.1").configure_cert(ctx)
    if client_auth:
        ca.configure_trust(ctx)
        ctx.verify_mode = ssl.CERT_REQUIRED
    return ctx


def _client_ctx(ca: trustme.CA, leaf: trustme.LeafCert | None = None) -> ssl.SSLContext:
    ctx = ssl.create_default_context()
    ca.configure_trust(ctx)
    if leaf is not None:
        leaf.configure_cert(ctx)
    return ctx


async def _serve(ctx: ssl.SSLContext, timeout_s: float = 5.0) -> tuple[asyncio.base_events.Server, int]:
    server = await asyncio.get_running_loop().create_server(_Quiet, "127.0.0.1", 0, ssl=ctx,
                                                            ssl_handshake_timeout=timeout_s)
    return server, server.sockets[0].getsockname()[1]


async def _tls_client(port: int, ctx: ssl.SSLContext) -> bool:
    """True when the handshake completed and the server did not close at once (TLS 1.3 refuses a client
    certificate after the client's side is done: that shows as an error or EOF on the first read)."""
    try:
        reader, writer = await asyncio.open_connection("127.0.0.1", port, ssl=ctx, server_hostname="127.0.0.1")
    except (ssl.SSLError, ConnectionError):
        return False
    try:
        writer.write(b"x")
        await writer.drain()
        try:
            data = await asyncio.wait_for(reader.read(1), 0.3)
        except asyncio.TimeoutError:
            return True  # still open: accepted
        return data != b""
    except (ssl.SSLError, ConnectionError):
        return False
    finally:
        writer.close()


async def _until(cond, timeout_s: float = 5.0) -> None:
    deadline = asyncio.get_running_loop().time() + timeout_s
    while not cond():
        if asyncio.get_running_loop().time() > deadline:
            raise AssertionError("condition not met in time")
        gc.collect()  # asyncio's own loop frees an abandoned handshake's objects at a collection
        await asyncio.sleep(0.02)


@pytest.mark.parametrize("loop_name", sorted(LOOPS))
def test_each_outcome_is_counted_once(ca, loop_name):
    stats = HandshakeStats("mqtt", 100, "mqtt.max_tls_handshakes")

    async def scenario() -> dict[str, int]:
        server, port = await _serve(stats.install(_server_ctx(ca, client_auth=True)))
        try:
            assert await _tls_client(port, _client_ctx(ca, ca.issue_cert("device-1")))
            assert not await _tls_client(port, _client_ctx(ca, trustme.CA().issue_cert("device-2")))  # another CA
            now = datetime.datetime.now(datetime.timezone.utc)
            expired = ca.issue_cert("device-3", not_before=now - datetime.timedelta(days=9),
                                    not_after=now - datetime.timedelta(days=1))
            assert not await _tls_client(port, _client_ctx(ca, expired))
            r, w = await asyncio.open_connection("127.0.0.1", port)  # MQTT in clear text on the TLS port
            w.write(b"\x10\x0d\x00\x04MQTT\x04\x02\x00\x3c\x00\x01x")
            assert await asyncio.wait_for(r.read(), 5) == b""
            w.close()
            r, w = await asyncio.open_connection("127.0.0.1", port)  # connects, then leaves mid-handshake
            await _until(lambda: stats.running == 1)
            w.close()
            await _until(lambda: stats.running == 0)
            return stats.figures()
        finally:
            server.close()

    figures = _run(loop_name, scenario)
    assert figures == {"running": 0, "completed": 1, "abandoned": 1, "refused": 0,
                       "failed/certificate": 2, "failed/protocol": 1}, figures


@pytest.mark.parametrize("loop_name", sorted(LOOPS))
def test_past_the_limit_a_connection_is_closed_at_once_and_a_timed_out_one_frees_its_place(ca, loop_name):
    refused: list[int] = []
    stats = HandshakeStats("mqtt", 3, "mqtt.max_tls_handshakes", on_refused=lambda: refused.append(1))

    async def scenario() -> None:
        server, port = await _serve(stats.install(_server_ctx(ca, client_auth=False)), timeout_s=0.5)
        try:
            stalled = [await asyncio.open_connection("127.0.0.1", port) for _ in range(3)]
            await _until(lambda: stats.running == 3)
            extra_r, extra_w = await asyncio.open_connection("127.0.0.1", port)
            assert await asyncio.wait_for(extra_r.read(), 2) == b""  # closed at once, not after the timeout
            assert (stats.refused, len(refused), stats.running) == (1, 1, 3)
            for r, _ in stalled:  # the handshake timeout (0.5 s) closes the stalled ones
                assert await asyncio.wait_for(r.read(), 5) == b""
            await _until(lambda: stats.running == 0)
            assert stats.abandoned == 3
            assert await _tls_client(port, _client_ctx(ca))  # a place is free again
            assert stats.completed == 1
            for _, w in stalled + [(extra_r, extra_w)]:
                w.close()
        finally:
            server.close()

    _run(loop_name, scenario)
