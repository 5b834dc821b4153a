# Over 500 lines: one benchmark run (both servers, four phases, the CPU accounting per role) whose phases share the fleet and the accounting; the fleet and peers live in benchmarks/harness.
"""Server benchmark (issue 16): Mosquitto and this cluster side by side, measured with one compiled fleet.

Every vehicle of every phase is ``cfleet`` (``benchmarks/cfleet``, C with epoll, ~10 us of its own CPU
per delivery here), so the servers and not the load generator set the pace. Both servers run on
127.0.0.1 for the whole run and each phase runs on one, then on the other (interleaved: a neighbour's
load on this shared machine then falls on the compared figures alike):

- ``mosquitto``: Debian's Mosquitto (``make mosquitto``) as :class:`~benchmarks.harness.peers.PeerBroker`
  starts it (in memory, 32 messages in flight per client), fed by ``cfleet publish``: one QoS 1
  PUBLISH per vehicle and request on the vehicle's delivery topic, at most 128 unacknowledged (the
  naive platform a broker without a fanout service needs).
- ``fanout``: the embedded cluster (``fanout up``: local Ray, Controller, the default shard count (one per
  ``1 + replicas`` CPUs left by the listener: 1 here), one ConnectionNode, default config: 1 replica, fsync), fed through the platform client
  (``fanout.client`` via :class:`~benchmarks.scenarios.senders.PlatformSender`): one blob + one
  trigger naming every VIN per request, acknowledged once durable.

Phases per system (VIN blocks ``WVW%014d`` of their own):

1. ``idle``: the server's CPU per second with nothing to do (Ray's own heartbeats), subtracted below.
2. ``fanout``: N vehicles connect and subscribe, then R requests go to all of them. deliveries/s =
   unique deliveries / (last delivery - first send); server CPU per delivery over the same window,
   minus idle. For this cluster the CPU is every process of the ``fanout up`` tree (psutil: node,
   dispatchers, controller, raylet, gcs, other Ray workers), also given per role.
3. ``heartbeat_storm``: N vehicles each publish ``ecp/<VIN>/heartbeat`` (QoS 0) every N / rate seconds;
   server CPU per heartbeat over a window without deliveries, then R requests delivered during the storm.
4. ``connection_storm``: up to the descriptor limit of one process, vehicles connect as fast as
   ``storm_concurrency`` handshakes in flight allow (CONNECT, SUBSCRIBE, online); connects/s from the
   fleet, server CPU per connect once the server has settled (its dispatchers handle the online events
   after the SUBACK).

Results: ``benchmarks/results/server_bench[_quick].json`` and ``.png``; the load average is recorded at
the start, around each phase and at the end; ``fleet`` says which generator measured what and its own
CPU per delivery and per connect.

Run alone: ``python -m benchmarks.server_bench [--quick] [--systems mosquitto fanout] [--phases ...]``.
"""
from __future__ import annotations

import asyncio
import contextlib
import os
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any, Sequence

from fanout import log as fanout_log
from scripts.fleet.vins import make_vins

from . import cfleet_run
from .cfleet_run import FleetProcess, FleetSpec, PublishSpec, run_publish
from .harness.cluster import BENCH_CONFIG, EmbeddedCluster, cpu_delta, filesystem_of
from .harness.peers import INFLIGHT_WINDOW, PeerBroker
from .harness.plots import grouped_bars, machine_title, pyplot, save_figure, system_series
from .harness.processes import FD_MARGIN, raise_nofile_limit, storm_size
from .harness.profiles import start_profiles
from .harness.report import at_least, at_most, attempt, busy_us_per, get, median_run, ratio
from .harness.results import bench_parser, load_avg, log, result_name, run_header, save_result
from .scenarios.senders import NAIVE_WINDOW, PlatformSender

NAME = "server_bench"
SYSTEMS: tuple[str, ...] = ("mosquitto", "fanout")
TARGETS = {"deliveries_per_s_vs_mosquitto_min": 1.0, "server_cpu_us_per_delivery_max": 25.0,
           "connects_per_s_vs_mosquitto_min": 1.0, "server_cpu_us_per_connect_max": 300.0,
           "hb_storm_deliveries_per_s_vs_mosquitto_min": 1.0, "fleet_cpu_us_per_delivery_max": 10.0}
VIN_PREFIX, VIN_DIGITS = "WVW", 14
FANOUT_START, HB_START, STORM_START = 1, 1_000_001, 2_000_001
STALL_S = 30.0
POLL_S = 0.05
PROFILE_RATE = 250  # py-spy samples per second with --profile
# --profile DIR: py-spy (raw collapsed stacks, every Python thread, not only the GIL holder) on the
# ConnectionNode, every Dispatcher and every StoreReplica of the cluster during its fanout phase and its
# connection storm, with each process's CPU seconds over the same window (docs/profile.md reads these).
PROFILE: dict[str, Any] = {"dir": None, "seconds": {"fanout": 8.0, "connection_storm": 12.0, "heartbeat_storm": 8.0}}

# Per system, flat (the run.py summary prints these rows).
FIGURES: tuple[str, ...] = (
    "deliveries_per_s", "server_cpu_us_per_delivery", "server_cpu_us_per_delivery_raw", "latency_p50_ms",
    "latency_p99_ms", "connects_per_s", "subscribes_per_s", "connect_latency_p99_ms", "server_cpu_us_per_connect",
    "heartbeats_per_s", "server_cpu_us_per_heartbeat", "hb_storm_deliveries_per_s", "fleet_cpu_us_per_delivery",
    "fleet_cpu_us_per_connect", "platform_cpu_us_per_delivery",
)


