"""The broker benchmark in quick mode writes every figure for every system and the ratios.

This is a smoke test of the benchmark's plumbing (brokers start and stop, the load generator and the
paho client run, JSON and PNG are written), not a speed assertion: every figure only has to be a
positive number. Mosquitto-dependent checks skip with a reason when Mosquitto is not installed
(``make mosquitto`` installs it).
"""
from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pytest

from benchmarks import broker_bench
from benchmarks.harness.peers import SYSTEMS
from benchmarks.harness.versions import mosquitto_binary

pytestmark = pytest.mark.timeout(300)

HAVE_MOSQUITTO = mosquitto_binary() is not None
NO_MOSQUITTO = "mosquitto is not installed (run `make mosquitto`: apt-get install mosquitto)"


@pytest.fixture(scope="module")
def bench(tmp_path_factory: pytest.TempPathFactory) -> tuple[dict[str, Any], Path]:
    out = tmp_path_factory.mktemp("bench")
    systems = [s for s in SYSTEMS if s != "mosquitto" or HAVE_MOSQUITTO]
    result = broker_bench.run(quick=True, systems=systems, out_dir=out)
    path = Path(result["json_path"])  # broker_bench_quick_partial.json where mosquitto is missing
    return json.loads(path.read_text()), out


def _positive(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) and v > 0


def test_machine_versions_and_params(bench: tuple[dict[str, Any], Path]) -> None:
    data, _ = bench
    assert data["mode"] == "quick"
    for key in ("cpu_model", "logical_cpus", "memory_bytes", "kernel", "python", "nofile_hard"):
        assert data["machine"][key], key
    for key in ("sdv_fanout", "amqtt", "paho_mqtt"):
        assert data["versions"][key], key
    assert data["params"]["subscribers"] > 1 and data["params"]["idle_connections"] > 1


@pytest.mark.parametrize("system", SYSTEMS)
def test_every_figure_for_every_system(bench: tuple[dict[str, Any], Path], system: str) -> None:
    if system == "mosquitto" and not HAVE_MOSQUITTO:
        pytest.skip(NO_MOSQUITTO)
    figures = bench[0]["systems"][system]
    assert not figures.get("errors"), figures.get("errors")
    missing = [k for k in broker_bench.FIGURES if not _positive(figures.get(k))]
    assert not missing, f"{system}: missing or non-positive figures {missing}"


def test_ratios(bench: tuple[dict[str, Any], Path]) -> None:
    data, _ = bench
    assert set(data["ratios"]) == set(broker_bench.RATIOS)
    peers = ["amqtt"] + (["mosquitto"] if HAVE_MOSQUITTO else [])
    missing = [k for k, v in data["ratios"].items() if k.split("_vs_")[1] in peers and not _positive(v)]
    assert not missing, f"ratios missing: {missing}"
    assert set(data["targets_met"]) >= {"cpu_us_per_msg_1to1_le_15", "rss_per_conn_le_6KiB"}
    if not HAVE_MOSQUITTO:
        pytest.skip(f"ratios vs Mosquitto not checked: {NO_MOSQUITTO}")


def test_plot_written(bench: tuple[dict[str, Any], Path]) -> None:
    png = bench[1] / "broker_bench_quick.png"
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@pytest.mark.parametrize("system", broker_bench.V5_SYSTEMS)
def test_mqtt5_figures(bench: tuple[dict[str, Any], Path], system: str) -> None:
    """MQTT 5 rows (with and without topic aliases) for the systems that speak it, and the v5/3.1.1 ratios."""
    if system == "mosquitto" and not HAVE_MOSQUITTO:
        pytest.skip(NO_MOSQUITTO)
    figures = bench[0]["systems"][system]
    missing = [k for k in broker_bench.V5_FIGURES if not _positive(figures.get(k))]
    assert not missing, f"{system}: missing MQTT 5 figures {missing}"
    assert all(_positive(bench[0]["ratios"][f"cpu_us_per_msg_{label}_vs_v311"]) for label in broker_bench.V5_LABELS)
