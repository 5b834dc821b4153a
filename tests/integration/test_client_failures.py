"""Platform client against the project's broker process: crash safety, poison items, cluster errors, replay."""
from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import textwrap
import time
from collections import Counter
from pathlib import Path

import pytest

from fanout.client import FanoutClient, FanoutDeadLettered, FanoutRejected
from tests.integration.client_fixtures import (  # noqa: F401 - pytest fixtures
    PLATFORM,
    BrokerProcess,
    MqttProxy,
    Watcher,
    client_broker,
    client_kwargs,
    free_port,
    publish_cluster_error,
    start_client_broker,
    vins,
    client_watcher,
)

CHILD = textwrap.dedent(
    """
    import asyncio, sys
    from fanout import log
    from fanout.client import FanoutClient

    log.configure(json=True, level="warning")  # logs to stderr; stdout carries the ACCEPTED lines

    async def main(port, outbox):
        async with FanoutClient(port=port, username=sys.argv[3], password=sys.argv[4], outbox_dir=outbox,
                                connect_timeout_s=0.3, reconnect_min_s=0.05, reconnect_max_s=0.2) as c:
            print("STARTED", c.mode, flush=True)
            for i in range(100000):
                h = await c.submit([f"VIN{i:014d}", f"VIN{i + 1:014d}"], b"payload-%d" % (i % 7), request_id=f"k{i:05d}")
                print("ACCEPTED", h.request_id, h.mode, flush=True)

    asyncio.run(main(int(sys.argv[1]), sys.argv[2]))
    """
)


async def test_client_killed_in_cold_mode_loses_nothing(start_client_broker, tmp_path: Path) -> None:
    port = free_port()  # no broker yet: the child runs COLD, every submit fsynced before it returns
    outbox = tmp_path / "ob"
    script = tmp_path / "child.py"
    script.write_text(CHILD)
    env = dict(os.environ, FANOUT_LOG_LEVEL="warning", PYTHONPATH=str(Path.cwd()))
    child = subprocess.Popen([sys.executable, str(script), str(port), str(outbox), *PLATFORM], stdout=subprocess.PIPE,
                             stderr=subprocess.DEVNULL, text=True, env=env)
    accepted: list[str] = []
    try:
        assert child.stdout is not None
        assert child.stdout.readline().split() == ["STARTED", "cold"]
        while len(accepted) < 150:
            word, rid, mode = child.stdout.readline().split()
            assert (word, mode) == ("ACCEPTED", "cold")
            accepted.append(rid)
        child.send_signal(signal.SIGKILL)  # mid-stream: the child is still submitting
        child.wait(10)
        accepted += [line.split()[1] for line in child.stdout.read().splitlines() if line.startswith("ACCEPTED")]
    finally:
        if child.poll() is None:
            child.kill()
            child.wait(10)
    broker = start_client_broker(port=port)
    watcher = Watcher(broker.port)
    watcher.connect()
    try:
        async with FanoutClient(**client_kwargs(port, outbox)) as client:
            assert client.status().outbox_depth >= len(accepted)
            assert await client.drain(30)
            assert client.mode == "hot"
        assert watcher.wait_for(lambda w: set(w.request_ids()) >= set(accepted), 15)
        seen = list(dict.fromkeys(watcher.request_ids()))
        assert seen[: len(accepted)] == accepted  # in submission order; at most the one being committed follows
        assert len(seen) <= len(accepted) + 1
    finally:
        watcher.disconnect()