@dataclass(frozen=True)
class Sizes:
    """How much load each phase gets."""

    vehicles: int
    requests: int
    fanout_repeats: int  # the fanout phase runs this often per system; the median (deliveries/s) is reported
    hb_vehicles: int
    hb_rate: float  # heartbeats per second over the whole fleet
    hb_window_s: float
    hb_requests: int
    storm_vehicles: int  # capped by the descriptor limit of one process (storm_size)
    storm_concurrency: int  # handshakes in flight (Mosquitto's listen backlog is 100)
    storm_settle_s: float
    cap_s: float  # most the deliveries of one phase may take
    connect_cap_s: float
    idle_s: float
    quiet_wait_s: float
    payload_size: int = 256
    listeners: int = 1  # this cluster's mqtt.listeners_per_node (listener processes sharing the port)


FULL = Sizes(vehicles=10_000, requests=10, fanout_repeats=1, hb_vehicles=10_000, hb_rate=5_000.0, hb_window_s=10.0,
             hb_requests=2, storm_vehicles=1_000_000, storm_concurrency=100, storm_settle_s=3.0, cap_s=180.0,
             connect_cap_s=120.0, idle_s=3.0, quiet_wait_s=30.0)
QUICK = Sizes(vehicles=500, requests=2, fanout_repeats=1, hb_vehicles=500, hb_rate=500.0, hb_window_s=2.0,
              hb_requests=1, storm_vehicles=500, storm_concurrency=100, storm_settle_s=1.0, cap_s=30.0,
              connect_cap_s=30.0, idle_s=1.0, quiet_wait_s=0.0)


# ---------------------------------------------------------------------------------------------------
# measuring helpers


def server_cpu(target: Any) -> tuple[float, dict[str, float] | None]:
    """CPU seconds of the server so far (and per role for this cluster, whose process tree is re-read
    first so that a worker Ray started meanwhile is counted)."""
    if isinstance(target, EmbeddedCluster):
        target.refresh_pids()
        roles = target.cpu_by_role()
        return sum(roles.values()), roles
    precise = target.cpu_seconds_precise()  # Mosquitto is one thread: schedstat resolves short phases
    return (precise if precise is not None else target.cpu_seconds()), None


def _own_cpu_s() -> float:
    t = os.times()
    return t.user + t.system


def _r(v: float | None, nd: int = 2) -> float | None:
    return None if v is None else round(v, nd)


def _per(cpu_s: float, count: int) -> float | None:
    return round(cpu_s / count * 1e6, 2) if count > 0 else None


async def _wait_unique(fleet: FleetProcess, target: int, max_s: float) -> str:
    """Poll the fleet's progress lines until ``target`` unique deliveries, a stall or the cap."""
    deadline = time.monotonic() + max_s
    last, changed = -1, time.monotonic()
    while True:
        p = fleet.progress
        unique = int(p["unique"]) if p else 0
        if unique >= target:
            return "done"
        now = time.monotonic()
        if unique != last:
            last, changed = unique, now
        if now - changed > STALL_S:
            return "stalled"
        if now > deadline:
            return "capped"
        await asyncio.sleep(POLL_S)


def _fleet_figures(res: dict[str, Any]) -> dict[str, Any]:
    """What the fleet itself reports, prefixed ``fleet_``."""
    keys = ("status", "processes", "connects", "connect_errors", "losses", "deliveries", "unique", "duplicates",
            "dup_flag", "pubacks", "wrong_topic", "heartbeats", "cpu_s", "cpu_user_s", "cpu_sys_s", "cpu_us_per_delivery",
            "cpu_user_us_per_delivery", "cpu_us_per_connect", "cpu_user_us_per_connect", "events_per_wakeup")
    out = {f"fleet_{k}": res.get(k) for k in keys}
    messages = res.get("deliveries", 0) + res.get("heartbeats", 0)
    out["fleet_cpu_us_per_message"] = _per(res.get("cpu_run_s", 0.0), messages)  # deliveries + heartbeats
    return out


def _fleet_spec(target: Any, s: Sizes, vehicles: int, start: int, **kw: Any) -> FleetSpec:
    return FleetSpec(target.port, vehicles, host=target.host, prefix=VIN_PREFIX, digits=VIN_DIGITS, start=start,
                     concurrency=s.storm_concurrency, until_signal=True, progress_s=0.1,
                     time_cap_s=s.connect_cap_s + s.cap_s + 120.0, **kw)


# ---------------------------------------------------------------------------------------------------
# phases


def _profiled_pids(target: Any) -> dict[str, int]:
    """``{label: pid}`` of the cluster processes a profile covers: node, dispatchers, replicas."""
    import psutil

    target.refresh_pids()
    out = {f"node_{i}": p for i, p in enumerate(target.pids("node"))}
    out.update({f"dispatcher_{i}": p for i, p in enumerate(target.pids("dispatcher"))})
    for pid in target.pids("ray_other"):
        with contextlib.suppress(psutil.Error):
            if psutil.Process(pid).cmdline()[0].startswith("ray::StoreReplica"):
                out[f"replica_{sum(k.startswith('replica') for k in out)}"] = pid
    return out


