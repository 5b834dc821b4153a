"""``run_fleet``: run a mock fleet in this process or split over processes; live display; JSON summary.

Strategy:

- One process (``processes=1``): the :class:`~scripts.fleet.worker.Worker` runs on a (uv)loop in the
  calling thread and reports straight to the :class:`Monitor`.
- Several: the VIN list is cut into contiguous chunks, one ``spawn``-ed process each (a fresh
  interpreter: no loop, thread or lock state inherited). Each process ignores SIGINT, sends a counters
  snapshot every 0.25 s and, at the end, its final snapshot with the ledger export over one
  ``multiprocessing.Queue``; the parent merges them, decides when to stop and sets one shared
  ``Event``. A worker also stops when the parent dies. Every wait is bounded: a worker that neither
  reports nor exits is terminated.
- The :class:`Monitor` owns the stop conditions (``duration``; ``expect`` unique deliveries, then
  ``linger`` seconds for late duplicates, or ``timeout``; SIGINT; an external ``threading.Event``; a
  worker error), the ~1 Hz display on stderr (rich ``Live`` on a terminal, a plain line every 5 s
  otherwise) and the summary.
"""
from __future__ import annotations

import asyncio
import dataclasses
import multiprocessing
import queue
import signal
import threading
import time
import traceback
from typing import Any, Callable, Coroutine

from .accounting import order_by_string, order_from_list, summarize
from .vins import make_vins
from .options import FD_MARGIN, FleetError, FleetOptions, raise_nofile
from .worker import Worker

SUMMED = ("connected", "subscribed", "connects", "first_connects", "reconnects", "connect_errors", "crashes",
          "losses", "subscribe_errors", "protocol_errors", "unexpected", "heartbeats", "pubacks", "overlaps",
          "received", "unique", "dup_flag", "dup_noflag", "order_violations", "untracked", "vehicles", "rss",
          "rss_base", "cpu_s")
REPORT_S = 0.25
SHUTDOWN_S = 60.0  # most a stopping worker may take to send its final snapshot


def run_loop(coro: Coroutine[Any, Any, Any]) -> Any:
    """Run ``coro`` on a fresh uvloop event loop (asyncio's when uvloop is not installed)."""
    try:
        import uvloop

        factory: Callable[[], asyncio.AbstractEventLoop] | None = uvloop.new_event_loop
    except ImportError:  # pragma: no cover
        factory = None
    with asyncio.Runner(loop_factory=factory) as runner:
        return runner.run(coro)


