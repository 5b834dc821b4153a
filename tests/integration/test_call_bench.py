"""benchmarks.call_bench in quick mode (its own Ray instance, in a subprocess): every figure for both call kinds
and both argument sizes, the ratios and the plot are written. Plumbing only, no speed assertion."""
from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest

from benchmarks import call_bench

pytestmark = pytest.mark.timeout(300)


def test_quick_run_writes_every_figure(tmp_path: Path) -> None:
    proc = subprocess.run([sys.executable, "-m", "benchmarks.call_bench", "--quick", "--out-dir", str(tmp_path)],
                          capture_output=True, text=True, timeout=240, cwd=Path(__file__).resolve().parents[2])
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    result = json.loads((tmp_path / "call_bench_quick.json").read_text())
    assert (tmp_path / "call_bench_quick.png").stat().st_size > 10_000
    for system in call_bench.SYSTEMS:
        for size in call_bench.SIZES:
            for figure in call_bench.FIGURES:
                v = result["systems"][system][f"{figure}_{size}"]
                assert isinstance(v, (int, float)) and math.isfinite(v) and v > 0, (system, size, figure, v)
    assert set(result["ratios"]) == {f"{r}_total_cpu_{s}" for s in call_bench.SIZES
                                     for r in ("ray_over_channel", "channel_tls_over_channel")}
    assert result["command"] == "python -m benchmarks.call_bench --quick"
    for hop in call_bench.HOPS:
        for figure in ("cpu_us", "wall_us"):
            v = result["thread_hop"][hop][figure]
            assert isinstance(v, (int, float)) and math.isfinite(v) and v > 0, (hop, figure, v)