def _start_profile(target: Any, phase: str) -> Any:
    """Start py-spy on the cluster for ``PROFILE['seconds'][phase]`` when ``--profile`` asked for it."""
    if PROFILE["dir"] is None or not isinstance(target, EmbeddedCluster):
        return None
    pids = _profiled_pids(target)
    seconds = PROFILE["seconds"][phase]
    folder = Path(PROFILE["dir"]) / phase
    started = start_profiles(pids, seconds, folder, rate=PROFILE_RATE)
    cpu0 = {k: _thread_cpu(p) for k, p in pids.items()}
    return pids, seconds, folder, started, cpu0, time.monotonic()


def _thread_cpu(pid: int) -> dict[str, float]:
    """CPU seconds so far of each thread of ``pid``, as ``"<tid> <name>"`` (Ray's C++ threads have names)."""
    tick = os.sysconf("SC_CLK_TCK")
    out: dict[str, float] = {}
    for task in Path(f"/proc/{pid}/task").iterdir():
        with contextlib.suppress(OSError):
            stat = (task / "stat").read_text()
            name = stat[stat.index("(") + 1:stat.rindex(")")]
            fields = stat[stat.rindex(")") + 2:].split()
            out[f"{task.name} {name}"] = (int(fields[11]) + int(fields[12])) / tick
    return out


async def _connects_after(fleet: FleetProcess, seconds: float) -> int:
    """Connects the fleet made within the first ``seconds`` (the profile window of a storm)."""
    await asyncio.sleep(seconds)
    return int((await asyncio.to_thread(fleet.snapshot))["connects"])


def _finish_profile(handle: Any, count: int) -> None:
    """Wait for the profilers; write ``meta.json`` (pids, CPU seconds per process, events counted)."""
    if handle is None:
        return
    import json

    pids, seconds, folder, started, cpu0, t0 = handle
    for _, proc, _ in started:
        proc.communicate(timeout=seconds + 60)
    cpu1 = {k: _thread_cpu(p) for k, p in pids.items()}
    threads = {k: {t: round(c - cpu0[k].get(t, 0.0), 3) for t, c in cpu1[k].items() if c - cpu0[k].get(t, 0.0) > 0}
               for k in pids}
    meta = {"pids": pids, "seconds": seconds, "rate_hz": PROFILE_RATE, "count": count,
            "wall_s": round(time.monotonic() - t0, 3), "cpu_s": {k: round(sum(v.values()), 4) for k, v in threads.items()},
            "thread_cpu_s": threads, "load": load_avg()}
    (folder / "meta.json").write_text(json.dumps(meta, indent=1))


async def idle_phase(target: Any, seconds: float) -> dict[str, Any]:
    c0, _ = server_cpu(target)
    t0 = time.monotonic()
    await asyncio.sleep(seconds)
    c1, _ = server_cpu(target)
    return {"idle_cpu_per_s": round((c1 - c0) / (time.monotonic() - t0), 4)}


async def _send(target: Any, s: Sizes, vehicles: int, start: int, requests: int, label: str) -> dict[str, Any]:
    """The requests of one phase: ``cfleet publish`` for a broker, triggers for this cluster."""
    if isinstance(target, EmbeddedCluster):
        vins = make_vins(VIN_PREFIX, vehicles, start=start, digits=VIN_DIGITS)
        p0 = _own_cpu_s()
        async with PlatformSender(target.host, target.port, payload_size=s.payload_size,
                                  ack_timeout_s=s.cap_s) as platform:
            sents = [await platform.submit(f"{label}-{i:05d}", vins) for i in range(1, requests + 1)]
            await platform.all_acked(s.cap_s)
        acks = [x.ack_s for x in sents if x.ack_s is not None]
        return {"first_send_us": sents[0].sent_us, "platform": "fanout.client (PlatformSender), one trigger per request",
                "platform_cpu_s": round(_own_cpu_s() - p0, 4), "request_ack_max_s": _r(max(acks) if acks else None, 3),
                "sent": vehicles * requests}
    pub = await asyncio.to_thread(run_publish, PublishSpec(
        target.port, vehicles, requests, host=target.host, prefix=VIN_PREFIX, digits=VIN_DIGITS, start=start,
        window=NAIVE_WINDOW, payload=s.payload_size, request_prefix=label, time_cap_s=s.cap_s))
    return {"first_send_us": pub["first_publish_unix_us"], "platform": f"cfleet publish (window {NAIVE_WINDOW})",
            "platform_cpu_s": pub["cpu_s"], "publishes_per_s": pub["publishes_per_s"], "sent": pub["pubacks"]}


