"""The node side of a vehicle connect alone, for A/B runs on a loaded machine: hotpath_bench's node (NodeCore +
broker core, real LMDB dispatcher cores behind a LocalShardLink) takes what the compiled fleet's connection
storm sends (CONNECT, SUBSCRIBE ``agent/<VIN>/proxy/request/+``, PUBLISH ``ecp/<VIN>/online``) for ``chunk``
vehicles at a time, the way a node tick coalesces them: the CONNECTs, the presence events to the dispatcher
cores, the held CONNACKs released, then the SUBSCRIBEs and the online publishes and their events. Prints
process-CPU µs per connect of the node side and of the dispatcher cores; no sockets, no Ray.

    python -m benchmarks.connect_side_bench LABEL VEHICLES [CHUNK] [--profile]

``--profile`` prints cProfile's top functions of the whole run (it inflates the figures several times).
It uses ``hotpath_bench.HotPath`` and its measuring helpers: to run it on an older commit, copy both there.
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
from fanout.mqtt.packets import Connect, Publish, Subscribe


async def run(vehicles: int, chunk: int, profile: bool = False) -> tuple[float, float]:
    """(node, dispatcher) CPU µs per connect of ``vehicles`` connects, ``chunk`` per round."""
    with tempfile.TemporaryDirectory(prefix="connect-side-") as d:
        hp = hb.HotPath(Path(d), vehicles, 2, False)
        broker, edge, cores = hp.broker, hp.edge, hp.cores
        packets = {v: (encode(Connect(v, True, 60, None, None, None)),
                       encode(Subscribe(1, ((f"agent/{v}/proxy/request/+", 1),))),  # the filter cfleet subscribes
                       encode(Publish(f"ecp/{v}/online", b"1", 0, False, False, None))) for v in hp.vins}
        prof = hb.start_measuring(profile)
        pc = time.process_time
        node = dispatcher = 0.0
        for i in range(0, vehicles, chunk):
            part = hp.vins[i:i + chunk]
            t0 = pc()
            conns = []
            for v in part:
                c = broker.connection_made(hp.now, ("127.0.0.1", 50000))
                c.transport = hb._Peer()
                conns.append(c)
                broker.data_received(c, packets[v][0], hp.now)
            broker.flush()
            for phase in ("connect", "online"):
                taken = edge.take_events()
                t1 = pc()
                node += t1 - t0
                for shard, events in taken.items():
                    cores[shard].apply_events("n0", events)
                t0 = pc()
                dispatcher += t0 - t1
                for shard in taken:
                    edge.events_done(shard)  # the held CONNACKs go out
                broker.flush()
                if phase == "online":
                    break
                for c, v in zip(conns, part):
                    broker.data_received(c, packets[v][1], hp.now)
                broker.flush()
                for c, v in zip(conns, part):
                    broker.data_received(c, packets[v][2], hp.now)
                broker.flush()
            node += pc() - t0
        hb.stop_measuring(prof)
        connected = broker.state.clients_connected
        hp.close()
    if connected != vehicles:
        raise RuntimeError(f"{connected} of {vehicles} vehicles connected")
    return node / vehicles * 1e6, dispatcher / vehicles * 1e6


def main() -> None:
    args = [a for a in sys.argv[1:] if a != "--profile"]
    label, vehicles = args[0], int(args[1])
    chunk = int(args[2]) if len(args) > 2 else 200
    fanout_log.configure(level="warning", cache=True)  # as the benchmark cluster's actors run
    node, dispatcher = asyncio.run(run(vehicles, chunk, "--profile" in sys.argv))
    print(label, vehicles, chunk, "node", round(node, 2), "dispatcher", round(dispatcher, 2))


if __name__ == "__main__":
    main()
