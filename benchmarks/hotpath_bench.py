"""Ray-free hot path of one delivery: the node's NodeCore + broker core and the dispatchers' DispatcherCores.

What it measures: CPU µs per delivery on each side of the Ray boundary, with real LMDB shards and the
in-memory broker (no sockets, no Ray, no fleet), so a change to the per-delivery cost shows up without
the noise of a shared machine. The loop plays the two actors the way they run in production: each
round the vehicles' PUBACKs reach the broker, the node ships its event batches, each dispatcher applies
them, drains, writes its deletes in one batch and returns one deliver batch per node.

    python -m benchmarks.hotpath_bench [--vehicles 10000] [--requests 10] [--chunk 2000] [--shards 2] [--sync] [--profile]

``--chunk`` caps the vehicles whose acks are in one round (the production tick coalesces ~1-3k).
"""
from __future__ import annotations

import argparse
import asyncio
import gc
import json
import os
import tempfile
import time
from pathlib import Path
from typing import Any

from fanout import log as fanout_log
from benchmarks.local_link import LocalShardLink
from fanout.config import load_config, mqtt_settings
from fanout.dispatcher.core import DispatcherCore
from fanout.mqtt.auth import AccessControl
from fanout.mqtt.broker import Broker
from fanout.mqtt.codec import PacketReader, encode
from fanout.mqtt.packets import Connect, Puback, Publish, Subscribe
from fanout.node.core import NodeCore
from storage import ShardStore

PREFIX = "agent/{VIN}/proxy/request"


class _Peer:
    """The transport of one fake vehicle: collects the publishes' packet ids."""

    __slots__ = ("reader", "pids")

    def __init__(self) -> None:
        self.reader = PacketReader()
        self.pids: list[int] = []


def start_measuring(profile: bool) -> Any:
    """Before a measured loop: a full collection, the actors' GC thresholds, and cProfile started when
    ``profile`` (the profiler, else None; pass it to :func:`stop_measuring`)."""
    gc.collect()
    gc.set_threshold(50_000, 50, 100)  # the actors' GC thresholds (actors/dispatcher.py)
    if not profile:
        return None
    import cProfile

    prof = cProfile.Profile()
    prof.enable()
    return prof


def stop_measuring(prof: Any, top: int = 35) -> None:
    """After the measured loop: stop the profiler of :func:`start_measuring` and print its ``top`` functions."""
    if prof is not None:
        prof.disable()
        import pstats

        pstats.Stats(prof).sort_stats("tottime").print_stats(top)