async def _deliveries(target: Any, fleet: FleetProcess, s: Sizes, vehicles: int, start: int, requests: int,
                      label: str, idle_per_s: float) -> dict[str, Any]:
    """Send R requests to the fleet's vehicles and wait for every delivery; server CPU over that window."""
    snap = await asyncio.to_thread(fleet.snapshot)
    prof = _start_profile(target, "fanout") if label.endswith("fan1") else None
    c0, r0 = server_cpu(target)
    t0 = time.monotonic()
    sent = await _send(target, s, vehicles, start, requests, label)
    expected = int(snap["unique"]) + sent["sent"]
    status = await _wait_unique(fleet, expected, max(1.0, s.cap_s - (time.monotonic() - t0)))
    c1, r1 = server_cpu(target)
    if prof is not None:  # deliveries inside the profile window, from the fleet's progress
        await asyncio.sleep(max(0.0, prof[1] - (time.monotonic() - prof[5])))
        got = int(fleet.progress["unique"] if fleet.progress else 0) - int(snap["unique"])
        _finish_profile(prof, got)
    dt = time.monotonic() - t0
    out = {"expected_deliveries": sent["sent"], "wait_status": status, "window_s": _r(dt, 3),
           "server_cpu_s": _r(c1 - c0, 3), **{k: v for k, v in sent.items() if k != "sent"}}
    if r0 is not None and r1 is not None:
        out["cpu_by_role_s"] = cpu_delta(r0, r1)
    out["_busy"] = (c1 - c0, idle_per_s, dt)  # the window's CPU, idle rate, seconds: see _delivery_summary
    return out


def _delivery_summary(out: dict[str, Any], res: dict[str, Any]) -> None:
    unique = res["unique"]
    per_delivery, error = busy_us_per(*out.pop("_busy"), unique, "deliveries")
    if error is not None:
        out["delivery_cpu_error"] = error
    first, last = out.pop("first_send_us"), res["last_delivery_unix_us"]
    out.update({
        "deliveries": unique, "complete": unique >= out["expected_deliveries"],
        "deliveries_per_s": _r(unique / ((last - first) / 1e6), 1) if unique and last > first else None,
        "fleet_deliveries_per_s": res["deliveries_per_s"],
        "server_cpu_us_per_delivery": per_delivery, "server_cpu_us_per_delivery_raw": _per(out["server_cpu_s"], unique),
        "platform_cpu_us_per_delivery": _per(out["platform_cpu_s"], unique),
        "latency_p50_ms": res["delivery_latency_ms"]["p50"], "latency_p99_ms": res["delivery_latency_ms"]["p99"],
        "latency_max_ms": res["delivery_latency_ms"]["max"],
    })
    out.update(_fleet_figures(res))


async def _finish(fleet: FleetProcess, out: dict[str, Any]) -> dict[str, Any]:
    """Stop the fleet of a delivery phase and add what it measured to the phase's figures."""
    fleet.stop()
    res = await asyncio.to_thread(fleet.result, 60.0)
    _delivery_summary(out, res)
    out["load_after"] = load_avg()
    return out


async def fanout_phase(target: Any, s: Sizes, *, label: str, idle_per_s: float) -> dict[str, Any]:
    """N vehicles connected and subscribed, then R requests to all of them."""
    out: dict[str, Any] = {"vehicles": s.vehicles, "requests": s.requests, "load_before": load_avg()}
    with FleetProcess(_fleet_spec(target, s, s.vehicles, FANOUT_START)) as fleet:
        out["fleet_ready_s"] = await asyncio.to_thread(fleet.wait_ready, s.connect_cap_s)
        await asyncio.sleep(1.0)  # the last subscriptions and online events reach the dispatch state
        out.update(await _deliveries(target, fleet, s, s.vehicles, FANOUT_START, s.requests, label, idle_per_s))
        return await _finish(fleet, out)


async def heartbeat_phase(target: Any, s: Sizes, *, label: str, idle_per_s: float) -> dict[str, Any]:
    """Heartbeats at ``hb_rate`` over the fleet: server CPU per heartbeat, then deliveries during the storm."""
    interval = s.hb_vehicles / s.hb_rate
    out: dict[str, Any] = {"vehicles": s.hb_vehicles, "heartbeat_interval_s": round(interval, 3),
                           "offered_heartbeats_per_s": s.hb_rate, "requests": s.hb_requests, "load_before": load_avg()}
    with FleetProcess(_fleet_spec(target, s, s.hb_vehicles, HB_START, heartbeat_interval=interval)) as fleet:
        await asyncio.to_thread(fleet.wait_ready, s.connect_cap_s)
        await asyncio.sleep(min(interval, 5.0) + 1.0)  # every vehicle is in its heartbeat cycle
        a = await asyncio.to_thread(fleet.snapshot)
        prof = _start_profile(target, "heartbeat_storm")
        c0, r0 = server_cpu(target)
        await asyncio.sleep(s.hb_window_s)
        c1, r1 = server_cpu(target)
        b = await asyncio.to_thread(fleet.snapshot)
        if prof is not None:  # heartbeats inside the profile window (shorter than the measuring window)
            _finish_profile(prof, int((b["heartbeats"] - a["heartbeats"]) * min(1.0, prof[1] / (b.at - a.at))))
        dt, hb = b.at - a.at, int(b["heartbeats"] - a["heartbeats"])
        per_hb, error = busy_us_per(c1 - c0, idle_per_s, dt, hb, "heartbeats")
        out.update({"heartbeats_per_s": _r(hb / dt, 1), "heartbeat_window_s": _r(dt, 3),
                    "server_cpu_heartbeat_window_s": _r(c1 - c0, 3), "server_cpu_us_per_heartbeat": per_hb,
                    "server_cpu_share_heartbeats": _r((c1 - c0) / dt, 3)})
        if error is not None:
            out["heartbeat_cpu_error"] = error
        if r0 is not None and r1 is not None:
            out["cpu_by_role_heartbeat_window_s"] = cpu_delta(r0, r1)
        out.update(await _deliveries(target, fleet, s, s.hb_vehicles, HB_START, s.hb_requests, label, idle_per_s))
        return await _finish(fleet, out)


