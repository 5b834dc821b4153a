"""Fleet benchmark (issue 7): this cluster against Mosquitto and amqtt, with the mock fleet and platform.

Scenarios (each system in the same run, one after the other, on 127.0.0.1; the same mock fleet of
``scripts/fleet`` in 2 processes is the vehicles for every system):

1. ``fanout``: R requests to N vehicles (default 10 x 10,000). This cluster: one blob + trigger per
   request through the platform client, the cluster delivers one message in flight per vehicle.
   Mosquitto and amqtt: the naive fanout, the platform publishing every message itself to each vehicle's
   topic at QoS 1, pipelined (:class:`~benchmarks.scenarios.senders.NaivePublisher`). deliveries/s,
   latency percentiles (send time stamped in the payload -> vehicle), server CPU per delivery.
2. ``ingest`` (this cluster only: the peers have no batch to ingest): 10k / 100k / 1M-VIN triggers for
   offline vehicles until PUBACK, as one PUBLISH and through the platform client; rows/s.
3. ``connection_storm``: N vehicles connect at once (no rate limit, 1,000 handshakes in flight per fleet
   process) against a freshly started server: CONNACK rate, server RSS per connection (this cluster: the
   ConnectionNode process; the whole cluster's growth is reported next to it).
4. ``heartbeat_storm``: N vehicles each publishing ``ecp/<VIN>/heartbeat`` (QoS 0) so that the fleet
   sends ``hb_rate`` per second: server CPU per heartbeat (minus the idle server's CPU) in a window
   without deliveries, then R requests delivered during the storm: do deliveries keep flowing?

Durability differs, and the JSON notes say how: this cluster PUBACKs the platform only after the
trigger's rows are fsynced in LMDB and deletes a row only on the vehicle's PUBACK; Mosquitto runs with
``persistence false`` (and even with persistence it only snapshots periodically); amqtt keeps messages
in memory. The target of issue 7: this cluster >= 1.5x Mosquitto's deliveries/s in scenario 1.

Run alone: ``python -m benchmarks.fleet_bench [--quick] [--systems fanout mosquitto amqtt]``; normally
through ``python -m benchmarks.run``.
"""
from __future__ import annotations

import contextlib
import dataclasses
import functools
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Sequence

from fanout import log as fanout_log

from .harness.cluster import BENCH_CONFIG, EmbeddedCluster, filesystem_of
from .harness.peers import INFLIGHT_WINDOW, QUEUE_BOUND, SYSTEMS, PeerBroker
from .harness.plots import grouped_bars, machine_title, pyplot, save_figure, system_series
from .harness.processes import processes_for, raise_nofile_limit, storm_size
from .harness.report import at_least, attempt, get, median_run, ratio
from .harness.results import bench_parser, log, result_name, run_header, save_result
from .harness.versions import mosquitto_binary
from .scenarios import phases
from .scenarios.senders import NAIVE_WINDOW

NAME = "fleet_bench"
TARGETS = {"deliveries_per_s_vs_mosquitto_min": 1.5, "idle_vehicles_one_node": 100_000}

# Figures every system must have (the quick-mode test checks them), flat under ``systems.<system>``.
FIGURES: tuple[str, ...] = (
    "deliveries_per_s", "steady_deliveries_per_s", "latency_p50_ms", "latency_p90_ms", "latency_p99_ms",
    "first_delivery_p50_ms", "server_cpu_us_per_delivery",
    "storm_connected", "connect_per_s", "rss_per_conn_bytes",
    "heartbeats_per_s", "cpu_us_per_heartbeat", "hb_storm_deliveries_per_s", "hb_storm_latency_p99_ms",
)
RATIOS: tuple[str, ...] = (
    "deliveries_per_s_vs_mosquitto", "deliveries_per_s_vs_amqtt", "steady_deliveries_per_s_vs_mosquitto",
    "latency_p99_vs_mosquitto", "latency_p99_vs_amqtt", "connect_per_s_vs_mosquitto", "connect_per_s_vs_amqtt",
    "rss_per_conn_vs_mosquitto", "rss_per_conn_vs_amqtt", "cpu_us_per_heartbeat_vs_mosquitto",
    "cpu_us_per_heartbeat_vs_amqtt", "hb_storm_deliveries_per_s_vs_mosquitto", "hb_storm_deliveries_per_s_vs_amqtt",
)