class Monitor:
    """Merges worker snapshots, shows progress, decides when to stop, builds the summary.

    Args:
        opts: the fleet options.
        vehicles: fleet size.
        progress: called with the merged counters (plus ``elapsed``) after every report.
        stop: an external stop request.
    """

    __slots__ = ("opts", "vehicles", "progress", "stop", "start", "latest", "reason", "expect_at", "errors",
                 "_live", "_console", "_next_render", "_last_rate", "_interrupted")

    def __init__(self, opts: FleetOptions, vehicles: int, progress: Callable[[dict[str, Any]], None] | None = None,
                 stop: threading.Event | None = None) -> None:
        self.opts = opts
        self.vehicles = vehicles
        self.progress = progress
        self.stop = stop
        self.start = time.monotonic()
        self.latest: dict[int, dict[str, Any]] = {}
        self.reason: str | None = None
        self.expect_at: float | None = None
        self.errors: list[str] = []
        self._interrupted = False
        self._live: Any = None
        self._console: Any = None
        self._next_render = 0.0
        self._last_rate = (self.start, 0)
        mode = opts.display
        if mode != "off":
            from rich.console import Console

            self._console = Console(stderr=True)
            if mode == "auto":
                mode = "live" if self._console.is_terminal else "lines"
            if mode == "live":
                from rich.live import Live

                self._live = Live(console=self._console, auto_refresh=False, transient=False)
                self._live.start()

    def update(self, wid: int, snap: dict[str, Any]) -> None:
        """Take a worker's snapshot (the latest replaces the previous one)."""
        self.latest[wid] = snap
        if self.progress is not None:
            merged = self.merged()
            merged["elapsed"] = time.monotonic() - self.start
            self.progress(merged)

    def worker_error(self, wid: int, message: str) -> None:
        """A worker failed: stop everything, keep the message for the summary."""
        self.errors.append(f"process {wid}: {message.strip()}")
        if self.reason is None:
            self.reason = "error"

    def interrupt(self) -> None:
        """SIGINT: stop (a second one raises KeyboardInterrupt)."""
        if self._interrupted:
            raise KeyboardInterrupt
        self._interrupted = True

    def merged(self) -> dict[str, Any]:
        """Sum of the latest snapshots of every worker."""
        out: dict[str, Any] = dict.fromkeys(SUMMED, 0)
        for snap in self.latest.values():
            for key in SUMMED:
                out[key] += snap.get(key, 0)
        return out

    def check(self) -> bool:
        """Evaluate the stop conditions and refresh the display; True once the fleet must stop."""
        now = time.monotonic()
        elapsed = now - self.start
        o = self.opts
        if self.reason is None:
            m = self.merged()
            if self._interrupted:
                self.reason = "signal"
            elif self.stop is not None and self.stop.is_set():
                self.reason = "external"
            elif o.duration is not None and elapsed >= o.duration:
                self.reason = "duration"
            elif o.expect is not None:
                if self.expect_at is None and m["unique"] >= o.expect:
                    self.expect_at = now
                if self.expect_at is not None and now - self.expect_at >= o.linger:
                    self.reason = "expect"
                elif self.expect_at is None and elapsed >= o.timeout:
                    self.reason = "timeout"
        if now >= self._next_render or (self.reason is not None and self._next_render != float("inf")):
            self._render(now)
            if self.reason is not None:
                self._next_render = float("inf")  # one last line at the stop
        return self.reason is not None

    def _render(self, now: float) -> None:
        if self._console is None:
            return
        interval = 1.0 if self._live is not None else 5.0
        self._next_render = now + interval
        m = self.merged()
        t0, r0 = self._last_rate
        rate = (m["received"] - r0) / max(1e-9, now - t0)
        self._last_rate = (now, m["received"])
        line = (f"t={now - self.start:5.0f}s connected {m['connected']:,}/{self.vehicles:,} subscribed "
                f"{m['subscribed']:,} received {m['received']:,} ({rate:,.0f}/s) unique {m['unique']:,} dup "
                f"{m['dup_flag'] + m['dup_noflag']:,} (DUP=1 {m['dup_flag']:,}) crashes {m['crashes']:,} "
                f"reconnects {m['reconnects']:,} connect errors {m['connect_errors']:,}")
        if self._live is not None:
            from rich.text import Text

            self._live.update(Text(line), refresh=True)
        else:
            self._console.print(line, markup=False, highlight=False, soft_wrap=True)

    def close(self) -> None:
        """Stop the live display."""
        if self._live is not None:
            self._live.stop()
            self._live = None

    def summary(self, finals: list[dict[str, Any] | None]) -> dict[str, Any]:
        """The JSON summary from the workers' final snapshots (None for a worker that failed)."""
        o = self.opts
        done = [f for f in finals if f is not None]
        m: dict[str, Any] = dict.fromkeys(SUMMED, 0)
        errors: dict[str, int] = {}
        for f in done:
            for key in SUMMED:
                m[key] += f.get(key, 0)
            for kind, n in f.get("errors", {}).items():
                errors[kind] = errors.get(kind, 0) + n
        order = None
        if o.expect_order:
            order = order_from_list(o.order_ids) if o.order_ids is not None else order_by_string
        deliveries = summarize([f["ledger"] for f in done], max_listed=o.summary_requests, order=order)
        starts = [f["start_us"] for f in done]
        lasts = [f["last_first_connect_us"] for f in done if f["last_first_connect_us"] is not None]
        connect_s = (max(lasts) - min(starts)) / 1e6 if lasts and starts else None
        connected = m["connected"]
        complete = not self.errors and (o.expect is None or deliveries["unique"] >= o.expect)
        return {
            "vehicles": self.vehicles, "processes": o.processes, "broker": f"{o.host}:{','.join(map(str, o.ports()))}",
            "seconds": round(time.monotonic() - self.start, 3), "stop_reason": self.reason, "complete": complete,
            "expect": o.expect,
            "connected": connected, "subscribed": m["subscribed"], "connects": m["connects"],
            "connect_errors": m["connect_errors"], "errors": errors,
            "reconnects": m["reconnects"], "crashes": m["crashes"], "connection_losses": m["losses"],
            "subscribe_errors": m["subscribe_errors"], "protocol_errors": m["protocol_errors"],
            "unexpected_topics": m["unexpected"], "heartbeats": m["heartbeats"], "pubacks": m["pubacks"],
            "inflight_overlaps": m["overlaps"],
            **deliveries,
            "connect": {"first_connects": m["first_connects"], "seconds": None if connect_s is None else round(connect_s, 3),
                        "rate_per_s": round(m["first_connects"] / connect_s, 1) if connect_s else None},
            "rss": {"total_bytes": m["rss"], "per_vehicle_bytes": round(m["rss"] / max(1, self.vehicles)),
                    "per_connection_bytes": round((m["rss"] - m["rss_base"]) / connected) if connected else None,
                    "per_process": [{"pid": f["pid"], "vehicles": f["vehicles"], "rss_bytes": f["rss"],
                                     "cpu_s": round(f["cpu_s"], 2)} for f in done]},
            "cpu_s": round(m["cpu_s"], 2),
            "source_addresses": max((f.get("sources", 0) for f in done), default=0),
            "worker_errors": self.errors,
        }


def fleet_vins(opts: FleetOptions) -> list[str]:
    """``opts.vins`` or the generated list."""
    if opts.vins is not None:
        return list(opts.vins)
    return make_vins(opts.vin_prefix, opts.count, start=opts.vin_start, digits=opts.vin_digits)


