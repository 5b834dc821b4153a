"""The mock fleet as a benchmark load: ``scripts.fleet.run_fleet`` in spawned processes, driven from a thread.

Strategy:

- :class:`FleetRun` calls :func:`scripts.fleet.run_fleet` in a background thread with ``processes >= 2``
  so the vehicles live in spawned processes of their own (never in the benchmark's interpreter, whose
  event loop sends the platform's traffic), and stops it through the fleet's external stop event. The
  fleet's progress callback (every ~0.25 s per process) is recorded as a time series of
  :class:`Sample` (wall clock + connected / subscribed / unique / received / heartbeats), from which the
  benchmark reads connect progress, heartbeats sent in a window and steady-state delivery rates.
- Waits are ``async`` (polling every 50 ms) so the platform's asyncio traffic keeps flowing meanwhile,
  and bounded twice: a cap on the whole wait and a stall limit (no change of the watched counter).
- Figures from the final summary: the fleet's ledger stamps arrivals with the wall clock and knows the
  send time each payload carries (``scripts/fleet/payload.py``), so for request ``r`` sent at ``s_r``,
  its first delivery is ``s_r + first_ms`` and its last ``s_r + latency_ms.max`` (exact: every arrival is
  kept while a request has fewer than ``max_samples`` of them).
"""
from __future__ import annotations

import asyncio
import dataclasses
import itertools
import math
import threading
import time
from dataclasses import dataclass
from typing import Any

from scripts.fleet.options import FleetOptions
from scripts.fleet.payload import HEADER_SIZE, now_us, stamp
from scripts.fleet.runner import run_fleet
from scripts.fleet.vins import make_vins

POLL_S = 0.05


@dataclass(frozen=True, slots=True)
class Sample:
    """The fleet's merged counters at wall-clock time ``t`` (seconds since the epoch)."""

    t: float
    connected: int
    subscribed: int
    unique: int
    received: int
    heartbeats: int
    connect_errors: int


_source_blocks = itertools.count()


def _next_source_block() -> str:
    """First source address of the next fleet: ``127.<10 + k>.0.1`` for the k-th fleet of this process."""
    return f"127.{10 + next(_source_blocks) % 240}.0.1"


def fleet_options(host: str, port: int, vins: list[str], **overrides: Any) -> FleetOptions:
    """Benchmark defaults: no display, 2 processes, unlimited connect rate, no heartbeats, clean sessions.

    Source addresses: 4,000 vehicles per address, from a block of 127/8 of its own per fleet run, so a
    phase's connections never compete for ports with the previous phase's TIME_WAIT sockets.
    ``overrides`` are :class:`FleetOptions` fields.
    """
    base = FleetOptions(host=host, port=port, vins=vins, processes=2, connect_rate=0.0, connect_concurrency=512,
                        connect_timeout=60.0, heartbeat_interval=0.0, keepalive=600, display="off", per_address=4_000,
                        source_addresses=_next_source_block(),
                        max_requests=100_000, max_samples=200_000, summary_requests=100_000, timeout=3600.0,
                        reconnect_delay=1.0, reconnect_max=10.0)
    return dataclasses.replace(base, **overrides)