@dataclass(frozen=True)
class Sizes:
    """How much load each scenario gets."""

    vehicles: int
    requests: int
    ingest_vins: tuple[int, ...]
    storm_vehicles: int  # requested; capped by the descriptor limit (see storm_size)
    hb_vehicles: int
    hb_rate: float  # heartbeats per second over the whole fleet
    hb_window_s: float
    hb_requests: int
    cap_s: float  # most the deliveries of one scenario may take per system
    connect_cap_s: float
    quiet_wait_s: float
    fresh_storm_server: bool  # connection storm on a freshly started server (RSS from a clean heap)
    payload_size: int = 256
    idle_s: float = 3.0  # idle server CPU is measured over this long
    amqtt_scale: float = 1.0  # amqtt gets this share of the vehicles (and heartbeat rate) of every scenario
    fanout_repeats: int = 1  # scenario 1 runs this often per system; the median run (deliveries/s) is reported


FULL = Sizes(vehicles=10_000, requests=10, ingest_vins=(10_000, 100_000, 1_000_000), storm_vehicles=100_000,
             hb_vehicles=10_000, hb_rate=5_000.0, hb_window_s=10.0, hb_requests=2, cap_s=180.0, connect_cap_s=300.0,
             quiet_wait_s=45.0, fresh_storm_server=True, amqtt_scale=0.1, fanout_repeats=3)
# Quick mode is sized so that what it measures stands above the idle share it subtracts. Heartbeats at
# 2,000/s: at 100/s their CPU (~0.05 core) was below the drift of the cluster's idle background between
# phases (0.13-0.21 core), and one CI run measured a negative figure. 10 requests, as in the full run:
# the fanout scenario's CPU for 2 x 200 deliveries (~0.08 s) was within the tick rounding of ~8 processes
# (10 ms each) of the idle share (~0.05 s); for 10 x 200 it is 0.22-0.36 s against 0.07-0.09 s.
# amqtt gets a quarter of it, as it gets a tenth in the full run: it spends ~320 us per heartbeat, so 2,000/s
# kept it at ~2/3 of a core, and any other load above ~1/3 of this 2-core machine tipped it into a backlog it
# never caught up on (a CI run: 0 of 200 deliveries within the 30 s cap; beside one busy core, 116 of 200).
QUICK = Sizes(vehicles=200, requests=10, ingest_vins=(10_000,), storm_vehicles=500, hb_vehicles=200, hb_rate=2_000.0,
              hb_window_s=2.0, hb_requests=1, cap_s=30.0, connect_cap_s=60.0, quiet_wait_s=0.0,
              fresh_storm_server=False, idle_s=1.0, amqtt_scale=0.25)


def storm_listeners(vehicles: int) -> int:
    """Listener processes (``mqtt.listeners_per_node``) this cluster needs for ``vehicles`` connections (so
    it is not bound by :func:`~benchmarks.harness.processes.storm_size`, the single-process peers are)."""
    return processes_for(vehicles)


def _ingest_key(n: int) -> str:
    return f"{n // 1_000_000}m" if n >= 1_000_000 and n % 1_000_000 == 0 else f"{n // 1000}k" if n % 1000 == 0 else str(n)


def _start(system: str, cluster: EmbeddedCluster | None = None, listeners: int = 1) -> Any:
    """The server of ``system``: a new one, or ``cluster`` (already running, left running) for fanout."""
    if system == "fanout":
        return contextlib.nullcontext(cluster) if cluster is not None else EmbeddedCluster(listeners_per_node=listeners)
    return PeerBroker(system)


SCENARIOS = ("fanout", "ingest", "connection_storm", "heartbeat_storm")