async def storm_phase(target: Any, s: Sizes, *, idle_per_s: float) -> dict[str, Any]:
    """Vehicles connect, subscribe and publish online as fast as ``storm_concurrency`` allows."""
    n, _ = storm_size(s.storm_vehicles)
    out: dict[str, Any] = {"vehicles": n, "requested_vehicles": s.storm_vehicles, "concurrency": s.storm_concurrency,
                           "load_before": load_avg()}
    spec = _fleet_spec(target, s, n, STORM_START, connect_timeout_s=60.0)
    prof = _start_profile(target, "connection_storm")
    c0, r0 = server_cpu(target)
    t0 = time.monotonic()
    with FleetProcess(spec) as fleet:
        counted = asyncio.create_task(_connects_after(fleet, prof[1])) if prof is not None else None
        await asyncio.to_thread(fleet.wait_ready, s.connect_cap_s)
        c_ready, _ = server_cpu(target)
        t_ready = time.monotonic()
        await asyncio.sleep(s.storm_settle_s)  # the server finishes what the connects started (online events)
        c1, r1 = server_cpu(target)
        t1 = time.monotonic()
        if counted is not None:
            _finish_profile(prof, await counted)
        fleet.stop()
        res = await asyncio.to_thread(fleet.result, 60.0)
    connects = res["connects"]
    per_connect, error = busy_us_per(c1 - c0, idle_per_s, t1 - t0, connects, "connects")
    at_ready, _ = busy_us_per(c_ready - c0, idle_per_s, t_ready - t0, connects, "connects")
    if error is not None:
        out["connect_cpu_error"] = error
    out.update({
        "connects": connects, "connect_errors": res["connect_errors"], "connects_per_s": res["connects_per_s"],
        "subscribes_per_s": res["subscribes_per_s"], "connect_latency_p50_ms": res["connect_latency_ms"]["p50"],
        "connect_latency_p99_ms": res["connect_latency_ms"]["p99"],
        "subscribe_latency_p99_ms": res["subscribe_latency_ms"]["p99"],
        "server_cpu_s": _r(c1 - c0, 3), "settle_s": s.storm_settle_s,
        "server_cpu_us_per_connect": per_connect, "server_cpu_us_per_connect_at_ready": at_ready,
        "load_after": load_avg(), **_fleet_figures(res),
    })
    if r0 is not None and r1 is not None:
        out["cpu_by_role_s"] = cpu_delta(r0, r1)
    return out


# ---------------------------------------------------------------------------------------------------
# all systems


PHASES: tuple[str, ...] = ("fanout", "heartbeat_storm", "connection_storm")


def _server(system: str, s: Sizes) -> Any:
    return EmbeddedCluster(listeners_per_node=s.listeners) if system == "fanout" else PeerBroker(system)


def _describe(target: Any) -> dict[str, Any]:
    out: dict[str, Any] = {"version": target.version()}
    if isinstance(target, EmbeddedCluster):
        log(NAME, f"fanout cluster on port {target.port} (started in {target.startup_s:.1f} s)")
        out.update({"startup_s": round(target.startup_s or 0, 2), "config": BENCH_CONFIG,
                    # the A/B switch of the direct channels (docs/architecture.md): set it in the environment
                    "direct_channels": os.environ.get("FANOUT_CLUSTER_DIRECT_CHANNELS", "true"),
                    "data_dir_fs": filesystem_of(target.data_dir), "dispatchers": len(target.pids("dispatcher")),
                    "nodes": len(target.pids("node"))})
    else:
        out["config"] = f"persistence false, max_inflight_messages {INFLIGHT_WINDOW}, set_tcp_nodelay true"
    return out


def bench(systems: Sequence[str], s: Sizes, errors: dict[str, str],
          phases: Sequence[str] = PHASES) -> dict[str, dict[str, Any]]:
    """Start every system's server, run each phase on one system after the other, stop them.

    Interleaved (phase 1 on every system, then phase 2, ...) rather than system after system: on this
    shared machine a neighbour's load then falls on the compared figures alike.

    Returns:
        Per system: ``phases`` (figures per phase) and what describes its server.
    """
    show = ("deliveries_per_s", "server_cpu_us_per_delivery", "fleet_cpu_us_per_delivery", "connects_per_s",
            "server_cpu_us_per_connect", "fleet_cpu_us_per_connect", "heartbeats_per_s", "server_cpu_us_per_heartbeat",
            "wait_status", "other_load_pct")
    out: dict[str, dict[str, Any]] = {system: {"phases": {}} for system in systems}
    with contextlib.ExitStack() as stack:
        targets: dict[str, Any] = {}
        for system in systems:
            try:
                targets[system] = stack.enter_context(_server(system, s))
            except Exception as exc:  # the server did not start (e.g. Mosquitto not installed)
                errors[f"{system} server"] = f"{type(exc).__name__}: {exc}"
                log(NAME, f"{system}: FAILED {errors[f'{system} server']}")
                continue
            out[system].update(_describe(targets[system]))
        idle: dict[str, float] = {}
        for system, target in targets.items():
            got = attempt(NAME, f"{system} idle", lambda t=target: idle_phase(t, s.idle_s), errors,
                          show=("idle_cpu_per_s",))
            out[system]["phases"]["idle"] = got
            idle[system] = get(got, "idle_cpu_per_s") or 0.0
        for phase in phases:
            for system, target in targets.items():
                kw: dict[str, Any] = {"quiet_wait_s": s.quiet_wait_s, "show": show,
                                      "server_cpu": lambda t=target: server_cpu(t)[0]}
                tag, i0 = system[:3], idle[system]
                if phase == "fanout":
                    runs = [attempt(NAME, f"{system} fanout #{i + 1}", lambda t=target, i=i: fanout_phase(
                        t, s, label=f"{tag}-fan{i + 1}", idle_per_s=i0), errors, **kw) for i in range(s.fanout_repeats)]
                    got = median_run(runs, "deliveries_per_s")
                elif phase == "heartbeat_storm":
                    got = attempt(NAME, f"{system} heartbeat_storm", lambda t=target: heartbeat_phase(
                        t, s, label=f"{tag}-hb", idle_per_s=i0), errors, **kw)
                else:
                    got = attempt(NAME, f"{system} connection_storm", lambda t=target: storm_phase(
                        t, s, idle_per_s=i0), errors, **kw)
                out[system]["phases"][phase] = got
    return out