class HotPath:
    def __init__(self, root: Path, vehicles: int, shards: int, sync: bool) -> None:
        cfg = load_config(None, env={}).replace("mqtt", sys_interval="0s", max_connections=vehicles + 10,
                                                max_platform_packet_size="64MiB")
        self.stores = [ShardStore(root / f"shard-{k}", k, sync=sync) for k in range(shards)]
        self.cores = [DispatcherCore(s, k, shards, started_ms=0) for k, s in enumerate(self.stores)]
        self.edge = NodeCore(cfg, "n0", LocalShardLink(self.cores))
        self.broker = Broker(mqtt_settings(cfg), AccessControl(mqtt_settings(cfg), listener_is_loopback=True), self.edge, now_ms=1)
        self.edge.attach(self.broker)
        self.vins = [f"WVW{i:014d}" for i in range(vehicles)]
        self.conns: dict[str, Any] = {}
        self.node_s = 0.0
        self.disp_s = 0.0
        self.vehicle_s = 0.0
        self.delivered = 0
        self.now = 1

    def flush(self) -> None:
        pc = time.process_time
        for conn, data in self.broker.flush():
            peer = conn.transport
            if data and peer is not None:
                t = pc()
                for p in peer.reader.feed(data):
                    if type(p) is Publish:
                        peer.pids.append(p.packet_id)
                self.vehicle_s += pc() - t  # the vehicle's decode is not the node's cost

    async def connect_all(self) -> None:
        for vin in self.vins:
            conn = self.broker.connection_made(self.now, ("127.0.0.1", 50000))
            conn.transport = _Peer()
            self.conns[vin] = conn
            data = encode(Connect(vin, True, 60, None, None, None)) + encode(
                Subscribe(1, ((f"agent/{vin}/proxy/request/+", 1),)))
            self.broker.data_received(conn, data, self.now)
            hb = encode(Publish(f"ecp/{vin}/online", b"1", 0, False, False, None))
            self.broker.data_received(conn, hb, self.now)
        self.flush()
        await self.pump()

    async def trigger(self, request_id: str, blob: bytes) -> None:
        p = self.broker.connection_made(self.now, ("127.0.0.1", 40000))
        p.transport = _Peer()
        self.broker.data_received(p, encode(Connect("platform-1", True, 60, "platform", b"platform", None)), self.now)
        body = json.dumps({"ids": self.vins, "request_id": request_id, "data_id": "d1"}).encode()
        self.broker.data_received(p, encode(Publish("$SDV-FANOUT/data/d1", blob, 1, False, False, 1))
                                  + encode(Publish("$SDV-FANOUT/trigger", body, 1, False, False, 2)), self.now)
        self.flush()
        await self.edge.process_ingest()
        self.broker.connection_lost(p, self.now)

    async def pump(self) -> None:
        edge, cores = self.edge, self.cores
        pc = time.process_time
        t0 = pc()
        for shard, events in edge.take_events().items():
            t1 = pc()
            self.node_s += t1 - t0
            cores[shard].apply_events("n0", events)
            t0 = pc()
            self.disp_s += t0 - t1
        self._ship()

    def _ship(self) -> None:
        pc = time.process_time
        for core in self.cores:
            t0 = pc()
            core.drain(self.now)
            batches = [core.take_node_batch(node, 5000) for node in core.nodes_with_output()]
            taken = core.take_deletes(self.now)
            if taken:
                core.store.apply(taken[0])
                core.deletes_applied(taken[1])
            t1 = pc()
            self.disp_s += t1 - t0
            for sends, payloads, kicks, props in batches:
                failures = self.edge.apply_deliveries(sends, payloads, kicks, props)
                core.delivery_failures("n0", failures)
            v = self.vehicle_s
            self.flush()
            self.node_s += pc() - t1 - (self.vehicle_s - v)

    async def ack_round(self, chunk: int) -> int:
        """Every vehicle acks what it received, ``chunk`` vehicles per round; returns the acks sent."""
        acks = 0
        pending = [(vin, c) for vin, c in self.conns.items() if c.transport.pids]
        pc = time.process_time
        for i in range(0, len(pending), chunk):
            t0 = pc()
            for vin, conn in pending[i:i + chunk]:
                peer = conn.transport
                data = b"".join(encode(Puback(pid)) for pid in peer.pids)
                acks += len(peer.pids)
                peer.pids.clear()
                t1 = pc()
                self.broker.data_received(conn, data, self.now)
                t0 += pc() - t1  # the vehicle's encode is not the node's cost
            v = self.vehicle_s
            self.flush()
            self.node_s += pc() - t0 - (self.vehicle_s - v)
            await self.pump()
        return acks

    def close(self) -> None:
        for s in self.stores:
            s.close()


async def run(vehicles: int, requests: int, chunk: int, shards: int, sync: bool, profile: str | None) -> dict:
    with tempfile.TemporaryDirectory(prefix="hotpath-") as tmp:
        hp = HotPath(Path(tmp), vehicles, shards, sync)
        await hp.connect_all()
        for r in range(requests):
            await hp.trigger(f"req{r:03d}", b"x" * 256)
        hp.node_s = hp.disp_s = 0.0
        prof = start_measuring(bool(profile))
        t = time.perf_counter()
        hp._ship()
        delivered = 0
        while True:
            n = await hp.ack_round(chunk)
            if n == 0:
                break
            delivered += n
        wall = time.perf_counter() - t
        stop_measuring(prof)
        pending = sum(s.pending_count() for s in hp.stores)
        hp.close()
    return {"vehicles": vehicles, "requests": requests, "chunk": chunk, "shards": shards, "sync": sync,
            "delivered": delivered, "pending_after": pending,
            "node_us_per_delivery": round(1e6 * hp.node_s / max(1, delivered), 2),
            "dispatcher_us_per_delivery": round(1e6 * hp.disp_s / max(1, delivered), 2),
            "wall_s": round(wall, 3), "loadavg": os.getloadavg()}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--vehicles", type=int, default=10000)
    ap.add_argument("--requests", type=int, default=10)
    ap.add_argument("--chunk", type=int, default=2000)
    ap.add_argument("--shards", type=int, default=2)
    ap.add_argument("--sync", action="store_true", help="fsync every commit (as in production)")
    ap.add_argument("--profile", action="store_true", help="cProfile the delivery loop")
    a = ap.parse_args()
    fanout_log.configure(level="warning")  # as the benchmark cluster runs
    print(json.dumps(asyncio.run(run(a.vehicles, a.requests, a.chunk, a.shards, a.sync, a.profile))))


if __name__ == "__main__":
    main()