def bench_system(system: str, s: Sizes, storm_n: int, errors: dict[str, str],
                 cluster: EmbeddedCluster | None = None, scenarios: Sequence[str] = SCENARIOS) -> dict[str, Any]:
    """Scenarios 1, 4 and (this cluster) 2 on one server process; 3 on a fresh one (full mode).

    ``scenarios`` picks some of :data:`SCENARIOS` (the others are left out of the result)."""
    q = s.quiet_wait_s
    show = ("deliveries_per_s", "latency_p99_ms", "first_delivery_p99_ms", "connect_per_s", "rss_per_conn_bytes",
            "heartbeats_per_s", "server_cpu_us_per_heartbeat", "ack_s", "rows_per_s", "status", "other_load_pct")
    scale = s.amqtt_scale if system == "amqtt" else 1.0
    if scale != 1.0:
        s = dataclasses.replace(s, vehicles=max(1, round(s.vehicles * scale)), hb_vehicles=max(1, round(s.hb_vehicles * scale)),
                                hb_rate=s.hb_rate * scale)
        storm_n = max(1, round(storm_n * scale))
    out: dict[str, Any] = {"sizes_used": {"vehicles": s.vehicles, "requests": s.requests, "hb_vehicles": s.hb_vehicles,
                                          "hb_rate": s.hb_rate, "storm_vehicles": storm_n, "scale": scale}}
    prefix = system[0].upper()

    # On a fresh server this cluster takes the whole storm, with as many listener processes on the port
    # as the descriptor limit asks for; the single-process peers are capped by that limit (storm_size).
    if system == "fanout" and s.fresh_storm_server:
        storm_n = s.storm_vehicles
        out["sizes_used"]["storm_vehicles"] = storm_n
    listeners = storm_listeners(storm_n) if system == "fanout" and s.fresh_storm_server else 1

    def storm(target: Any) -> None:
        out["connection_storm"] = attempt(NAME, f"{system} connection_storm", lambda: phases.storm_phase(
            target, vehicles=storm_n, vin_prefix=f"{prefix}S", cap_s=s.connect_cap_s, label=f"{system}-storm"),
            errors, quiet_wait_s=q, show=show, server_cpu=target.cpu_seconds)

    try:
        with _start(system, cluster) as target:
            if system == "fanout":
                log(NAME, f"fanout cluster on port {target.port} (started in {target.startup_s:.1f} s)")
            out["version"] = target.version()
            if system == "fanout":
                out["config"] = f"{BENCH_CONFIG}(FANOUT_LOG_LEVEL={target.log_level})"
                out["startup_s"] = round(target.startup_s or 0, 2)
                out["data_dir_fs"] = filesystem_of(target.data_dir)
            idle = attempt(NAME, f"{system} idle", lambda: _idle(target, s.idle_s), errors, show=("idle_cpu_per_s",))
            idle_rate = (idle or {}).get("idle_cpu_per_s")
            out["idle_cpu_per_s"] = idle_rate
            runs = [attempt(NAME, f"{system} fanout #{i + 1}", lambda i=i: phases.fanout_phase(
                target, vehicles=s.vehicles, requests=s.requests, vin_prefix=f"{prefix}F{i + 1}", cap_s=s.cap_s,
                payload_size=s.payload_size, idle_cpu_per_s=idle_rate, connect_cap_s=s.connect_cap_s,
                label=f"{system}-fan{i + 1}"), errors, quiet_wait_s=q, show=show, server_cpu=target.cpu_seconds)
                for i in range(s.fanout_repeats)]
            out["fanout"] = median_run(runs, "deliveries_per_s")
            if "heartbeat_storm" in scenarios:
                out["heartbeat_storm"] = attempt(NAME, f"{system} heartbeat_storm", lambda: phases.fanout_phase(
                    target, vehicles=s.hb_vehicles, requests=s.hb_requests, vin_prefix=f"{prefix}H", cap_s=s.cap_s,
                    payload_size=s.payload_size, heartbeat_interval=s.hb_vehicles / s.hb_rate, hb_window_s=s.hb_window_s,
                    idle_s=s.idle_s, connect_cap_s=s.connect_cap_s, label=f"{system}-hb"),
                    errors, quiet_wait_s=q, show=show, server_cpu=target.cpu_seconds)
            if system == "fanout" and "ingest" in scenarios:
                out["ingest"] = {}
                for n in s.ingest_vins:
                    for mode in ("raw", "client"):
                        key = f"{_ingest_key(n)}_{mode}"
                        out["ingest"][key] = attempt(NAME, f"fanout ingest {key}", lambda n=n, mode=mode: phases.ingest_phase(
                            target, n, mode=mode, vin_prefix=f"FI{mode[0].upper()}{_ingest_key(n).upper()}"),
                            errors, quiet_wait_s=q, show=show, server_cpu=target.cpu_seconds)
            if not s.fresh_storm_server and "connection_storm" in scenarios:
                storm(target)
        if s.fresh_storm_server and "connection_storm" in scenarios:
            with _start(system, listeners=listeners) as target:
                storm(target)
    except Exception as exc:  # the server did not start (e.g. Mosquitto not installed)
        errors[f"{system} server"] = f"{type(exc).__name__}: {exc}"
        log(NAME, f"{system}: FAILED {errors[f'{system} server']}")
    return out