# Per system, its flat figures and where each comes from: (figure, phase, the phase's key).
FLAT: tuple[tuple[str, str, str], ...] = (
    ("deliveries_per_s", "fanout", "deliveries_per_s"),
    ("server_cpu_us_per_delivery", "fanout", "server_cpu_us_per_delivery"),
    ("server_cpu_us_per_delivery_raw", "fanout", "server_cpu_us_per_delivery_raw"),
    ("latency_p50_ms", "fanout", "latency_p50_ms"),
    ("latency_p99_ms", "fanout", "latency_p99_ms"),
    ("connects_per_s", "connection_storm", "connects_per_s"),
    ("subscribes_per_s", "connection_storm", "subscribes_per_s"),
    ("connect_latency_p99_ms", "connection_storm", "connect_latency_p99_ms"),
    ("server_cpu_us_per_connect", "connection_storm", "server_cpu_us_per_connect"),
    ("heartbeats_per_s", "heartbeat_storm", "heartbeats_per_s"),
    ("server_cpu_us_per_heartbeat", "heartbeat_storm", "server_cpu_us_per_heartbeat"),
    ("hb_storm_deliveries_per_s", "heartbeat_storm", "deliveries_per_s"),
    ("fleet_cpu_us_per_delivery", "fanout", "fleet_cpu_us_per_delivery"),
    ("fleet_cpu_us_per_connect", "connection_storm", "fleet_cpu_us_per_connect"),
    ("platform_cpu_us_per_delivery", "fanout", "platform_cpu_us_per_delivery"),
    ("deliveries_complete", "fanout", "complete"),
    ("fleet_duplicates", "fanout", "fleet_duplicates"),
    ("storm_vehicles", "connection_storm", "vehicles"),
    ("storm_connect_errors", "connection_storm", "connect_errors"),
)


def flatten(sc: dict[str, Any]) -> dict[str, Any]:
    """One system's figures (:data:`FLAT`, None where a phase failed) and its server's version."""
    ph = sc.get("phases", {})
    return {**{figure: get(ph.get(phase), key) for figure, phase, key in FLAT}, "version": sc.get("version")}


def compute_ratios(systems: dict[str, dict[str, Any]]) -> dict[str, float | None]:
    """This cluster's figure / Mosquitto's (> 1: higher; better for rates, worse for CPU)."""
    ours, theirs = systems.get("fanout", {}), systems.get("mosquitto", {})
    keys = ("deliveries_per_s", "server_cpu_us_per_delivery", "connects_per_s", "server_cpu_us_per_connect",
            "hb_storm_deliveries_per_s", "server_cpu_us_per_heartbeat")
    return {f"{k}_vs_mosquitto": ratio(ours.get(k), theirs.get(k)) for k in keys}


def check_targets(systems: dict[str, dict[str, Any]], r: dict[str, Any]) -> dict[str, bool | None]:
    ours = systems.get("fanout", {})
    fleet = [f.get("fleet_cpu_us_per_delivery") for f in systems.values()]
    worst_fleet = max((v for v in fleet if v is not None), default=None)
    return {
        "deliveries_per_s_ge_1.0x_mosquitto": at_least(r["deliveries_per_s_vs_mosquitto"], 1.0),
        "server_cpu_le_25us_per_delivery": at_most(ours.get("server_cpu_us_per_delivery"), 25.0),
        "connects_per_s_ge_1.0x_mosquitto": at_least(r["connects_per_s_vs_mosquitto"], 1.0),
        "server_cpu_le_300us_per_connect": at_most(ours.get("server_cpu_us_per_connect"), 300.0),
        "hb_storm_deliveries_per_s_ge_1.0x_mosquitto": at_least(r["hb_storm_deliveries_per_s_vs_mosquitto"], 1.0),
        "fleet_cpu_le_10us_per_delivery": at_most(worst_fleet, TARGETS["fleet_cpu_us_per_delivery_max"]),
    }


