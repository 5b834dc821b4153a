"""Benchmark result names: a run narrower than the whole benchmark never takes the whole run's file name."""
from __future__ import annotations

from dataclasses import replace

from benchmarks import server_bench
from benchmarks.harness.results import result_name


def test_whole_quick_and_partial_names() -> None:
    assert result_name("server_bench", False) == "server_bench"
    assert result_name("server_bench", True) == "server_bench_quick"
    assert result_name("server_bench", False, partial=True) == "server_bench_partial"
    assert result_name("server_bench", True, partial=True) == "server_bench_quick_partial"


def test_partial_results_are_ignored_by_git() -> None:
    from pathlib import Path

    ignored = (Path(__file__).resolve().parents[2] / ".gitignore").read_text().splitlines()
    assert "benchmarks/results/*_partial.*" in ignored


def test_server_bench_whole_run_only_with_every_system_phase_and_the_mode_sizes() -> None:
    every = (server_bench.SYSTEMS, server_bench.PHASES)
    assert not server_bench.is_partial(False, *every, server_bench.FULL)
    assert not server_bench.is_partial(True, *every, replace(server_bench.QUICK))  # equal values: the same sizes
    assert server_bench.is_partial(False, *every, server_bench.QUICK)  # quick sizes under the full name
    assert server_bench.is_partial(False, ["fanout"], server_bench.PHASES, server_bench.FULL)
    assert server_bench.is_partial(False, server_bench.SYSTEMS, ["connection_storm"], server_bench.FULL)
    assert server_bench.is_partial(False, *every, replace(server_bench.FULL, vehicles=500))
    # more fanout repeats (the median of more runs) is the whole benchmark; fewer than the mode's is not
    assert not server_bench.is_partial(False, *every, replace(server_bench.FULL, fanout_repeats=3))
    assert server_bench.is_partial(False, *every, replace(server_bench.FULL, fanout_repeats=3, vehicles=500))
    assert server_bench.is_partial(False, *every, replace(server_bench.FULL, fanout_repeats=0))
    server_bench.PROFILE["dir"] = "/tmp/profile"
    try:
        assert server_bench.is_partial(False, *every, server_bench.FULL)
    finally:
        server_bench.PROFILE["dir"] = None