async def _idle(target: Any, seconds: float) -> dict[str, Any]:
    return {"idle_cpu_per_s": round(await phases.idle_cpu_rate(target, seconds), 4)}


def flatten(system: str, sc: dict[str, Any]) -> dict[str, Any]:
    """The per-system headline figures (FIGURES order first, then extras)."""
    fan, hb, st = sc.get("fanout"), sc.get("heartbeat_storm"), sc.get("connection_storm")
    f: dict[str, Any] = {
        "deliveries_per_s": get(fan, "deliveries_per_s"), "steady_deliveries_per_s": get(fan, "steady_deliveries_per_s"),
        "latency_p50_ms": get(fan, "latency_p50_ms"), "latency_p90_ms": get(fan, "latency_p90_ms"),
        "latency_p99_ms": get(fan, "latency_p99_ms"), "first_delivery_p50_ms": get(fan, "first_delivery_p50_ms"),
        "server_cpu_us_per_delivery": get(fan, "server_cpu_us_per_delivery"),
        "storm_connected": get(st, "connected"), "connect_per_s": get(st, "connect_per_s"),
        "rss_per_conn_bytes": get(st, "rss_per_conn_bytes"),
        "heartbeats_per_s": get(hb, "heartbeats_per_s"), "cpu_us_per_heartbeat": get(hb, "server_cpu_us_per_heartbeat"),
        "hb_storm_deliveries_per_s": get(hb, "deliveries_per_s"), "hb_storm_latency_p99_ms": get(hb, "latency_p99_ms"),
        "deliveries_complete": get(fan, "complete"), "first_delivery_p99_ms": get(fan, "first_delivery_p99_ms"),
        "hb_storm_vs_quiet_deliveries": ratio(get(hb, "deliveries_per_s"), get(fan, "deliveries_per_s")),
        "cluster_rss_per_conn_bytes": get(st, "cluster_rss_per_conn_bytes"),
        "storm_connected_after_idle": get(st, "connected_after_idle"),
        "storm_idle_server_cpu_pct": get(st, "idle_server_cpu_pct"),
        "storm_listener_processes": get(st, "listener_processes"),
        "duplicates": get(fan, "duplicates"), "order_violations": get(fan, "order_violations"),
        "version": sc.get("version"),
    }
    for key, d in (sc.get("ingest") or {}).items():
        f[f"ingest_{key}_ack_s"] = get(d, "ack_s")
        f[f"ingest_{key}_rows_per_s"] = get(d, "rows_per_s")
    return f


def compute_ratios(systems: dict[str, dict[str, Any]]) -> dict[str, float | None]:
    """This cluster's figure / each peer's (> 1 is higher: better for rates, worse for latency, RSS, CPU)."""
    ours = systems.get("fanout", {})
    out: dict[str, float | None] = {}
    for peer in ("mosquitto", "amqtt"):
        theirs = systems.get(peer, {})
        for key, fig in (("deliveries_per_s", "deliveries_per_s"), ("steady_deliveries_per_s", "steady_deliveries_per_s"),
                         ("latency_p99", "latency_p99_ms"), ("connect_per_s", "connect_per_s"),
                         ("rss_per_conn", "rss_per_conn_bytes"), ("cpu_us_per_heartbeat", "cpu_us_per_heartbeat"),
                         ("hb_storm_deliveries_per_s", "hb_storm_deliveries_per_s")):
            out[f"{key}_vs_{peer}"] = ratio(ours.get(fig), theirs.get(fig))
    return {k: out.get(k) for k in RATIOS}