def plot(result: dict[str, Any], name: str, out_dir: str | Path | None) -> Path:
    plt = pyplot()
    systems = result["systems"]
    fig, axes = plt.subplots(2, 3, figsize=(16, 8))

    def series(*keys: str) -> dict[str, list[float | None]]:
        return system_series(systems, keys)

    p = result["params"]
    grouped_bars(axes[0][0], [f"fanout {p['vehicles']:,} x {p['requests']}", "during heartbeat storm"],
                 series("deliveries_per_s", "hb_storm_deliveries_per_s"), ylabel="deliveries / s",
                 title="Delivery throughput (higher is better)")
    grouped_bars(axes[0][1], ["minus idle", "raw"], series("server_cpu_us_per_delivery", "server_cpu_us_per_delivery_raw"),
                 ylabel="server CPU us / delivery", title="Server CPU per delivery (lower is better)",
                 target=TARGETS["server_cpu_us_per_delivery_max"], target_label="target 25 us", fmt="{:,.1f}")
    grouped_bars(axes[0][2], ["per delivery", "per connect"], series("fleet_cpu_us_per_delivery", "fleet_cpu_us_per_connect"),
                 ylabel="cfleet CPU us", title="Load generator's own CPU (cfleet)", fmt="{:,.1f}",
                 target=TARGETS["fleet_cpu_us_per_delivery_max"], target_label="target 10 us")
    grouped_bars(axes[1][0], ["CONNACK", "SUBACK"], series("connects_per_s", "subscribes_per_s"), ylabel="per second",
                 title=f"Connection storm, {p['storm_concurrency']} in flight (higher is better)")
    grouped_bars(axes[1][1], ["per connect"], series("server_cpu_us_per_connect"), ylabel="server CPU us (log)",
                 title="Server CPU per connect (lower is better)", target=TARGETS["server_cpu_us_per_connect_max"],
                 target_label="target 300 us", fmt="{:,.0f}", log=True)
    grouped_bars(axes[1][2], ["per heartbeat"], series("server_cpu_us_per_heartbeat"), ylabel="server CPU us",
                 title=f"Heartbeat storm, {p['hb_rate']:,.0f}/s offered (lower is better)", fmt="{:,.1f}")
    la = result["load_average"]["start"]
    machine_title(fig, result, name, f"load average at start {la[0]}/{la[1]}/{la[2]}; fleet: cfleet")
    return save_figure(fig, name, out_dir)


def is_partial(quick: bool, systems: Sequence[str], phases: Sequence[str], sizes: Sizes) -> bool:
    """Whether a run is narrower than the whole benchmark of its mode: some systems or phases, other sizes, or
    profiled (py-spy takes CPU from the servers). Such a run writes ``server_bench[_quick]_partial``. More
    fanout repeats than the mode's (``--repeats 3``) are the whole benchmark measured more carefully (the median
    of more runs), not a narrower one."""
    mode = QUICK if quick else FULL
    if sizes.fanout_repeats >= mode.fanout_repeats:
        sizes = replace(sizes, fanout_repeats=mode.fanout_repeats)
    return set(systems) != set(SYSTEMS) or set(phases) != set(PHASES) or sizes != mode or bool(PROFILE["dir"])


