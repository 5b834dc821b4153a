"""Result files: one JSON object per benchmark run, with the machine, its load and the code it ran.

Strategy:

- :func:`write_result` writes ``<results>/<name>.json`` (``out_dir``, else ``$FANOUT_BENCH_RESULTS``, else
  ``benchmarks/results``) through a temporary file and a rename, with :func:`machine_info` and
  :func:`~.versions.versions` added when missing, so a figure never travels without the machine and the
  code that produced it.
- :func:`run_header` is the head every result starts with (name, mode, start time, machine, versions);
  :func:`save_result` writes the JSON first (the figures survive a plot that fails), then the PNG, and
  says where on the benchmark's progress output (:func:`log`, stdout: it is the benchmark's own output,
  not library logging). :func:`bench_parser` is every benchmark's command line (``--quick``, ``--out-dir``).
- :func:`result_name`: a quick run is ``<name>_quick`` (git-ignored), so a smoke run never overwrites the
  committed result of a full run.
- The machine is shared: :func:`load_avg` is recorded at the start and end of a run.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import time
from pathlib import Path
from typing import Any, Callable

from .versions import versions

RESULTS_DIR = Path(__file__).resolve().parents[1] / "results"

# A benchmark's plot: (result, name, out_dir) -> the PNG written.
Plot = Callable[[dict[str, Any], str, "str | Path | None"], Path]


def log(name: str, msg: str) -> None:
    """Progress line of benchmark ``name`` on stdout."""
    print(f"[{name}] {msg}", flush=True)


def log_ratios(name: str, ratios: dict[str, float | None]) -> None:
    """One progress line per ratio of a result (``n/a`` where a system did not run)."""
    for key, value in ratios.items():
        log(name, f"{key} = {value:.3f}" if value is not None else f"{key} = n/a")


def bench_parser(module: str, doc: str | None, quick_help: str = "small numbers (CI smoke)") -> argparse.ArgumentParser:
    """The command line of ``python -m benchmarks.<module>``: ``--quick`` and ``--out-dir``; add the rest."""
    parser = argparse.ArgumentParser(prog=f"python -m benchmarks.{module}", description=(doc or "").split("\n")[0])
    parser.add_argument("--quick", action="store_true", help=quick_help)
    parser.add_argument("--out-dir", default=None, help="results folder (default benchmarks/results)")
    return parser


def result_name(name: str, quick: bool, *, partial: bool = False) -> str:
    """``<name>_quick`` for a quick run, else ``name``; then ``_partial`` for a run narrower than the whole benchmark.

    Why ``_partial``: a run of some systems or phases only, at other sizes or under a profiler is an A/B or a
    diagnosis, and its figures are not comparable with a whole run's. Written under the whole run's name, it
    replaced the results the docs quote (it happened: a ``server_bench --phases connection_storm`` run took the
    place of a full run's JSON).
    """
    return ("{}_quick" if quick else "{}").format(name) + ("_partial" if partial else "")


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def _os_name() -> str:
    try:
        for line in Path("/etc/os-release").read_text().splitlines():
            if line.startswith("PRETTY_NAME="):
                return line.split("=", 1)[1].strip('"')
    except OSError:
        pass
    return platform.system()


def machine_info() -> dict[str, Any]:
    """CPU model, cores, memory, kernel, OS, Python and the open-file limits of this process."""
    import psutil

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    return {
        "cpu_model": _cpu_model(),
        "logical_cpus": os.cpu_count(),
        "physical_cores": psutil.cpu_count(logical=False),
        "memory_bytes": psutil.virtual_memory().total,
        "kernel": platform.release(),
        "os": _os_name(),
        "python": platform.python_version(),
        "python_implementation": platform.python_implementation(),
        "nofile_soft": soft,
        "nofile_hard": hard,
        "hostname": platform.node(),
    }


def load_avg() -> list[float]:
    """The machine's load average over 1, 5 and 15 minutes, rounded to 2 decimals."""
    return [round(x, 2) for x in os.getloadavg()]


def run_header(name: str, quick: bool, started: float) -> dict[str, Any]:
    """The head of a result: ``name``, ``mode``, ``started_at`` (UTC, from ``started``, a ``time.time()``),
    ``machine`` and ``versions``."""
    return {"name": name, "mode": "quick" if quick else "full",
            "started_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(started)),
            "machine": machine_info(), "versions": versions()}


def results_dir(out_dir: str | Path | None = None) -> Path:
    """The folder results go to: ``out_dir``, else ``$FANOUT_BENCH_RESULTS``, else benchmarks/results."""
    path = Path(out_dir or os.environ.get("FANOUT_BENCH_RESULTS") or RESULTS_DIR)
    path.mkdir(parents=True, exist_ok=True)
    return path


def write_result(name: str, data: dict[str, Any], out_dir: str | Path | None = None) -> Path:
    """Write ``data`` as ``<results>/<name>.json`` (indented, keys in insertion order).

    ``machine`` and ``versions`` are added when missing. Returns the path written.
    """
    data.setdefault("machine", machine_info())
    data.setdefault("versions", versions())
    path = results_dir(out_dir) / f"{name}.json"
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(data, indent=2, default=str) + "\n")
    tmp.replace(path)
    return path


def save_result(name: str, result: dict[str, Any], plot: Plot, out_dir: str | Path | None = None, *,
                started: float | None = None) -> None:
    """Write ``result`` as JSON, then its plot, and log both paths (and ``duration_s`` when set).

    ``started`` (a ``time.time()``) sets ``duration_s`` first. ``json_path`` and ``png_path`` are set on
    ``result`` after writing (they are not in the file).
    """
    if started is not None:
        result["duration_s"] = round(time.time() - started, 1)
    result["json_path"] = str(write_result(name, result, out_dir))
    result["png_path"] = str(plot(result, name, out_dir))
    took = f" in {result['duration_s']} s" if "duration_s" in result else ""
    log(name, f"wrote {result['json_path']} and {result['png_path']}{took}")