def check_targets(systems: dict[str, dict[str, Any]], ratios: dict[str, Any]) -> dict[str, bool | None]:
    ours = systems.get("fanout", {})
    return {
        "deliveries_per_s_ge_1.5x_mosquitto": at_least(ratios.get("deliveries_per_s_vs_mosquitto"),
                                                       TARGETS["deliveries_per_s_vs_mosquitto_min"]),
        "idle_vehicles_100k_one_node": at_least(ours.get("storm_connected_after_idle"), TARGETS["idle_vehicles_one_node"]),
    }


def plot(result: dict[str, Any], name: str, out_dir: str | Path | None) -> Path:
    """Per scenario and system: throughput, latency percentiles, ingest, connect rate, RSS, heartbeat CPU."""
    fig, axes = pyplot().subplots(2, 3, figsize=(17, 9))
    series = functools.partial(system_series, result["systems"])
    p = result["params"]

    grouped_bars(axes[0][0], [f"{p['requests']} x {p['vehicles']:,} vehicles", f"same, heartbeat storm\n"
                              f"({p['hb_requests']} x {p['hb_vehicles']:,}, {p['hb_rate']:,.0f} hb/s)"],
                 series(["deliveries_per_s", "hb_storm_deliveries_per_s"]), ylabel="deliveries / s (log)", log=True,
                 title="(1)(4) Fanout throughput (higher is better; target fanout >= 1.5x mosquitto)")
    grouped_bars(axes[0][1], ["p50", "p90", "p99", "storm p99"],
                 series(["latency_p50_ms", "latency_p90_ms", "latency_p99_ms", "hb_storm_latency_p99_ms"]),
                 ylabel="ms from the platform's send (log)", fmt="{:,.0f}", log=True,
                 title="(1)(4) Delivery latency percentiles (lower is better)")
    ours = result["systems"].get("fanout", {})
    sizes = [_ingest_key(n) for n in p["ingest_vins"]]
    grouped_bars(axes[0][2], [f"{k} VINs" for k in sizes],
                 {"one PUBLISH": [ours.get(f"ingest_{k}_raw_ack_s") for k in sizes],
                  "platform client": [ours.get(f"ingest_{k}_client_ack_s") for k in sizes]},
                 ylabel="s until PUBACK (durable, log)", fmt="{:,.2f}", log=True,
                 title="(2) Trigger ingest, this cluster only (lower is better)")
    storm = p["storm_vehicles_used"]
    grouped_bars(axes[1][0], [f"{storm:,} vehicles at once"], series(["connect_per_s"]), ylabel="CONNACKs / s",
                 title="(3) Connection storm: connect rate (higher is better)")
    grouped_bars(axes[1][1], [f"{storm:,} connections"], series(["rss_per_conn_bytes"], 1 / 1024),
                 ylabel="KiB server RSS / connection", fmt="{:,.1f}",
                 title="(3) Server RSS per connection (lower is better)")
    grouped_bars(axes[1][2], [f"{p['hb_vehicles']:,} vehicles, {p['hb_rate']:,.0f} hb/s"],
                 series(["cpu_us_per_heartbeat"]), ylabel="server CPU us / heartbeat (log)", fmt="{:,.1f}", log=True,
                 title="(4) Heartbeat storm: server CPU per heartbeat (lower is better)")
    machine_title(fig, result, name, "server, mock fleet and platform share the machine")
    return save_figure(fig, name, out_dir)