class FleetRun:
    """A mock fleet running in the background until :meth:`finish`.

    Args:
        opts: fleet options (``display`` should be ``off``; ``expect``/``duration`` unset: the benchmark stops it).
        label: for error messages.
    """

    def __init__(self, opts: FleetOptions, label: str = "fleet") -> None:
        self.opts = opts
        self.label = label
        self.vehicles = len(opts.vins) if opts.vins is not None else opts.count
        self.samples: list[Sample] = []
        self.latest: dict[str, Any] = {}
        self.summary: dict[str, Any] | None = None
        self.error: BaseException | None = None
        self.started_at = 0.0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._main, name=f"bench-{label}", daemon=True)

    def start(self) -> "FleetRun":
        self.started_at = time.time()
        self._thread.start()
        return self

    def _main(self) -> None:
        try:
            self.summary = run_fleet(self.opts, progress=self._progress, stop=self._stop)
        except BaseException as exc:  # reported by the waits and by finish()
            self.error = exc

    def _progress(self, m: dict[str, Any]) -> None:
        self.latest = m
        self.samples.append(Sample(time.time(), m["connected"], m["subscribed"], m["unique"], m["received"],
                                   m["heartbeats"], m["connect_errors"]))

    def value(self, key: str) -> int:
        """The latest merged counter ``key`` (0 before the first report)."""
        return int(self.latest.get(key, 0))

    async def until(self, key: str, target: int, *, max_s: float, stall_s: float = 30.0) -> str:
        """Wait until counter ``key`` reaches ``target``.

        Returns:
            ``done``, ``capped`` (``max_s`` passed) or ``stalled`` (``key`` unchanged for ``stall_s``).

        Raises:
            RuntimeError: the fleet failed or stopped by itself.
        """
        start = last_change = time.monotonic()
        last = self.value(key)
        while True:
            if self.value(key) >= target:
                return "done"
            if self.error is not None:
                raise RuntimeError(f"{self.label}: fleet failed: {self.error!r}") from self.error
            if not self._thread.is_alive():
                raise RuntimeError(f"{self.label}: fleet stopped: {(self.summary or {}).get('worker_errors')}")
            now = time.monotonic()
            current = self.value(key)
            if current != last:
                last, last_change = current, now
            elif now - last_change > stall_s:
                return "stalled"
            if now - start >= max_s:
                return "capped"
            await asyncio.sleep(POLL_S)

    async def sleep_observed(self, seconds: float) -> None:
        """Sleep ``seconds`` while checking that the fleet is still running."""
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            if self.error is not None:
                raise RuntimeError(f"{self.label}: fleet failed: {self.error!r}") from self.error
            await asyncio.sleep(min(POLL_S * 4, max(0.0, end - time.monotonic())))

    def finish(self, timeout_s: float = 120.0) -> dict[str, Any]:
        """Stop the fleet (DISCONNECT every vehicle) and return its summary.

        Raises:
            RuntimeError: the fleet failed, or did not stop within ``timeout_s``.
        """
        self._stop.set()
        self._thread.join(timeout_s)
        if self._thread.is_alive():
            raise RuntimeError(f"{self.label}: fleet did not stop within {timeout_s:.0f} s")
        if self.error is not None:
            raise RuntimeError(f"{self.label}: fleet failed: {self.error!r}") from self.error
        assert self.summary is not None
        return self.summary

    def stop_quietly(self) -> None:
        """Stop without raising (cleanup on an error path)."""
        self._stop.set()
        self._thread.join(60)


def vins_for(prefix: str, count: int) -> list[str]:
    """``count`` VINs ``<prefix>000000001`` ... (the fleet's generator; the prefix keeps phases apart)."""
    return make_vins(prefix, count)


# ---------------------------------------------------------------------------------------------------
# figures from samples and summaries


def steady_rate(samples: list[Sample], key: str = "unique", lo: float = 0.1, hi: float = 0.9,
                total: int | None = None) -> float | None:
    """Rate of counter ``key`` between the moments it crossed ``lo`` and ``hi`` of ``total`` (per second).

    Excludes the ramp (vehicles still connecting) and the tail (the last vehicles' queues), so two runs
    of different length compare. Linear interpolation between samples; None with too few samples.
    """
    if not samples:
        return None
    final = total if total is not None else getattr(samples[-1], key)
    if final <= 0:
        return None

    def crossing(level: float) -> float | None:
        prev: Sample | None = None
        for s in samples:
            v = getattr(s, key)
            if v >= level:
                if prev is None:
                    return s.t
                pv = getattr(prev, key)
                return prev.t + (s.t - prev.t) * ((level - pv) / (v - pv) if v != pv else 1.0)
            prev = s
        return None

    a, b = crossing(lo * final), crossing(hi * final)
    if a is None or b is None or b <= a:
        return None
    return (hi - lo) * final / (b - a)


def request_times(summary: dict[str, Any], sent_us: dict[str, int]) -> dict[str, dict[str, float]]:
    """Per request id (of ``sent_us``): ``first_ms`` and ``last_ms`` after its send time, ``count``."""
    out: dict[str, dict[str, float]] = {}
    for rid, sent in sent_us.items():
        r = summary.get("requests", {}).get(rid)
        if r is None or not r.get("count"):
            continue
        out[rid] = {"first_ms": float(r["first_ms"]), "last_ms": float(r["latency_ms"]["max"]),
                    "count": int(r["count"]), "p50_ms": float(r["latency_ms"]["p50"])}
    return out


def delivery_window(summary: dict[str, Any], sent_us: dict[str, int]) -> tuple[float, float, float] | None:
    """``(first send, first arrival, last arrival)`` over the requests of ``sent_us``, in epoch seconds."""
    times = request_times(summary, sent_us)
    if not times:
        return None
    first_send = min(sent_us.values()) / 1e6
    first_arrival = min(sent_us[r] / 1e6 + t["first_ms"] / 1e3 for r, t in times.items())
    last_arrival = max(sent_us[r] / 1e6 + t["last_ms"] / 1e3 for r, t in times.items())
    return first_send, first_arrival, last_arrival


def nearest_rank(values: list[float], q: float) -> float | None:
    """Nearest-rank percentile (as the fleet's ledger computes them)."""
    if not values:
        return None
    s = sorted(values)
    return s[min(len(s), max(1, math.ceil(q * len(s)))) - 1]


__all__ = ["HEADER_SIZE", "now_us", "stamp", "FleetRun", "Sample", "fleet_options", "vins_for", "steady_rate", "request_times", "delivery_window",
           "nearest_rank"]
