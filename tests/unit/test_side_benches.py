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


def test_ack_commit_bench_acknowledges_every_row_and_reports_per_ack_figures(tmp_path):
    from benchmarks import ack_commit_bench

    result = ack_commit_bench.run(True, out_dir=str(tmp_path), data_dir=str(tmp_path))  # raises if a row stays
    assert [r["commit"] for r in result["runs"]] == [10, 100]
    for r in result["runs"]:
        assert r["acks"] == 600 and r["commits"] == 600 // r["commit"]
        assert r["cpu_us_per_ack"] > 0 and r["wchar_bytes_per_ack"] > 0
    assert (tmp_path / "ack_commit_bench_quick.json").exists() and (tmp_path / "ack_commit_bench_quick.png").exists()
