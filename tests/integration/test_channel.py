"""Direct channels (fanout.channel.peer) over real loopback TCP, without Ray."""
from __future__ import annotations

import asyncio

import pytest

from fanout.channel import ChannelClient, ChannelError, ChannelServer
from storage.errors import FencedError

SECRET = b"s" * 32


class Callee:
    def __init__(self) -> None:
        self.calls: list[tuple] = []
        self.gate = asyncio.Event()
        self.gate.set()

    async def echo(self, *args):
        self.calls.append(args)
        return args

    async def slow(self, x):
        await self.gate.wait()
        return x

    async def fenced(self):
        raise FencedError("deposed", epoch=3, known_epoch=4)

    async def value_error(self):
        raise ValueError("replica ahead")


async def _serve(callee: Callee, service: str = "svc", **kw) -> ChannelServer:
    server = ChannelServer(SECRET, service, {"echo": callee.echo, "slow": callee.slow, "fenced": callee.fenced,
                                             "value_error": callee.value_error}, **kw)
    await server.start("127.0.0.1", 0)
    return server


def _client(server: ChannelServer, service: str = "svc", secret: bytes = SECRET, **kw) -> ChannelClient:
    async def resolve():
        return server.address

    return ChannelClient(secret, service, resolve, **kw)


async def test_calls_return_results_and_keep_the_order_they_were_started_in():
    callee = Callee()
    server = await _serve(callee)
    client = _client(server)
    try:
        big = b"x" * (3 << 20)
        results = await asyncio.gather(*(client.call("echo", i, big if i == 5 else b"") for i in range(50)))
        assert [r[0] for r in results] == list(range(50))
        assert results[5][1] == big
        assert [c[0] for c in callee.calls] == list(range(50))  # started in the order sent
        assert client.connects == 1
    finally:
        client.close()
        await server.close()


async def test_the_handlers_exception_reaches_the_caller_with_its_type():
    server = await _serve(Callee())
    client = _client(server)
    try:
        with pytest.raises(FencedError) as info:
            await client.call("fenced")
        assert info.value.known_epoch == 4
        with pytest.raises(ValueError, match="replica ahead"):
            await client.call("value_error")
        with pytest.raises(AttributeError, match="no method"):
            await client.call("nope")
        assert await client.call("echo", 1) == (1,)  # the connection is still good
    finally:
        client.close()
        await server.close()


async def test_a_restarted_server_is_reached_again_and_pending_calls_fail():
    callee = Callee()
    server = await _serve(callee)
    address = {"a": server.address}

    async def resolve():
        return address["a"]

    client = ChannelClient(SECRET, "svc", resolve)
    try:
        assert await client.call("echo", 1) == (1,)
        callee.gate.clear()
        stuck = asyncio.ensure_future(client.call("slow", 2))
        await asyncio.sleep(0.05)
        await server.close()  # the callee dies with a call in flight
        with pytest.raises(ChannelError):
            await asyncio.wait_for(stuck, 5)
        server2 = await _serve(callee)  # restarted elsewhere (another port)
        address["a"] = server2.address
        callee.gate.set()
        assert await client.call("echo", 3) == (3,)
        assert client.connects == 2
        await server2.close()
    finally:
        client.close()


async def test_unreachable_server_fails_the_call_with_a_clear_error():
    server = await _serve(Callee())
    address = server.address
    await server.close()

    async def resolve():
        return address

    client = ChannelClient(SECRET, "svc", resolve)
    with pytest.raises(ChannelError, match="cannot connect to channel svc"):
        await client.call("echo", 1)


async def test_a_request_over_max_frame_is_refused_before_sending():
    callee = Callee()
    server = await _serve(callee)
    client = _client(server, max_frame=1000)
    try:
        with pytest.raises(ChannelError, match="over max_frame"):
            await client.call("echo", b"z" * 2000)
        assert callee.calls == []
        assert await client.call("echo", b"ok") == (b"ok",)
    finally:
        client.close()
        await server.close()


async def test_a_connection_with_max_inflight_requests_stops_reading_until_one_finishes():
    callee = Callee()
    callee.gate.clear()
    server = await _serve(callee, max_inflight=4)
    client = _client(server)
    try:
        calls = [asyncio.ensure_future(client.call("slow", i)) for i in range(20)]
        await asyncio.sleep(0.2)
        (conn,) = server._conns
        assert conn.inflight <= 4 + 16  # what arrived in the last read is started, then reading pauses
        assert conn.paused
        callee.gate.set()
        assert await asyncio.wait_for(asyncio.gather(*calls), 10) == list(range(20))
        assert not conn.paused
    finally:
        client.close()
        await server.close()
