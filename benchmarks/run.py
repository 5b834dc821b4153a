"""The one benchmark entry point: ``python -m benchmarks.run [--quick] [--only NAME ...]``.

Runs every scenario module listed in :data:`MODULES` that exists and exposes ``run(quick: bool) ->
dict`` (modules still being written are skipped with a note), each writing its own JSON and PNG under
``benchmarks/results/``, then prints one summary table. ``--quick`` is the CI smoke mode (small
numbers). A module that raises is reported and the next one still runs; the exit status is 1 if any
module failed. SIGTERM/SIGINT unwind normally, so every broker a module started is stopped.
"""
from __future__ import annotations

import argparse
import importlib
import math
import signal
import sys
import time
import traceback
from types import FrameType, ModuleType
from typing import Any, Sequence

from .harness.processes import raise_nofile_limit

# Registration: one module name per scenario group, run in this order.
MODULES: tuple[str, ...] = ("ack_commit_bench", "broker_bench", "call_bench", "client_bench", "gc_bench", "fanout_bench", "fleet_bench",
                             "replication_bench", "server_bench", "tls_bench", "topics_bench")


def _short(name: str) -> str:
    return name[:-6] if name.endswith("_bench") else name


def discover(names: Sequence[str] = MODULES) -> list[tuple[str, ModuleType | None, str]]:
    """Import each ``benchmarks.<name>``; returns (name, module or None, why it is skipped)."""
    found: list[tuple[str, ModuleType | None, str]] = []
    for name in names:
        full = f"{__package__ or 'benchmarks'}.{name}"
        try:
            module = importlib.import_module(full)
        except ModuleNotFoundError as exc:
            if exc.name == full:
                found.append((name, None, "not written yet"))
                continue
            raise
        if not callable(getattr(module, "run", None)):
            found.append((name, None, "has no run(quick) function"))
            continue
        found.append((name, module, ""))
    return found


def _fmt(v: Any) -> str:
    if isinstance(v, bool) or v is None:
        return "n/a" if v is None else str(v)
    if isinstance(v, int):
        return f"{v:,}"
    if isinstance(v, float):
        if not math.isfinite(v):
            return str(v)
        if abs(v) >= 100:
            return f"{v:,.0f}"
        return f"{v:,.2f}" if abs(v) >= 1 else f"{v:.3f}"
    return str(v)


def _table(rows: list[list[str]]) -> str:
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    lines = ["  ".join(c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(r, widths)))
             for r in rows]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


def summarize(name: str, module: ModuleType | None, result: dict[str, Any]) -> str:
    """Text summary of one module's result: a figures x systems table, then ratios and targets."""
    out = [f"== {name} ({result.get('mode', '?')}, {_fmt(result.get('duration_s'))} s)"]
    systems = result.get("systems")
    if isinstance(systems, dict) and systems:
        keys = list(getattr(module, "FIGURES", ())) or sorted(
            {k for f in systems.values() if isinstance(f, dict) for k, v in f.items()
             if isinstance(v, (int, float)) and not isinstance(v, bool)})
        rows = [["figure", *systems]]
        rows += [[k, *(_fmt(f.get(k)) if isinstance(f, dict) else "n/a" for f in systems.values())] for k in keys]
        out.append(_table(rows))
        for system, f in systems.items():
            if isinstance(f, dict) and f.get("errors"):
                out.append(f"{system} errors: {f['errors']}")
    else:
        scalars = {k: v for k, v in result.items() if isinstance(v, (int, float)) and not isinstance(v, bool)}
        if scalars:
            out.append(_table([["figure", "value"], *([k, _fmt(v)] for k, v in scalars.items())]))
    for key in ("ratios", "targets_met"):
        block = result.get(key)
        if isinstance(block, dict) and block:
            out.append(f"{key}: " + ", ".join(f"{k}={_fmt(v)}" for k, v in block.items()))
    for key in ("json_path", "png_path"):
        if result.get(key):
            out.append(f"{key}: {result[key]}")
    return "\n".join(out)


def _terminate(signum: int, frame: FrameType | None) -> None:
    raise SystemExit(128 + signum)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.run", description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="small numbers (CI smoke mode)")
    parser.add_argument("--only", nargs="+", metavar="NAME", default=None,
                        help=f"run only these modules ({', '.join(MODULES)}; the _bench suffix is optional)")
    args = parser.parse_args(argv)

    names = list(MODULES)
    if args.only:
        wanted = {_short(n) for n in args.only}
        unknown = wanted - {_short(n) for n in MODULES}
        if unknown:
            parser.error(f"unknown benchmark(s) {sorted(unknown)}; known: {', '.join(MODULES)}")
        names = [n for n in MODULES if _short(n) in wanted]

    signal.signal(signal.SIGTERM, _terminate)
    soft, hard = raise_nofile_limit()
    print(f"[run] RLIMIT_NOFILE soft={soft} hard={hard}; mode={'quick' if args.quick else 'full'}", flush=True)

    failed = False
    summaries: list[str] = []
    status: list[list[str]] = [["module", "status", "seconds"]]
    for name, module, why in discover(names):
        if module is None:
            status.append([name, f"skipped ({why})", "-"])
            failed |= bool(args.only)  # asked for by name but not runnable
            continue
        print(f"[run] {name} ...", flush=True)
        t0 = time.monotonic()
        try:
            result = module.run(args.quick)
        except Exception:
            traceback.print_exc()
            status.append([name, "FAILED", f"{time.monotonic() - t0:.1f}"])
            failed = True
            continue
        status.append([name, "ok", f"{time.monotonic() - t0:.1f}"])
        if isinstance(result, dict):
            summaries.append(summarize(name, module, result))
    print("\n" + "\n\n".join([*summaries, _table(status)]), flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