def run_fleet(opts: FleetOptions, *, progress: Callable[[dict[str, Any]], None] | None = None,
              stop: threading.Event | None = None, log_level: str = "warning") -> dict[str, Any]:
    """Run a mock fleet until a stop condition and return its summary.

    Args:
        opts: the options (see :class:`FleetOptions`).
        progress: called with merged counters (``connected``, ``subscribed``, ``unique``, ...,
            ``elapsed``) about every 0.25 s, in the calling thread.
        stop: setting it stops the fleet (reason ``external``).
        log_level: structlog level in spawned worker processes.

    Returns:
        The summary (see :mod:`scripts.mock_vehicles`).

    Raises:
        FleetError: bad options, or ``RLIMIT_NOFILE`` too low for a process's share of the fleet.
    """
    opts.validate()
    vins = fleet_vins(opts)
    if not vins:
        raise FleetError("no vehicles (count 0 or an empty VIN file)")
    processes = min(opts.processes, len(vins))
    raise_nofile(-(-len(vins) // processes) + FD_MARGIN)  # fail before spawning anything
    opts = dataclasses.replace(opts, vins=None, processes=processes)
    monitor = Monitor(opts, len(vins), progress, stop)
    previous = None
    if threading.current_thread() is threading.main_thread():
        previous = signal.signal(signal.SIGINT, lambda *_: monitor.interrupt())
    try:
        if processes == 1:
            worker = Worker(opts, vins, 0, len(vins), 0)
            finals: list[dict[str, Any] | None] = [
                run_loop(worker.run(lambda s: monitor.update(0, s), monitor.check, REPORT_S))]
        else:
            finals = _run_processes(opts, vins, monitor, log_level)
        monitor.check()
        return monitor.summary(finals)
    finally:
        monitor.close()
        if previous is not None:
            signal.signal(signal.SIGINT, previous)


def _run_processes(opts: FleetOptions, vins: list[str], monitor: Monitor, log_level: str) -> list[dict[str, Any] | None]:
    ctx = multiprocessing.get_context("spawn")
    q: Any = ctx.Queue()
    stop_event = ctx.Event()
    n = opts.processes
    opts = dataclasses.replace(opts, connect_rate=opts.connect_rate / n)  # the rate is fleet-wide
    bounds = [len(vins) * i // n for i in range(n + 1)]
    procs = []
    for wid in range(n):
        chunk = vins[bounds[wid]:bounds[wid + 1]]
        p = ctx.Process(target=_worker_main, name=f"fleet-{wid}", daemon=True,
                        args=(opts, chunk, bounds[wid], len(vins), wid, q, stop_event, log_level))
        p.start()
        procs.append(p)
    finals: list[dict[str, Any] | None] = [None] * n
    done: set[int] = set()
    dead_since: dict[int, float] = {}
    stop_deadline: float | None = None
    try:
        while len(done) < n:
            try:
                kind, wid, data = q.get(timeout=0.05)
            except queue.Empty:
                kind = None
            if kind == "stats":
                monitor.update(wid, data)
            elif kind == "final":
                monitor.update(wid, data)
                finals[wid] = data
                done.add(wid)
            elif kind == "error":
                monitor.worker_error(wid, data)
                done.add(wid)
            now = time.monotonic()
            for wid, p in enumerate(procs):
                if wid not in done and not p.is_alive():
                    if now - dead_since.setdefault(wid, now) > 2.0:  # its last messages had time to arrive
                        monitor.worker_error(wid, f"exited with code {p.exitcode} without a summary")
                        done.add(wid)
            if monitor.check() and not stop_event.is_set():
                stop_event.set()
                stop_deadline = now + SHUTDOWN_S
            if stop_deadline is not None and now > stop_deadline:
                for wid in set(range(n)) - done:
                    monitor.worker_error(wid, f"no final summary within {SHUTDOWN_S:.0f} s of the stop")
                break
    finally:
        stop_event.set()
        for p in procs:
            p.join(5)
            if p.is_alive():
                p.terminate()
                p.join(5)
            if p.is_alive():
                p.kill()
                p.join(5)
        q.close()
        q.cancel_join_thread()
    return finals


def _worker_main(opts: FleetOptions, vins: list[str], offset: int, total: int, wid: int, q: Any,
                 stop_event: Any, log_level: str) -> None:
    """Entry point of a spawned fleet process."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the parent handles Ctrl-C and sets stop_event
    from fanout.log import configure

    configure(level=log_level)
    parent = multiprocessing.parent_process()

    def should_stop() -> bool:
        return stop_event.is_set() or (parent is not None and not parent.is_alive())

    def report(snap: dict[str, Any]) -> None:
        try:
            q.put_nowait(("stats", wid, snap))
        except queue.Full:  # pragma: no cover - the queue is unbounded; a stalled parent only delays
            pass

    try:
        worker = Worker(opts, vins, offset, total, wid)
        final = run_loop(worker.run(report, should_stop, REPORT_S))
        q.put(("final", wid, final))
    except FleetError as exc:
        q.put(("error", wid, str(exc)))
    except BaseException:
        q.put(("error", wid, traceback.format_exc()))
    finally:
        q.close()
        q.join_thread()


__all__ = ["run_fleet", "Monitor", "FleetOptions", "FleetError", "fleet_vins", "run_loop"]
