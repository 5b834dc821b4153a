"""The heartbeat path alone, for A/B runs on a loaded machine: hotpath_bench's node (NodeCore + broker core,
real LMDB dispatcher cores behind a LocalShardLink) with ``vehicles`` connected and subscribed takes QoS 0
``ecp/<VIN>/heartbeat`` PUBLISHes, ``chunk`` vehicles per round (what one node tick coalesces in
server_bench's 5,000/s storm is ~50-500), ships the heartbeat events and lets the dispatcher cores apply
them. Nothing is pending, as in the storm's measuring window: the figure is what a heartbeat costs when
it finds nothing to deliver. Prints process-CPU µs per heartbeat of the node side and of the dispatcher
cores; no sockets, no Ray.

    python -m benchmarks.heartbeat_side_bench LABEL VEHICLES [ROUNDS] [CHUNK] [--profile]

Deterministic under load: instructions per heartbeat from two runs under callgrind,
``(Ir(4 rounds) - Ir(2 rounds)) / (2 x VEHICLES)`` (the set-up cancels out)::

    valgrind --tool=callgrind python -m benchmarks.heartbeat_side_bench x 10000 2   # "Collected : Ir"
    valgrind --tool=callgrind python -m benchmarks.heartbeat_side_bench x 10000 4

Use as many vehicles as the storm has (10,000): with fewer, every per-topic cache fits and a cache that
thrashes at fleet size goes unseen (docs/profile.md, tenth round).

``--profile`` prints cProfile's top functions of the measured rounds (it inflates the figures several
times). It uses ``hotpath_bench.HotPath`` and its measuring helpers: to run it on an older commit, copy
both there.
"""
from __future__ import annotations

import asyncio
import sys
import tempfile
import time
from pathlib import Path

import benchmarks.hotpath_bench as hb
from fanout import log as fanout_log
from fanout.mqtt.codec import encode
from fanout.mqtt.packets import Publish


async def run(vehicles: int, rounds: int, chunk: int, profile: bool = False) -> tuple[float, float, int]:
    """(node, dispatcher) CPU µs per heartbeat and the heartbeats sent: ``rounds`` passes over the
    ``vehicles``, ``chunk`` heartbeats per tick."""
    with tempfile.TemporaryDirectory(prefix="heartbeat-side-") as d:
        hp = hb.HotPath(Path(d), vehicles, 2, False)
        await hp.connect_all()
        broker, edge, cores = hp.broker, hp.edge, hp.cores
        beats = [(hp.conns[v], encode(Publish(f"ecp/{v}/heartbeat", b"1", 0, False, False, None))) for v in hp.vins]
        events_before = sum(c.events_in for c in cores)
        prof = hb.start_measuring(profile)
        pc = time.process_time
        node = dispatcher = 0.0
        sent = 0
        for _ in range(rounds):
            for i in range(0, vehicles, chunk):
                t0 = pc()
                for conn, data in beats[i:i + chunk]:
                    broker.data_received(conn, data, hp.now)
                broker.flush()
                taken = edge.take_events()
                t1 = pc()
                node += t1 - t0
                for shard, events in taken.items():
                    cores[shard].apply_events("n0", events)
                    cores[shard].drain(hp.now)
                t0 = pc()
                dispatcher += t0 - t1
                for shard in taken:
                    edge.events_done(shard)
                broker.flush()
                node += pc() - t0
                sent += len(beats[i:i + chunk])
        hb.stop_measuring(prof)
        stray = sum(len(c.transport.pids) for c in hp.conns.values())
        events = sum(c.events_in for c in cores) - events_before
        hp.close()
    if stray:
        raise RuntimeError(f"{stray} publishes reached vehicles that had nothing pending")
    if events != sent:
        raise RuntimeError(f"the dispatcher cores applied {events} events for {sent} heartbeats")
    return node / sent * 1e6, dispatcher / sent * 1e6, sent


def main() -> None:
    args = [a for a in sys.argv[1:] if a != "--profile"]
    label, vehicles = args[0], int(args[1])
    rounds = int(args[2]) if len(args) > 2 else 5
    chunk = int(args[3]) if len(args) > 3 else 200
    fanout_log.configure(level="warning", cache=True)  # as the benchmark cluster's actors run
    node, dispatcher, sent = asyncio.run(run(vehicles, rounds, chunk, "--profile" in sys.argv))
    print(label, vehicles, rounds, chunk, "heartbeats", sent, "node", round(node, 2), "dispatcher", round(dispatcher, 2))


if __name__ == "__main__":
    main()
