"""benchmarks.connect_side_bench, append_side_bench and heartbeat_side_bench: every vehicle of a small run is
connected through the node core and the dispatcher cores, every durable publish is acknowledged, every
heartbeat reaches a dispatcher core, and the CPU figures come out positive.
Plumbing only, no speed assertion."""
from __future__ import annotations

import asyncio
import math

from benchmarks import connect_side_bench


def test_a_small_run_connects_every_vehicle_and_reports_both_sides():
    node, dispatcher = asyncio.run(connect_side_bench.run(300, 64))  # raises unless all 300 connected
    assert math.isfinite(node) and node > 0
    assert math.isfinite(dispatcher) and dispatcher >= 0


def test_append_side_bench_acknowledges_every_publish():
    from benchmarks import append_side_bench

    us = asyncio.run(append_side_bench.run(2048, 32))  # raises unless every publish got its PUBACK
    assert math.isfinite(us) and us > 0


def test_heartbeat_side_bench_ships_every_heartbeat_to_a_dispatcher_core():
    from benchmarks import heartbeat_side_bench

    node, dispatcher, sent = asyncio.run(heartbeat_side_bench.run(300, 2, 64))  # raises unless all were applied
    assert sent == 600
    assert math.isfinite(node) and node > 0
    assert math.isfinite(dispatcher) and dispatcher >= 0
