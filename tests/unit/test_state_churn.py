"""Per-client-id state of the node core and the dispatcher cores returns to baseline when client ids come
and go (Rule 6 of fanout.dispatcher.machine); the caches of known data ids stay bounded."""
from __future__ import annotations

import gc
import json
import logging
import time

import pytest

import structlog

from fanout.dispatcher.blobs import KNOWN_DATA_IDS as DISPATCHER_KNOWN
from fanout.dispatcher.machine import FENCE_SIZE
from fanout.mqtt.codec import encode
from fanout.mqtt.hooks import ClientConnected, ClientDisconnected, Heartbeat, Subscribed, Unsubscribed
from fanout.mqtt.packets import Connect, Puback, Publish, Subscribe
from fanout.node.ingest_rounds import KNOWN_DATA_IDS as NODE_KNOWN
from storage.keys import shard_of

from .test_node_core import Cluster, publish_batch, vehicle

CHURN = 100_000  # through the node and dispatcher cores
BROKER_CHURN = 10_000  # the same through the in-memory broker too (its CONNECT path costs ~10x more)


@pytest.fixture
def quiet_logs():
    """Connection logs at warning: 100,000 connects logged at debug cost more than the cores."""
    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.WARNING))
    yield
    structlog.reset_defaults()


def per_id_state(c: Cluster) -> dict[str, int]:
    node = c.edge.stats()
    shards = [core.stats() for core in c.cores]
    return {
        "node_live": node["live_connections"], "node_covering": node["subscribed_vehicles"],
        "node_queued_events": node["queued_events"], "sessions": node["sessions"],
        "connections": node["connections"], "broker_connections": len(c.broker.connections),
        "dispatcher_vehicles": sum(s["vehicles"] for s in shards),
        "dispatcher_clients": sum(s["clients"] for s in shards),
        "dispatcher_in_flight": sum(s["in_flight"] for s in shards),
        "dispatcher_output": sum(core.has_work for core in c.cores),
    }


async def core_churn(c: Cluster, first: int, last: int) -> None:
    """The broker's events for client ids that connect (clean), subscribe, some send a heartbeat or
    unsubscribe, some reconnect once, and leave; a fifth are not VINs."""
    edge = c.edge
    for base in range(first, last, 1000):
        events: list = []
        for i in range(base, min(base + 1000, last)):
            cid = f"V{i:07d}" if i % 5 else f"app.{i}"
            vehicle = i % 5 != 0  # as the broker reports an anonymous VIN id in development mode
            local = 2 * i
            events.append(ClientConnected(cid, local, False, None, "client", vehicle=vehicle))
            events.append(Subscribed(cid, local, ((f"agent/{cid}/proxy/request/+", 1),)))
            if i % 3 == 0:
                events.append(Heartbeat(cid, local, f"ecp/{cid}/online", b""))
            if i % 7 == 0:
                events.append(Unsubscribed(cid, local, (f"agent/{cid}/proxy/request/+",)))
            if i % 11 == 0:  # a takeover on this node: the second connection closes the first
                events.append(ClientDisconnected(cid, local, "takeover", False, False))
                local += 1
                events.append(ClientConnected(cid, local, False, None, "client", vehicle=vehicle))
            events.append(ClientDisconnected(cid, local, "disconnect", False, False))
        edge.on_events(events)
        await c.pump()


async def broker_churn(c: Cluster, first: int, last: int) -> None:
    """Client ids connect (clean), subscribe, some send a heartbeat, and leave; a fifth are not VINs."""
    b = c.broker
    for i in range(first, last):
        cid = f"V{i:07d}" if i % 5 else f"app.{i}"
        data = encode(Connect(cid, True, 60, None, None, None)) + encode(
            Subscribe(1, ((f"agent/{cid}/proxy/request/+", 1),)))
        if i % 3 == 0:
            data += encode(Publish(f"ecp/{cid}/online", b"", 0, False, False, None))
        conn = b.connection_made(c.now, ("127.0.0.1", 1))
        b.data_received(conn, data, c.now)
        b.connection_lost(conn, c.now)
        if i % 1000 == 999:
            b.flush()
            c.now += 100_000  # keepalive buckets of closed connections come due (the broker frees them)
            b.tick(c.now)
            await c.pump()


async def test_100k_client_ids_leave_no_per_id_state_in_the_node_and_dispatcher_cores(tmp_path, quiet_logs):
    c = Cluster(tmp_path)
    try:
        await core_churn(c, 0, 2_000)  # warm-up: first-use allocations are not per-id state
        baseline = per_id_state(c)
        assert set(baseline.values()) == {0}
        started = time.perf_counter()
        await core_churn(c, 2_000, CHURN)
        assert per_id_state(c) == baseline, time.perf_counter() - started
        # what outlives a client id: the generation of its last connection, bounded per shard
        assert all(core.stats()["fenced"] == FENCE_SIZE for core in c.cores)
    finally:
        c.close()


async def test_client_ids_through_the_broker_leave_no_per_id_state(tmp_path, quiet_logs):
    c = Cluster(tmp_path)
    try:
        await broker_churn(c, 0, 1_000)
        gc.collect()
        baseline = per_id_state(c)
        assert set(baseline.values()) == {0}
        await broker_churn(c, 1_000, BROKER_CHURN)
        assert per_id_state(c) == baseline
        assert c.broker.sessions == {}
    finally:
        c.close()


async def test_vehicle_with_an_unacknowledged_row_keeps_its_state_until_acknowledged(tmp_path):
    c = Cluster(tmp_path)
    vd = c.cores[shard_of("V1", 2)].vd
    try:
        car = vehicle(c, "V1")
        await c.pump()
        await publish_batch(c, ["V1"])
        (first,) = car.publishes()
        car.drop()  # before its PUBACK: the row was handed out, its resend must carry DUP=1
        await c.pump()
        assert vd.vehicle("V1").attempted is not None  # handed out, not acknowledged: pending, kept
        car = vehicle(c, "V1")
        car.send(Publish("ecp/V1/online", b"", 0, False, False, None))
        await c.pump()
        (again,) = car.publishes()
        assert again.dup and again.topic == first.topic
        car.send(Puback(again.packet_id))
        await c.pump()
        car.drop()
        await c.pump()
        assert vd.vehicle("V1") is None and c.pending() == 0
    finally:
        c.close()


@pytest.mark.parametrize("n", [NODE_KNOWN + 500])
async def test_known_data_id_caches_are_bounded(tmp_path, n):
    c = Cluster(tmp_path, shards=1)
    try:
        p = c.platform()
        for i in range(n):
            p.send(Publish(f"$SDV-FANOUT/data/d{i}", b"x", 1, False, False, 1 + i % 60000))
            if i % 500 == 499:
                await c.pump()
        await c.pump()
        assert c.edge.stats()["known_data_ids"] == NODE_KNOWN
        assert c.cores[0].stats()["known_data_ids"] == DISPATCHER_KNOWN
        # a forgotten data id is still found (asked again, then remembered)
        body = json.dumps({"ids": ["V1"], "request_id": "r1", "data_id": "d0"}).encode()
        p.send(Publish("$SDV-FANOUT/trigger", body, 1, False, False, 7))
        await c.pump()
        assert c.pending() == 1
    finally:
        c.close()
