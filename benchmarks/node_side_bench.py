"""The node side of a delivery alone, for A/B runs on a loaded machine: hotpath_bench's node (NodeCore + broker
core) gets deliver batches built here (the dispatchers are not run), writes them, takes the vehicles' PUBACKs
and the events they make. Prints process-CPU µs per delivery.

    python -m benchmarks.node_side_bench LABEL ROUNDS VEHICLES

Deterministic under load: instructions per delivery from two runs under callgrind,
``(Ir(6 rounds) - Ir(2 rounds)) / (4 x VEHICLES)`` (the set-up cancels out)::

    valgrind --tool=callgrind python -m benchmarks.node_side_bench x 2 1000   # "Collected : Ir"
    valgrind --tool=callgrind python -m benchmarks.node_side_bench x 6 1000

It uses only what ``hotpath_bench.HotPath`` offers, so it runs on older commits too (copy it there).
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
from fanout.mqtt.packets import Puback


async def run(rounds: int, vehicles: int) -> float:
    """CPU µs per delivery of ``rounds`` deliver batches, one message per vehicle each."""
    with tempfile.TemporaryDirectory(prefix="node-side-") as d:
        hp = hb.HotPath(Path(d), vehicles, 2, False)
        await hp.connect_all()
        edge, broker = hp.edge, hp.broker
        edge.take_events()
        blob = b"x" * 256
        acks = [encode(Puback(p)) for p in range(1, 65536)]
        t = time.process_time()
        for r in range(rounds):
            sends = [(v, edge._live[v][1], b"key-%d-%d" % (r, i), f"req{r:04d}", "d1", False)
                     for i, v in enumerate(hp.vins)]
            failures = edge.apply_deliveries(sends, {"d1": blob}, ())
            assert not failures, failures[:3]
            broker.flush()
            for v in hp.vins:
                broker.data_received(hp.conns[v], acks[r], 1)  # packet ids go 1, 2, ... per session
            broker.flush()
            edge.take_events()
        took = time.process_time() - t
        hp.close()
    return took / (rounds * vehicles) * 1e6


def main() -> None:
    label, rounds, vehicles = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    fanout_log.configure(level="warning")
    print(label, rounds, round(asyncio.run(run(rounds, vehicles)), 3))


if __name__ == "__main__":
    main()