async def test_poison_item_is_dead_lettered_after_max_attempts_while_later_items_go_through(start_client_broker, tmp_path: Path) -> None:
    broker = start_client_broker(max_packet_size="64KiB")  # a larger packet makes the broker close the connection
    watcher = Watcher(broker.port)
    watcher.connect()
    kwargs = client_kwargs(broker.port, tmp_path / "ob", max_attempts=3, backoff_base_s=0.05, reconnect_min_s=0.02, reconnect_max_s=0.2)
    try:
        async with FanoutClient(**kwargs) as client:
            t0 = time.monotonic()
            good = [await client.submit(vins(10), b"ok", request_id=f"g{i}") for i in range(5)]
            poison = await client.submit(vins(10), os.urandom(100_000), request_id="poison")
            good += [await client.submit(vins(10), b"ok", request_id=f"g{i}") for i in range(5, 10)]
            with pytest.raises(FanoutDeadLettered) as info:
                await poison.acked(timeout=30)
            assert not isinstance(info.value, FanoutRejected)
            assert info.value.attempts == 3 and info.value.request_id == "poison", info.value
            await asyncio.wait_for(asyncio.gather(*(h.acked() for h in good)), 30)
            assert await client.drain(10), client.status()
            [dead] = await client.dead_letters()
            assert (dead.request_id, dead.attempts, dead.payload_bytes) == ("poison", 3, 100_000)
            assert "disconnected" in dead.last_error or "closed" in dead.last_error, dead
            assert await _eventually(lambda: client.mode == "hot")  # reconnected after the poison's last close
            st = client.status()
            assert (st.dead_letters, st.outbox_depth, st.mode) == (1, 0, "hot"), st
            assert time.monotonic() - t0 < 20
        expected = [f"g{i}" for i in range(10)]
        assert watcher.wait_for(lambda w: set(w.request_ids()) >= set(expected), 10)
        ids = watcher.request_ids()
        assert list(dict.fromkeys(ids)) == expected and "poison" not in ids, ids  # later items in order, not blocked
    finally:
        watcher.disconnect()


async def test_cluster_error_surfaces_naming_the_field_then_replay_delivers(client_broker: BrokerProcess, client_watcher: Watcher, tmp_path: Path) -> None:
    proxy = MqttProxy(client_broker.port)
    await proxy.start()
    proxy.drop_pubacks = True  # the cluster contract for invalid input: error, no PUBACK, close
    try:
        async with FanoutClient(**client_kwargs(proxy.port, tmp_path / "ob")) as client:
            bad = await client.submit(vins(20), b"blob", request_id="bad-req")
            assert await client_watcher.await_for(lambda w: "bad-req" in w.request_ids(), 10)
            error = {"error": "invalid_trigger", "field": "ids[17]", "reason": "not a VIN", "request_id": "bad-req"}
            await asyncio.to_thread(publish_cluster_error, client_broker.port, client.client_id, error)
            with pytest.raises(FanoutRejected) as info:
                await bad.acked(timeout=10)
            assert (info.value.field, info.value.error, info.value.reason) == ("ids[17]", "invalid_trigger", "not a VIN")
            assert "ids[17]" in str(info.value)
            [dead] = await client.dead_letters()
            assert dead.request_id == "bad-req" and "ids[17]" in dead.last_error and dead.attempts == 1
            # an error naming no known request is logged and kept as last_error, nothing else fails
            await asyncio.to_thread(publish_cluster_error, client_broker.port, client.client_id, {"error": "invalid_trigger", "reason": "not JSON"})
            assert await _eventually(lambda: "not JSON" in client.status().last_error)
            proxy.drop_pubacks = False
            proxy.cut()  # the cluster closes the connection after an error
            good = await client.submit(vins(5), b"blob", request_id="good-req")
            await good.acked(timeout=10)
            assert await client.replay_dead_letters() == 1
            assert await client.drain(10)
            assert client.status().dead_letters == 0 and await client.dead_letters() == []
        assert client_watcher.wait_for(lambda w: Counter(w.request_ids())["bad-req"] == 2, 10)
        assert client_watcher.request_ids()[-2:] in (["good-req", "bad-req"], ["bad-req", "good-req"])
    finally:
        await proxy.close()


async def _eventually(pred, timeout: float = 5.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if pred():
            return True
        await asyncio.sleep(0.02)
    return pred()


async def test_a_server_that_never_answers_connect_is_named_in_the_error(tmp_path: Path) -> None:
    """A listener that accepts TCP and sends no CONNACK (an overloaded or wrong server): the client's error says
    what did not come within its connect timeout (it said "cannot connect to mqtt://...: " and nothing more)."""
    accepted: list[asyncio.StreamWriter] = []

    async def silent(_reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        accepted.append(writer)

    server = await asyncio.start_server(silent, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    client = FanoutClient(port=port, username=PLATFORM[0], password=PLATFORM[1], outbox_dir=tmp_path / "ob",
                          connect_timeout_s=0.3, reconnect_min_s=0.05, reconnect_max_s=0.2)
    try:
        await client.start()
        assert not client.status().connected and accepted
        assert client.status().last_error == f"cannot connect to mqtt://127.0.0.1:{port}: no CONNACK within 0.3 s"
    finally:
        await client.close()
        for w in accepted:
            w.close()
        server.close()
        await server.wait_closed()