def _notes(s: Sizes, storm_n: int, storm_reason: str | None) -> list[str]:
    notes = [
        "Durable means, per system: fanout - the platform's PUBACK follows the LMDB commit with fsync of every row "
        "of the trigger (and of the blob on every shard); a row is deleted only after the vehicle's PUBACK, so a "
        "crash of any process loses nothing acknowledged. Mosquitto - persistence false: queued messages live in "
        "memory only and are lost on a restart (with persistence true it would still only save periodically, "
        "autosave_interval, not before PUBACK). amqtt - in memory only.",
        "fanout: one blob + one trigger per request through the platform client (fanout.client.FanoutClient); the "
        "cluster keeps ONE message in flight per vehicle (the next after its PUBACK). Peers: the platform publishes "
        f"every message itself (QoS 1, {NAIVE_WINDOW} unacknowledged PUBLISHes in flight), request after request; "
        f"the broker keeps up to {INFLIGHT_WINDOW} in flight per vehicle (max_inflight_messages) and queues the "
        f"rest (max_queued_messages {QUEUE_BOUND:,}).",
        "Latency = arrival at the vehicle - the request's send time stamped in the payload (stamped when the "
        "platform starts sending that request: for the peers the last vehicle's copy waits behind the N-1 "
        "publishes before it, for fanout behind the trigger's durable write and the dispatch). deliveries_per_s = "
        "unique deliveries / (last arrival - first send); steady_deliveries_per_s between 10% and 90% of them.",
        "Vehicles: scripts/fleet (asyncio Protocol per vehicle on the project's codec), 2 processes, CONNECT + "
        "SUBSCRIBE agent/<VIN>/proxy/request/+ at QoS 1, ecp/<VIN>/online once subscribed, PUBACK at once.",
        "CPU figures: server process(es) utime+stime from /proc (10 ms ticks); fanout counts every process of the "
        "cluster (ConnectionNode, Dispatchers, Controller, raylet, GCS, Ray agents), per role in cpu_by_role_s; "
        "per-heartbeat CPU subtracts the idle server's CPU rate over the window, measured just before the "
        "heartbeat fleet starts (heartbeat_storm.idle_cpu_per_s).",
        f"Heartbeat storm: {s.hb_vehicles:,} vehicles, heartbeat QoS 0 every {s.hb_vehicles / s.hb_rate:g} s each "
        f"(~{s.hb_rate:,.0f}/s), measured over {s.hb_window_s:g} s without deliveries, then {s.hb_requests} request(s) "
        "to every vehicle during the storm.",
        f"Connection storm: {storm_n:,} vehicles, no connect rate limit, 1,000 handshakes in flight per fleet "
        "process, source addresses spread over 127/8; rss_per_conn_bytes = server RSS growth / connections, "
        "measured 2 s after the last SUBACK" + (" on a freshly started server." if s.fresh_storm_server else "."),
        f"Scenario 1 runs {s.fanout_repeats} time(s) per system on the same server; the run with the median "
        "deliveries/s is reported (scenarios.fanout.<system>.deliveries_per_s_runs lists all): a shared machine "
        "makes single runs noisy (other_load_pct).",
        "request_ack_* are observed by the platform process (its event loop shares the machine), so they can be "
        "later than the first delivery, which the cluster starts right after the durable write.",
        "Ingest (scenario 2) exists for this cluster only: the peers have no notion of a batch trigger.",
        "other_load_pct (per scenario): machine CPU used by processes that are neither the server, nor this "
        "benchmark, nor its fleet (other engineers' work on this shared machine); high values mean noisy figures.",
    ]
    if s.amqtt_scale != 1.0:
        notes.append(f"amqtt runs every scenario at {s.amqtt_scale:g}x the vehicles (and heartbeat rate): at 10,000 "
                     "vehicles it took 287 s to connect them and delivered nothing of 100,000 messages within the "
                     "180 s cap, and a 19,000-connection storm stalled at 9,075 connections (first full run, "
                     "2026-11-21). Its figures (systems.amqtt.sizes_used) and the *_vs_amqtt ratios therefore compare "
                     "different sizes: read them as an order of magnitude.")
    if storm_reason:
        notes.append(f"The peers' connection storm is capped at {storm_n:,}: {storm_reason}. This cluster "
                     + (f"takes all {s.storm_vehicles:,} on one machine with {storm_listeners(s.storm_vehicles)} "
                        "listener processes sharing the port (mqtt.listeners_per_node, SO_REUSEPORT), so its "
                        "storm figures are for more connections than the peers'." if s.fresh_storm_server
                        else "shares the cap in this mode."))
    return notes


