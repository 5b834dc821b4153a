"""Running phases one by one and turning their figures into a result: attempts, machine load, ratios, targets.

- :func:`attempt` runs one phase (a coroutine factory) on a fresh event loop after waiting (bounded) for
  the machine to be quiet, records the machine-wide CPU use during the phase next to its figures, and
  turns an exception into an entry of ``errors`` so the next phase still runs.
- :func:`ratio`, :func:`at_least`, :func:`at_most`: None-tolerant helpers for ``ratios`` and
  ``targets_met`` (a missing figure gives None, never a fake pass or fail).
"""
from __future__ import annotations

import os
import time
import traceback
from typing import Any, Awaitable, Callable

import psutil

from ..loadgen import run_async
from .processes import wait_for_quiet
from .results import log


def _busy_s() -> tuple[float, float]:
    t = psutil.cpu_times()
    return t.user + t.nice + t.system + getattr(t, "irq", 0.0) + getattr(t, "softirq", 0.0), time.monotonic()


def _own_cpu_s() -> float:
    """CPU of this process and of its reaped children (the fleet processes, once joined)."""
    t = os.times()
    return t.user + t.system + t.children_user + t.children_system


def attempt(name: str, what: str, make: Callable[[], Awaitable[dict[str, Any]]], errors: dict[str, str], *,
            quiet_wait_s: float = 0.0, show: tuple[str, ...] = (),
            server_cpu: Callable[[], float] | None = None) -> dict[str, Any] | None:
    """Run phase ``what`` and return its figures (None when it failed; the reason goes to ``errors``).

    Adds ``machine_busy_pct_before`` (when waiting for quiet), ``machine_busy_pct_during`` (all CPUs of
    the machine, every process) and, with ``server_cpu`` (the server's CPU seconds so far),
    ``other_load_pct``: the part of ``machine_busy_pct_during`` that was neither the server, nor this
    benchmark process, nor its fleet processes (a neighbour's load: figures with a high value are noisy).
    """
    busy_before = wait_for_quiet(quiet_wait_s) if quiet_wait_s > 0 else None
    own0, srv0 = _own_cpu_s(), server_cpu() if server_cpu is not None else 0.0
    b0, t0 = _busy_s()
    try:
        figures = run_async(make())
    except Exception as exc:  # one failed phase must not stop the others
        errors[what] = f"{type(exc).__name__}: {exc}"
        log(name, f"{what}: FAILED {errors[what]}")
        traceback.print_exc()
        return None
    b1, t1 = _busy_s()
    cpus = psutil.cpu_count() or 1
    capacity = (t1 - t0) * cpus
    figures["machine_busy_pct_during"] = round(100.0 * (b1 - b0) / capacity, 1) if capacity > 0 else None
    if server_cpu is not None and capacity > 0:
        ours = _own_cpu_s() - own0 + server_cpu() - srv0
        figures["other_load_pct"] = round(max(0.0, 100.0 * ((b1 - b0) - ours) / capacity), 1)
    if busy_before is not None:
        figures["machine_busy_pct_before"] = round(busy_before, 1)
    shown = ", ".join(f"{k}={figures[k]:,.2f}" if isinstance(figures.get(k), float) else f"{k}={figures.get(k)}"
                      for k in show if k in figures)
    log(name, f"{what} ({t1 - t0:.1f} s): {shown}")
    return figures


def median_run(runs: list[dict[str, Any] | None], key: str) -> dict[str, Any] | None:
    """The run with the median ``key`` (lower middle; a run without it counts as the lowest), with every
    run's value listed under ``<key>_runs``; None when every run failed."""
    done = sorted((r for r in runs if r is not None), key=lambda r: (r.get(key) is not None, r.get(key) or 0))
    if not done:
        return None
    return {**done[(len(done) - 1) // 2], f"{key}_runs": [r.get(key) if r else None for r in runs]}


def busy_us_per(cpu_s: float, idle_cpu_per_s: float | None, seconds: float, count: int,
                what: str) -> tuple[float | None, str | None]:
    """Server CPU µs per event over a window, the idle share (``idle_cpu_per_s`` x ``seconds``) subtracted:
    ``(figure, None)``, or ``(None, why)`` when the window's CPU is not above the idle share (too few events to
    measure against the server's background: never a negative figure)."""
    idle_share = (idle_cpu_per_s or 0.0) * seconds
    busy = cpu_s - idle_share
    if busy <= 0:
        return None, (f"the server's CPU ({cpu_s:.3f} s) is not above the idle share ({idle_share:.3f} s): "
                      f"{count} {what} are too few to measure against this server's background")
    return (round(busy / count * 1e6, 2) if count > 0 else None), None


def ratio(a: Any, b: Any, digits: int | None = 3) -> float | None:
    """a / b rounded to ``digits`` decimals (None: not rounded), or None when either is missing or b is 0."""
    if isinstance(a, (int, float)) and isinstance(b, (int, float)) and not isinstance(a, bool) and b:
        return a / b if digits is None else round(a / b, digits)
    return None


def at_least(v: Any, lo: float) -> bool | None:
    return None if not isinstance(v, (int, float)) or isinstance(v, bool) else v >= lo


def at_most(v: Any, hi: float) -> bool | None:
    return None if not isinstance(v, (int, float)) or isinstance(v, bool) else v <= hi


def get(d: dict[str, Any] | None, key: str) -> Any:
    """``d[key]`` or None when the phase (``d``) is missing."""
    return None if d is None else d.get(key)


__all__ = ["attempt", "median_run", "ratio", "at_least", "at_most", "get"]
