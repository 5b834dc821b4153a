"""The cluster benchmarks (``fanout_bench``, ``fleet_bench``) in quick mode write every figure and ratio.

A smoke test of the benchmarks' plumbing, not a speed assertion: one embedded cluster (``fanout up``
as a subprocess) is started once and shared by both benchmarks, the mock fleet and the platform client
run against it and against Mosquitto and amqtt, and the JSON must hold every figure as a finite
positive number, every ratio, every target verdict, and the PNG must be written. Mosquitto-dependent
checks skip with a reason when it is not installed (``make mosquitto``).
"""
from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pytest

from benchmarks import fanout_bench, fleet_bench
from benchmarks.harness.cluster import EmbeddedCluster
from benchmarks.harness.peers import SYSTEMS
from benchmarks.harness.versions import mosquitto_binary

pytestmark = pytest.mark.timeout(420)

HAVE_MOSQUITTO = mosquitto_binary() is not None
NO_MOSQUITTO = "mosquitto is not installed (run `make mosquitto`: apt-get install mosquitto)"
PNG = b"\x89PNG\r\n\x1a\n"


@pytest.fixture(scope="module")
def results(tmp_path_factory: pytest.TempPathFactory) -> tuple[dict[str, dict[str, Any]], Path]:
    out = tmp_path_factory.mktemp("cluster-bench")
    systems = [s for s in SYSTEMS if s != "mosquitto" or HAVE_MOSQUITTO]
    with EmbeddedCluster() as cluster:
        runs = {"fanout_bench": fanout_bench.run(quick=True, out_dir=out, cluster=cluster),
                "fleet_bench": fleet_bench.run(quick=True, systems=systems, out_dir=out, cluster=cluster)}
    # fleet_bench_quick_partial.json where mosquitto is missing (harness.results.result_name)
    data = {name: {**json.loads(Path(r["json_path"]).read_text()), "png_path": r["png_path"]} for name, r in runs.items()}
    return data, out


def _number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) and v > 0


def test_machine_versions_params(results: tuple[dict[str, dict[str, Any]], Path]) -> None:
    for data in results[0].values():
        assert data["mode"] == "quick"
        for key in ("cpu_model", "logical_cpus", "memory_bytes", "kernel", "python", "nofile_hard"):
            assert data["machine"][key], key
        for key in ("sdv_fanout", "git_commit", "amqtt"):
            assert data["versions"][key], key
        assert data["notes"] and data["targets"]
    assert results[0]["fanout_bench"]["cluster"]["dispatchers"] >= 1


def test_fanout_bench_every_phase_and_figure(results: tuple[dict[str, dict[str, Any]], Path]) -> None:
    data = results[0]["fanout_bench"]
    assert not data["errors"], data["errors"]
    for phase in ("realtime", "sequential", "probe", "drain_small", "drain_large", "drain_fleet", "ingest_raw",
                  "ingest_client"):
        assert data["phases"].get(phase), f"phase {phase} missing"
    missing = [k for k in fanout_bench.FIGURES if not _number(data["figures"].get(k))]
    assert not missing, f"missing or non-positive figures: {missing}"
    rt = data["phases"]["realtime"]
    assert rt["complete"] and rt["deliveries"] == rt["vehicles"] * rt["requests"]
    assert rt["duplicates"] == 0 and rt["order_violations"] == 0
    assert len(rt["first_delivery_ms_per_request"]) == rt["requests"]
    assert rt["cpu_by_role_s"].keys() >= {"node", "dispatcher"}


def test_fanout_bench_ratios_targets_plot(results: tuple[dict[str, dict[str, Any]], Path]) -> None:
    data, out = results[0]["fanout_bench"], results[1]
    missing = [k for k in fanout_bench.RATIOS if not _number(data["ratios"].get(k))]
    assert not missing, f"ratios missing: {missing}"
    verdicts = data["targets_met"]
    assert len(verdicts) >= 6 and all(isinstance(v, bool) for v in verdicts.values()), verdicts
    assert Path(data["png_path"]).read_bytes()[:8] == PNG


@pytest.mark.parametrize("system", SYSTEMS)
def test_fleet_bench_every_figure_for_every_system(results: tuple[dict[str, dict[str, Any]], Path], system: str) -> None:
    if system == "mosquitto" and not HAVE_MOSQUITTO:
        pytest.skip(NO_MOSQUITTO)
    data = results[0]["fleet_bench"]
    errors = {k: v for k, v in data["errors"].items() if k.startswith(f"{system} ")}
    assert not errors, errors
    figures = data["systems"][system]
    missing = [k for k in fleet_bench.FIGURES if not _number(figures.get(k))]
    hb = data["scenarios"]["heartbeat_storm"].get(system) or {}
    assert not missing, f"{system}: missing or non-positive figures {missing} ({hb.get('heartbeat_cpu_error')})"
    assert "idle_cpu_per_s" in hb, "the heartbeat phase measures the idle rate it subtracts just before it"
    for scenario in ("fanout", "connection_storm", "heartbeat_storm"):
        assert data["scenarios"][scenario][system], f"{system}: scenario {scenario} missing"
    assert data["scenarios"]["fanout"][system]["complete"]


def test_fleet_bench_ingest_ratios_targets_plot(results: tuple[dict[str, dict[str, Any]], Path]) -> None:
    data, out = results[0]["fleet_bench"], results[1]
    ours = data["systems"]["fanout"]
    for n in data["params"]["ingest_vins"]:
        key = fleet_bench._ingest_key(n)
        for mode in ("raw", "client"):
            assert _number(ours.get(f"ingest_{key}_{mode}_ack_s")), f"ingest {key} {mode}"
            assert _number(ours.get(f"ingest_{key}_{mode}_rows_per_s")), f"ingest {key} {mode} rows/s"
    assert set(data["ratios"]) == set(fleet_bench.RATIOS)
    peers = ["amqtt"] + (["mosquitto"] if HAVE_MOSQUITTO else [])
    missing = [k for k, v in data["ratios"].items() if k.rsplit("_vs_", 1)[1] in peers and not _number(v)]
    assert not missing, f"ratios missing: {missing}"
    assert set(data["targets_met"]) == {"deliveries_per_s_ge_1.5x_mosquitto", "idle_vehicles_100k_one_node"}
    assert isinstance(data["targets_met"]["idle_vehicles_100k_one_node"], bool)
    assert Path(data["png_path"]).read_bytes()[:8] == PNG
    if not HAVE_MOSQUITTO:
        pytest.skip(f"ratios vs Mosquitto not checked: {NO_MOSQUITTO}")