def run(quick: bool = False, *, systems: Sequence[str] = SYSTEMS, out_dir: str | Path | None = None,
        cluster: EmbeddedCluster | None = None, scenarios: Sequence[str] = SCENARIOS) -> dict[str, Any]:
    """Run every scenario for every system; write ``<results>/fleet_bench[_quick].json`` and ``.png``.

    Args:
        quick: small numbers (CI smoke), written as ``fleet_bench_quick``.
        systems: servers to measure (default fanout, mosquitto, amqtt).
        out_dir: results folder (default benchmarks/results or ``$FANOUT_BENCH_RESULTS``).
        cluster: an embedded cluster already running, used (and left running) instead of starting one
            (the quick-mode test shares one between both benchmarks); a full-mode storm still starts its own.
        scenarios: some of :data:`SCENARIOS` (scenario 1, ``fanout``, always runs).

    Returns:
        The result object written to JSON.
    """
    s = QUICK if quick else FULL
    name = result_name(NAME, quick)
    if set(scenarios) != set(SCENARIOS):  # a subset must not overwrite the full run's results
        name += "_" + "_".join(sc for sc in SCENARIOS if sc in scenarios)
    if set(systems) != set(SYSTEMS):  # nor a run of some systems only (harness.results.result_name)
        name += "_partial"
    fanout_log.configure(level="warning")
    soft, hard = raise_nofile_limit()
    storm_n, storm_reason = storm_size(s.storm_vehicles)
    started = time.time()
    errors: dict[str, str] = {}
    result: dict[str, Any] = {
        **run_header(name, quick, started),
        "params": {**asdict(s), "storm_vehicles_used": storm_n, "storm_limit": storm_reason, "nofile_soft": soft,
                   "nofile_hard": hard, "naive_window": NAIVE_WINDOW, "broker_inflight_window": INFLIGHT_WINDOW,
                   "mosquitto_installed": mosquitto_binary() is not None, "scenarios": list(scenarios)},
        "targets": TARGETS, "notes": _notes(s, storm_n, storm_reason), "scenarios": {}, "systems": {},
    }
    log(NAME, f"mode={result['mode']} systems={list(systems)} storm={storm_n:,} sizes={asdict(s)}")
    per_system: dict[str, dict[str, Any]] = {}
    for system in systems:
        per_system[system] = bench_system(system, s, storm_n, errors, cluster, scenarios)
        result["systems"][system] = flatten(system, per_system[system])
    for scenario in ("fanout", "ingest", "connection_storm", "heartbeat_storm"):
        result["scenarios"][scenario] = {sy: sc.get(scenario) for sy, sc in per_system.items() if scenario in sc}
    for sy, sc in per_system.items():
        for key in ("version", "config", "startup_s", "data_dir_fs", "idle_cpu_per_s", "sizes_used"):
            if key in sc:
                result["systems"][sy][key] = sc[key]
    result["ratios"] = compute_ratios(result["systems"])
    result["targets_met"] = check_targets(result["systems"], result["ratios"])
    result["errors"] = errors
    save_result(name, result, plot, out_dir, started=started)
    return result


def main(argv: Sequence[str] | None = None) -> int:
    parser = bench_parser(NAME, __doc__)
    parser.add_argument("--systems", nargs="+", choices=SYSTEMS, default=list(SYSTEMS))
    parser.add_argument("--scenarios", nargs="+", choices=SCENARIOS, default=list(SCENARIOS),
                        help="scenarios to run (fanout, scenario 1, always runs)")
    args = parser.parse_args(argv)
    result = run(args.quick, systems=args.systems, out_dir=args.out_dir, scenarios=args.scenarios)
    for key, value in {**result["ratios"], **result["targets_met"]}.items():
        log(NAME, f"{key} = {value}")
    return 1 if result["errors"] else 0


if __name__ == "__main__":
    raise SystemExit(main())