def run(quick: bool = False, *, out_dir: str | Path | None = None, systems: Sequence[str] = SYSTEMS,
        sizes: Sizes | None = None, phases: Sequence[str] = PHASES) -> dict[str, Any]:
    """Run every phase for each system; write ``<results>/server_bench[_quick].json`` and ``.png``
    (``..._partial`` for some systems or phases, other sizes or a profiled run: :func:`result_name`).

    Args:
        quick: small numbers (smoke test), written as ``server_bench_quick``.
        out_dir: results folder (default benchmarks/results or ``$FANOUT_BENCH_RESULTS``).
        systems: some of :data:`SYSTEMS`.
        sizes: override the sizes of the mode.
        phases: some of :data:`PHASES` (the idle measurement always runs).

    Returns:
        The result object written to JSON.
    """
    s = sizes or (QUICK if quick else FULL)
    name = result_name(NAME, quick, partial=is_partial(quick, systems, phases, s))
    fanout_log.configure(level="warning")  # the platform client logs every connect at info
    soft, hard = raise_nofile_limit()
    binary = cfleet_run.build()
    started = time.time()
    errors: dict[str, str] = {}
    result: dict[str, Any] = {
        **run_header(name, quick, started),
        "load_average": {"start": load_avg()},
        "params": {**asdict(s), "storm_vehicles_used": storm_size(s.storm_vehicles)[0], "nofile_soft": soft,
                   "nofile_hard": hard, "systems": list(systems), "phases": list(phases)},
        "targets": TARGETS,
        "fleet": {"name": "cfleet", "binary": str(binary.relative_to(cfleet_run.REPO)),
                  "sources": "benchmarks/cfleet/*.c, *.h (C, epoll, libc only)",
                  "sources_sha1": cfleet_run.sources_digest(),
                  "measured": f"every phase of every system: {', '.join(phases)}",
                  "platform": {"mosquitto": f"cfleet publish (one QoS 1 PUBLISH per vehicle and request, window "
                                            f"{NAIVE_WINDOW})",
                               "fanout": "fanout.client.FanoutClient (PlatformSender): blob + one trigger per request"}},
        "notes": [
            "Both servers run on 127.0.0.1 for the whole benchmark; each phase runs on one system, then on the other "
            "(interleaved, so that a neighbour's load on this shared machine falls on the compared figures alike). "
            "They share the CPUs with the fleet, the platform, each other's idle background (idle_cpu_per_s: the "
            "cluster's Ray processes) and whatever else runs here (load_average, machine_busy_pct_during and "
            "other_load_pct per phase).",
            "deliveries_per_s = unique deliveries / (last delivery - first send); a delivery is a PUBLISH the fleet "
            "received and PUBACKed. fleet_deliveries_per_s is the fleet's own first-to-last rate.",
            "server_cpu_us_per_delivery: server CPU over the send-to-last-delivery window minus the idle server's CPU "
            "for as long, per delivery; _raw without that subtraction. For this cluster the server is every process of "
            "the fanout up tree (ConnectionNode, Dispatchers, Controller, raylet, gcs, other Ray workers), cpu_by_role_s "
            "splits it.",
            "Durability differs: this cluster acknowledges a trigger once its rows are fsynced on every replica and "
            "deletes a row only on the vehicle's PUBACK; Mosquitto runs with persistence false.",
            "Connection storm: as many vehicles as one server process can hold (RLIMIT_NOFILE hard limit minus "
            f"{FD_MARGIN}), connecting with storm_concurrency handshakes in flight (Mosquitto listens with a backlog "
            "of 100: more in flight overflows its queue and the kernel's SYN retransmits, 1 s later, would set the "
            "pace). server_cpu_us_per_connect includes storm_settle_s after the last SUBACK (this cluster handles "
            "the online events then), minus idle.",
            "Heartbeat storm: every vehicle publishes ecp/<VIN>/heartbeat at QoS 0 every vehicles/hb_rate seconds; "
            "server CPU per heartbeat over hb_window_s without deliveries, minus idle; then hb_requests requests are "
            "delivered during the storm (hb_storm_deliveries_per_s, the figure the 1.0x target compares).",
            "The fleet's CPU (getrusage of cfleet's processes): fleet_cpu_us_per_connect is its CPU until every "
            "vehicle was subscribed per CONNACK, fleet_cpu_us_per_delivery its CPU from then to the stop per PUBLISH "
            "received. On loopback most of it is kernel time (cpu_sys): a send runs the receiving side's TCP input in "
            "the sender's context, a connect the whole three-way handshake including the listener's part.",
        ],
        "systems": {}, "phases": {},
    }
    log(NAME, f"mode={result['mode']} sizes={asdict(s)} cfleet={binary} load={result['load_average']['start']}")
    for system, sc in bench(systems, s, errors, phases).items():
        result["phases"][system] = sc["phases"]
        result["systems"][system] = {**flatten(sc), **{k: v for k, v in sc.items() if k in (
            "startup_s", "dispatchers", "nodes", "data_dir_fs", "config")}}
    result["ratios"] = compute_ratios(result["systems"])
    result["targets_met"] = check_targets(result["systems"], result["ratios"])
    result["fleet"]["cpu_us_per_delivery"] = {k: v.get("fleet_cpu_us_per_delivery") for k, v in result["systems"].items()}
    result["fleet"]["cpu_us_per_connect"] = {k: v.get("fleet_cpu_us_per_connect") for k, v in result["systems"].items()}
    result["load_average"]["end"] = load_avg()
    result["errors"] = errors
    save_result(name, result, plot, out_dir, started=started)
    return result


def main(argv: Sequence[str] | None = None) -> int:
    parser = bench_parser(NAME, __doc__, quick_help="small numbers (smoke test)")
    parser.add_argument("--systems", nargs="+", choices=SYSTEMS, default=list(SYSTEMS))
    parser.add_argument("--phases", nargs="+", choices=PHASES, default=list(PHASES))
    parser.add_argument("--vehicles", type=int, default=None, help="fanout and heartbeat vehicles")
    parser.add_argument("--requests", type=int, default=None, help="fanout requests")
    parser.add_argument("--repeats", type=int, default=None, help="fanout runs per system (median reported)")
    parser.add_argument("--storm-concurrency", type=int, default=None, help="handshakes in flight in the storm")
    parser.add_argument("--listeners", type=int, default=None,
                        help="this cluster's mqtt.listeners_per_node (default 1, the default config's)")
    parser.add_argument("--profile", default=None, metavar="DIR",
                        help="py-spy the cluster's node, dispatchers and replicas in the fanout and storm phases; "
                             "raw stacks + meta.json per phase under DIR (see docs/profile.md)")
    args = parser.parse_args(argv)
    PROFILE["dir"] = args.profile
    s = QUICK if args.quick else FULL
    changes = {k: v for k, v in (("vehicles", args.vehicles), ("hb_vehicles", args.vehicles), ("requests", args.requests),
                                 ("fanout_repeats", args.repeats), ("storm_concurrency", args.storm_concurrency),
                                 ("listeners", args.listeners))
               if v is not None}
    result = run(args.quick, out_dir=args.out_dir, systems=args.systems, sizes=replace(s, **changes) if changes else s,
                 phases=args.phases)
    for system, f in result["systems"].items():
        log(NAME, f"{system}: " + ", ".join(f"{k}={f.get(k)}" for k in FIGURES))
    for k, v in {**result["ratios"], **result["targets_met"]}.items():
        log(NAME, f"{k} = {v}")
    log(NAME, f"load average start {result['load_average']['start']} end {result['load_average']['end']}")
    return 1 if result["errors"] else 0


if __name__ == "__main__":
    raise SystemExit(main())
