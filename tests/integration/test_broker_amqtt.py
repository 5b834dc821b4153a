"""MQTT semantics over real TCP with amqtt's client (``amqtt.client.MQTTClient``), a second
independent implementation next to paho. The broker runs in its own thread; these tests run the
clients on the test's event loop."""
from __future__ import annotations

import asyncio
import contextlib
import uuid

import pytest
from amqtt.client import MQTTClient

from fanout.mqtt.packets import Will

pytestmark = pytest.mark.timeout(60)


@contextlib.asynccontextmanager
async def amqtt_client(port: int, client_id: str | None = None, *, clean: bool = True, keep_alive: int = 10,
                       will: dict | None = None):
    config = {"keep_alive": keep_alive, "auto_reconnect": False, "plugins": {}}
    if will:
        config["will"] = will
    c = MQTTClient(client_id=client_id or f"amqtt-{uuid.uuid4().hex[:8]}", config=config)
    await asyncio.wait_for(c.connect(f"mqtt://127.0.0.1:{port}", cleansession=clean), 5)
    try:
        yield c
    finally:
        with contextlib.suppress(Exception):
            await asyncio.wait_for(c.disconnect(), 5)


async def _get(c: MQTTClient, timeout: float = 5.0):
    msg = await c.deliver_message(timeout_duration=timeout)
    assert msg is not None, "no message delivered"
    return msg


async def test_pubsub_all_qos_with_downgrade(broker):
    async with amqtt_client(broker.port) as sub, amqtt_client(broker.port) as pub:
        assert await sub.subscribe([("aq/0", 0), ("aq/1", 1), ("aq/2", 2)]) == [0, 1, 2]
        await pub.publish("aq/0", b"a", qos=2)
        await pub.publish("aq/1", b"b", qos=2)
        await pub.publish("aq/2", b"c", qos=2)
        got = {}
        for _ in range(3):
            m = await _get(sub)
            got[m.topic] = (m.data, m.qos)
        assert got == {"aq/0": (b"a", 0), "aq/1": (b"b", 1), "aq/2": (b"c", 2)}


async def test_retained_replay_and_clear(broker):
    async with amqtt_client(broker.port) as pub:
        await pub.publish("aret/x", b"kept", qos=1, retain=True)
        async with amqtt_client(broker.port) as sub:
            await sub.subscribe([("aret/#", 1)])
            m = await _get(sub)
            assert (m.topic, m.data, m.retain) == ("aret/x", b"kept", True)
        await pub.publish("aret/x", b"", qos=1, retain=True)
        async with amqtt_client(broker.port) as sub:
            await sub.subscribe([("aret/#", 1)])
            with pytest.raises(asyncio.TimeoutError):
                await sub.deliver_message(timeout_duration=0.3)


async def test_offline_queue_session_present(broker):
    cid = "amqtt-persistent"
    async with amqtt_client(broker.port, cid, clean=False) as sub:
        await sub.subscribe([("aoff/#", 1)])
    async with amqtt_client(broker.port) as pub:
        for i in range(3):
            await pub.publish("aoff/t", b"%d" % i, qos=1)
    present = await broker_session_present(broker, cid)
    assert present is True
    async with amqtt_client(broker.port, cid, clean=False) as sub:
        assert [(await _get(sub)).data for _ in range(3)] == [b"0", b"1", b"2"]


async def broker_session_present(broker, cid: str) -> bool:
    return await asyncio.to_thread(broker.call, lambda: cid in broker.broker.sessions)


async def test_sys_not_matched_by_hash(start_broker):
    rb = start_broker(mqtt={"sys_interval": "100ms"})
    async with amqtt_client(rb.port) as all_, amqtt_client(rb.port) as sys_:
        await all_.subscribe([("#", 0)])
        await sys_.subscribe([("$SYS/broker/uptime", 0)])
        m = await _get(sys_, 3)
        assert m.topic == "$SYS/broker/uptime"
        with pytest.raises(asyncio.TimeoutError):
            await all_.deliver_message(timeout_duration=0.4)


async def test_will_on_keepalive_expiry(broker, raw_client):
    async with amqtt_client(broker.port) as watcher:
        await watcher.subscribe([("awill/#", 0)])
        silent = await asyncio.to_thread(raw_client, broker)
        ack = await asyncio.to_thread(silent.connect, "asilent", True, 1, will=Will("awill/x", b"expired", 0, False))
        assert ack.return_code == 0
        m = await _get(watcher, 4)  # no PINGREQ: closed after 1.5 s, will published
        assert (m.topic, m.data) == ("awill/x", b"expired")


async def test_overlapping_subscriptions(broker):
    async with amqtt_client(broker.port) as sub, amqtt_client(broker.port) as pub:
        await sub.subscribe([("aov/#", 1), ("aov/+", 2)])
        await pub.publish("aov/x", b"once", qos=2)
        m = await _get(sub)
        assert m.qos == 2
        with pytest.raises(asyncio.TimeoutError):
            await sub.deliver_message(timeout_duration=0.3)


async def test_acl_subscribe_refused(start_broker):
    rb = start_broker(acl=[{"action": "subscribe", "topic": "test/nosubscribe", "allow": False}])
    async with amqtt_client(rb.port) as c:
        assert await c.subscribe([("test/nosubscribe", 1), ("test/yes", 1)]) == [0x80, 1]


async def test_unsubscribe(broker):
    async with amqtt_client(broker.port) as sub, amqtt_client(broker.port) as pub:
        await sub.subscribe([("aun", 1)])
        await sub.unsubscribe(["aun", "not/subscribed"])
        await pub.publish("aun", b"x", qos=1)
        with pytest.raises(asyncio.TimeoutError):
            await sub.deliver_message(timeout_duration=0.3)
