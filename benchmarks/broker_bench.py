"""Broker benchmark (issue 2): this broker, Mosquitto and amqtt under the same client load, in one run.

Figures per system:

- (a) QoS 1 msg/s end to end, 1 publisher -> 1 subscriber (subscriber at QoS 1, PUBACKing every
  message); time from the first publish to the last message received.
- (b) the same with 1 publisher -> N subscribers (N = 1,000 in full mode) on distinct topics, the
  publisher sending to the topics round robin.
- (c) broker CPU microseconds per routed message: utime + stime of the broker process (``/proc``) over
  run (a) (and (b)) divided by messages delivered.
- (d) RSS per idle connection: broker RSS after M CONNECTed idle clients (M = 10,000 in full mode) minus
  before, divided by M, on a freshly started broker.
- One paho-mqtt figure for (a), to show what a typical Python client gets.
- MQTT 5 rows (this broker and Mosquitto; amqtt speaks 3.1.1 only): (a), (b) and (c) again with MQTT 5 clients
  (``v5_*``), and with topic aliases (``v5alias_*``: the publisher sends each topic once, then its alias; each
  subscriber accepts 16 aliases from the broker). Both brokers allow :data:`TOPIC_ALIAS_MAXIMUM` aliases per
  client, so every topic of (b) gets one. An MQTT 5 publisher keeps at most the broker's Receive Maximum
  unacknowledged (Mosquitto announces its ``max_inflight_messages``), fewer than the 3.1.1 publisher's window.

Strategy: the load generator (:mod:`benchmarks.loadgen`) is one asyncio (uvloop) process using the
project's codec on raw sockets, identical for every broker: the publisher keeps a window of ``WINDOW``
QoS 1 publishes unacknowledged by the broker, and at most ``MAX_UNDELIVERED`` not yet received by a
subscriber (brokers PUBACK on receipt, so without that bound a broker that ingests faster than it
delivers would grow an unbounded queue); subscribers PUBACK everything a read returned in one write.
Latency percentiles come from the send time carried in each payload. A run sends N messages or stops
after ``max_run_s`` (the slow peer), then waits for what was sent; its figures use the messages that
arrived. The broker runs in its own process and competes with the generator for this machine's cores;
generator CPU and the CPU used by every other process during a run are recorded next to each figure
so a reader can see when the generator (or a neighbour) was the limit. Every wait is bounded: a run
that makes no progress for ``STALL_S`` seconds fails that figure, the other figures still run, and
every broker started is stopped.

Run alone: ``python -m benchmarks.broker_bench [--quick] [--systems fanout mosquitto amqtt]``; normally
through ``python -m benchmarks.run``.
"""
from __future__ import annotations

import asyncio
import functools
import gc
import statistics
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Callable, Sequence

import psutil

from .harness.peers import FANOUT_BROKER_CONFIG, INFLIGHT_WINDOW, SYSTEMS, PeerBroker
from .harness.plots import grouped_bars, machine_title, pyplot, save_figure, system_series
from .harness.processes import CLK_TCK, raise_nofile_limit, wait_for_quiet
from .harness.report import at_least, at_most, ratio
from .harness.results import bench_parser, log, log_ratios, result_name, run_header, save_result
from .loadgen import (
    MAX_UNDELIVERED, PAYLOAD_SIZE, STALL_S, WINDOW, LeanClient, Tally, close_all, connect, connect_many,
    paho_1to1, percentile_ms, pubacks, run_async, wait_progress,
)

NAME = "broker_bench"
# Below this many clock ticks of broker CPU in a run, CPU comes from schedstat (ns) instead of
# /proc/<pid>/stat utime+stime (10 ms ticks here).
MIN_CPU_TICKS = 50
WARMUP_MAX_S = 3.0  # warm-up traffic before each measured run stops after this long

TARGETS = {"throughput_vs_mosquitto_min": 0.8, "cpu_us_per_msg_max": 15.0, "rss_per_conn_bytes_max": 6144,
           "v5_cpu_vs_v311_max": 1.1}

# Every figure each system must have (the quick-mode test checks them).
FIGURES: tuple[str, ...] = (
    "throughput_1to1_msg_s", "throughput_1toN_msg_s", "paho_throughput_1to1_msg_s",
    "cpu_us_per_msg_1to1", "cpu_us_per_msg_1toN", "rss_per_conn_bytes",
    "latency_1to1_p50_ms", "latency_1to1_p99_ms", "latency_1toN_p50_ms", "latency_1toN_p99_ms",
)
# The MQTT 5 figures, for the systems that speak it.
V5_SYSTEMS: tuple[str, ...] = ("fanout", "mosquitto")
V5_LABELS: tuple[str, ...] = ("v5_1to1", "v5alias_1to1", "v5_1toN", "v5alias_1toN")
V5_FIGURES: tuple[str, ...] = tuple(f"{kind}_{label}{unit}" for label in V5_LABELS
                                    for kind, unit in (("throughput", "_msg_s"), ("cpu_us_per_msg", "")))
TOPIC_ALIAS_MAXIMUM = 1024  # both brokers: enough for every topic of (b)
SUBSCRIBER_TOPIC_ALIASES = 16  # what an MQTT 5 subscriber accepts from the broker
RATIOS: tuple[str, ...] = (
    "throughput_1to1_vs_mosquitto", "throughput_1toN_vs_mosquitto", "paho_throughput_1to1_vs_mosquitto",
    "cpu_us_per_msg_vs_mosquitto", "cpu_us_per_msg_1toN_vs_mosquitto", "rss_per_conn_vs_mosquitto",
    "throughput_1to1_vs_amqtt", "throughput_1toN_vs_amqtt", "cpu_us_per_msg_vs_amqtt", "rss_per_conn_vs_amqtt",
    *(f"{kind}_{label}_vs_mosquitto" for label in V5_LABELS for kind in ("throughput", "cpu_us_per_msg")),
    *(f"cpu_us_per_msg_{label}_vs_v311" for label in V5_LABELS),
)


@dataclass(frozen=True)
class Sizes:
    """How much load each measurement gets."""

    messages_1to1: int
    messages_1toN: int
    subscribers: int
    idle_connections: int
    paho_messages: int
    warmup: int
    rounds: int  # (a), paho and (b) repeat this often, interleaved over the systems; figures are medians
    max_run_s: float  # a (a)/(b) run stops publishing after this long; its figures use what arrived
    quiet_wait_s: float  # before each measurement, wait up to this long for other CPU load to pass


FULL = Sizes(messages_1to1=200_000, messages_1toN=100_000, subscribers=1_000, idle_connections=10_000,
             paho_messages=20_000, warmup=5_000, rounds=3, max_run_s=20.0, quiet_wait_s=15.0)
QUICK = Sizes(messages_1to1=1_000, messages_1toN=1_000, subscribers=100, idle_connections=300,
              paho_messages=300, warmup=100, rounds=1, max_run_s=20.0, quiet_wait_s=0.0)


def _cpu_busy_s() -> float:
    t = psutil.cpu_times()
    return t.user + t.nice + t.system  # irq/softirq time (loopback TCP) is the benchmark's own


async def _pump(broker: PeerBroker, pub: LeanClient, tally: Tally, count: int, topics: list[bytes],
                label: str, max_s: float | None) -> dict[str, Any]:
    """Send ``count`` messages (fewer if ``max_s`` passes first), wait until all sent are received and
    acknowledged, and measure the run."""
    tally.arm(count)
    gc.disable()
    cpu0, fine0 = broker.cpu_seconds(), broker.cpu_seconds_precise()
    gen0, busy0 = time.process_time(), _cpu_busy_s()
    t0_ns = time.perf_counter_ns()
    try:
        pub.publish(count, topics, tally)
        capped = not await wait_progress(tally.done, lambda: tally.received, max_s=max_s)  # type: ignore[arg-type]
        if capped:
            pub.stop()  # the rest in flight (at most MAX_UNDELIVERED) still has to arrive
            await wait_progress(tally.done, lambda: tally.received)  # type: ignore[arg-type]
        elapsed = (tally.last_ns - t0_ns) / 1e9
        await wait_progress(pub.acked_all, lambda: pub.acked)  # type: ignore[arg-type]
    finally:
        gc.enable()
    cpu, fine1 = broker.cpu_seconds() - cpu0, broker.cpu_seconds_precise()
    fine = fine1 - fine0 if fine0 is not None and fine1 is not None else None
    source = "proc_stat"
    if cpu < MIN_CPU_TICKS / CLK_TCK and fine is not None:
        cpu, source = fine, "schedstat"  # a short run: clock ticks are too coarse
    gen = time.process_time() - gen0
    busy = _cpu_busy_s() - busy0
    n = tally.received
    lat = sorted(tally.latencies_ns)
    capacity = elapsed * (psutil.cpu_count() or 1)
    other = max(0.0, busy - cpu - gen)
    return {
        f"throughput_{label}_msg_s": n / elapsed,
        f"cpu_us_per_msg_{label}": cpu / n * 1e6,
        f"latency_{label}_p50_ms": percentile_ms(lat, 0.50),
        f"latency_{label}_p99_ms": percentile_ms(lat, 0.99),
        f"messages_{label}": n,
        f"time_capped_{label}": capped,
        f"duration_{label}_s": elapsed,
        f"broker_cpu_{label}_s": cpu,
        f"broker_cpu_source_{label}": source,
        f"broker_cpu_schedstat_{label}_s": fine,
        f"generator_cpu_us_per_msg_{label}": gen / n * 1e6,
        f"other_cpu_{label}_s": other,
        f"other_cpu_share_{label}": other / capacity if capacity > 0 else None,
    }


def _version(label: str) -> dict[str, Any]:
    """The LeanClient options of a run label: ``1to1`` (3.1.1), ``v5_1to1`` (MQTT 5), ``v5alias_1to1`` (MQTT 5
    with topic aliases)."""
    if label.startswith("v5alias_"):
        return {"mqtt5": True, "topic_aliases": TOPIC_ALIAS_MAXIMUM}
    return {"mqtt5": label.startswith("v5_")}


async def scenario_1to1(broker: PeerBroker, sizes: Sizes, label: str = "1to1") -> dict[str, Any]:
    """(a) + (c): one publisher, one subscriber, one topic."""
    tally = Tally()
    opts = _version(label)
    sub_opts = {**opts, "topic_aliases": SUBSCRIBER_TOPIC_ALIASES} if opts.get("topic_aliases") else opts
    sub = await connect(broker.host, broker.port, lambda: LeanClient("bench-sub", tally, **sub_opts), STALL_S)
    pub = await connect(broker.host, broker.port, lambda: LeanClient("bench-pub", **opts), STALL_S)
    try:
        await sub.subscribe("bench/one", STALL_S)
        topics = [b"bench/one"]
        await _pump(broker, pub, tally, sizes.warmup, topics, "warmup", WARMUP_MAX_S)
        return await _pump(broker, pub, tally, sizes.messages_1to1, topics, label, sizes.max_run_s)
    finally:
        close_all([pub, sub])


async def scenario_1toN(broker: PeerBroker, sizes: Sizes, label: str = "1toN") -> dict[str, Any]:
    """(b) + (c): one publisher, N subscribers on distinct topics, round robin."""
    tally = Tally()
    n = sizes.subscribers
    progress = [0]
    opts = _version(label)
    sub_opts = {**opts, "topic_aliases": SUBSCRIBER_TOPIC_ALIASES} if opts.get("topic_aliases") else opts
    factories = [lambda i=i: LeanClient(f"bench-sub-{i}", tally, **sub_opts) for i in range(n)]
    subs = await connect_many(broker.host, broker.port, factories, progress)
    clients = list(subs)
    try:
        await asyncio.gather(*(s.subscribe(f"bench/fan/{i}", STALL_S) for i, s in enumerate(subs)))
        pub = await connect(broker.host, broker.port, lambda: LeanClient("bench-pub", **opts), STALL_S)
        clients.append(pub)
        topics = [f"bench/fan/{i}".encode() for i in range(n)]
        await _pump(broker, pub, tally, max(sizes.warmup, n), topics, "warmup", WARMUP_MAX_S)
        return await _pump(broker, pub, tally, sizes.messages_1toN, topics, label, sizes.max_run_s)
    finally:
        close_all(clients)


async def scenario_idle(broker: PeerBroker, sizes: Sizes) -> dict[str, Any]:
    """(d): RSS growth of a fresh broker for M CONNECTed idle clients."""
    m = sizes.idle_connections
    await asyncio.sleep(0.5)
    rss0 = broker.rss_bytes()
    progress = [0]
    t0 = time.monotonic()
    factories = [lambda i=i: LeanClient(f"idle-{i:06d}") for i in range(m)]
    clients = await connect_many(broker.host, broker.port, factories, progress)
    connect_s = time.monotonic() - t0
    try:
        await asyncio.sleep(1.0)
        rss1 = broker.rss_bytes()
        return {
            "rss_per_conn_bytes": (rss1 - rss0) / m,
            "rss_before_bytes": rss0,
            "rss_after_bytes": rss1,
            "idle_connections": m,
            "connects_per_s": m / connect_s,
        }
    finally:
        close_all(clients)


# ---------------------------------------------------------------------------------------------------
# one system, ratios, plot, entry points


def _attempt(system: str, what: str, figures: dict[str, Any], errors: dict[str, str],
             fn: Callable[[], dict[str, Any]]) -> None:
    t0 = time.monotonic()
    try:
        got = fn()
    except Exception as exc:  # one failed figure must not stop the others
        errors[what] = f"{type(exc).__name__}: {exc}"
        log(NAME, f"{system:9s} {what}: FAILED {errors[what]}")
        return
    figures.update(got)
    shown = {k: v for k, v in got.items()
             if k in FIGURES or k in V5_FIGURES or k.startswith(("connects_per_s", "other_cpu_share"))}
    log(NAME, f"{system:9s} {what} ({time.monotonic() - t0:.1f} s): "
         + ", ".join(f"{k}={v:,.2f}" if isinstance(v, float) else f"{k}={v}" for k, v in shown.items()))


def _paho(broker: PeerBroker, sizes: Sizes) -> dict[str, Any]:
    return paho_1to1(broker.host, broker.port, sizes.paho_messages, sizes.max_run_s, broker.cpu_seconds)


def bench_round(system: str, sizes: Sizes) -> dict[str, Any]:
    """One round of (a), paho (a) and (b) on one fresh broker process; errors under ``errors``."""
    figures: dict[str, Any] = {}
    errors: dict[str, str] = {}
    if sizes.quiet_wait_s > 0:
        figures["machine_busy_pct_before"] = wait_for_quiet(sizes.quiet_wait_s)
    try:
        with PeerBroker(system, fanout_config=f"{FANOUT_BROKER_CONFIG}topic_alias_maximum = {TOPIC_ALIAS_MAXIMUM}\n",
                        mosquitto_extra=f"max_topic_alias {TOPIC_ALIAS_MAXIMUM}\n") as broker:
            figures["version"] = broker.version()
            _attempt(system, "1to1", figures, errors, lambda: run_async(scenario_1to1(broker, sizes)))
            _attempt(system, "paho_1to1", figures, errors, lambda: _paho(broker, sizes))
            _attempt(system, "1toN", figures, errors, lambda: run_async(scenario_1toN(broker, sizes)))
            if system in V5_SYSTEMS:
                for label in V5_LABELS:
                    scenario = scenario_1to1 if label.endswith("1to1") else scenario_1toN
                    _attempt(system, label, figures, errors,
                             lambda scenario=scenario, label=label: run_async(scenario(broker, sizes, label)))
    except Exception as exc:  # broker did not start (e.g. Mosquitto not installed)
        errors["broker"] = f"{type(exc).__name__}: {exc}"
        log(NAME, f"{system:9s} FAILED {errors['broker']}")
    if errors:
        figures["errors"] = errors
    return figures


def bench_idle(system: str, sizes: Sizes) -> dict[str, Any]:
    """(d) on a fresh broker process."""
    figures: dict[str, Any] = {}
    errors: dict[str, str] = {}
    try:
        with PeerBroker(system) as broker:
            _attempt(system, "idle", figures, errors, lambda: run_async(scenario_idle(broker, sizes)))
    except Exception as exc:
        errors["broker"] = f"{type(exc).__name__}: {exc}"
        log(NAME, f"{system:9s} FAILED {errors['broker']}")
    if errors:
        figures["errors"] = errors
    return figures


def aggregate(rounds: list[dict[str, Any]], idle: dict[str, Any]) -> dict[str, Any]:
    """One system's figures: the median over rounds of every number, plus each round's FIGURES."""
    out: dict[str, Any] = {}
    keys = list(dict.fromkeys(k for r in rounds for k in r if k != "errors"))
    for key in keys:
        values = [r[key] for r in rounds if key in r and r[key] is not None]
        if not values:
            out[key] = None
        elif all(isinstance(v, bool) for v in values):
            out[key] = any(values)
        elif all(isinstance(v, (int, float)) for v in values):
            out[key] = statistics.median(values)
        else:
            out[key] = values[0]
    out.update({k: v for k, v in idle.items() if k != "errors"})
    for key in FIGURES:
        out.setdefault(key, None)
    out = {k: out[k] for k in sorted(out, key=lambda k: (k not in FIGURES, k not in V5_FIGURES, k))}
    out["rounds"] = [{k: r.get(k) for k in (*FIGURES, *V5_FIGURES) if k in r} for r in rounds]
    errors = {f"round{i + 1}.{k}": v for i, r in enumerate(rounds) for k, v in r.get("errors", {}).items()}
    errors.update({f"idle.{k}": v for k, v in idle.get("errors", {}).items()})
    if errors:
        out["errors"] = errors
    return out


# ratio name -> (figure, peer); each is this broker's figure divided by the peer's.
_RATIO_DEFS: dict[str, tuple[str, str]] = {
    "throughput_1to1_vs_mosquitto": ("throughput_1to1_msg_s", "mosquitto"),
    "throughput_1toN_vs_mosquitto": ("throughput_1toN_msg_s", "mosquitto"),
    "paho_throughput_1to1_vs_mosquitto": ("paho_throughput_1to1_msg_s", "mosquitto"),
    "cpu_us_per_msg_vs_mosquitto": ("cpu_us_per_msg_1to1", "mosquitto"),
    "cpu_us_per_msg_1toN_vs_mosquitto": ("cpu_us_per_msg_1toN", "mosquitto"),
    "rss_per_conn_vs_mosquitto": ("rss_per_conn_bytes", "mosquitto"),
    "throughput_1to1_vs_amqtt": ("throughput_1to1_msg_s", "amqtt"),
    "throughput_1toN_vs_amqtt": ("throughput_1toN_msg_s", "amqtt"),
    "cpu_us_per_msg_vs_amqtt": ("cpu_us_per_msg_1to1", "amqtt"),
    "rss_per_conn_vs_amqtt": ("rss_per_conn_bytes", "amqtt"),
    **{f"{kind}_{label}_vs_mosquitto": (f"{kind}_{label}{unit}", "mosquitto")
       for label in V5_LABELS for kind, unit in (("throughput", "_msg_s"), ("cpu_us_per_msg", ""))},
}


def compute_ratios(systems: dict[str, dict[str, Any]]) -> dict[str, float | None]:
    """This broker's figures divided by each peer's (>1 = higher; for CPU and RSS lower is better).

    A figure measured in rounds gives the median of the per-round ratios (within a round the systems
    run back to back, so a slow drift in background load cancels out); others divide the figures.
    """
    ours = systems.get("fanout", {})
    out: dict[str, float | None] = {}
    for name, (key, peer) in _RATIO_DEFS.items():
        theirs = systems.get(peer, {})
        paired = [ratio(a.get(key), b.get(key), digits=None)
                  for a, b in zip(ours.get("rounds", []), theirs.get("rounds", []))]
        values = [v for v in paired if v is not None]
        out[name] = statistics.median(values) if values else ratio(ours.get(key), theirs.get(key), digits=None)
    for label in V5_LABELS:  # MQTT 5 CPU per message over 3.1.1's, this broker, same round and load shape
        v311 = "cpu_us_per_msg_1to1" if label.endswith("1to1") else "cpu_us_per_msg_1toN"
        paired = [ratio(r.get(f"cpu_us_per_msg_{label}"), r.get(v311), digits=None) for r in ours.get("rounds", [])]
        values = [v for v in paired if v is not None]
        out[f"cpu_us_per_msg_{label}_vs_v311"] = statistics.median(values) if values else None
    return {k: out[k] for k in RATIOS}


def check_targets(systems: dict[str, dict[str, Any]], ratios: dict[str, float | None]) -> dict[str, bool | None]:
    """Issue 2's targets for this broker; None when a figure is missing."""
    ours = systems.get("fanout", {})
    return {
        "throughput_1to1_ge_0.8x_mosquitto": at_least(ratios["throughput_1to1_vs_mosquitto"],
                                                      TARGETS["throughput_vs_mosquitto_min"]),
        "throughput_1toN_ge_0.8x_mosquitto": at_least(ratios["throughput_1toN_vs_mosquitto"],
                                                      TARGETS["throughput_vs_mosquitto_min"]),
        "cpu_us_per_msg_1to1_le_15": at_most(ours.get("cpu_us_per_msg_1to1"), TARGETS["cpu_us_per_msg_max"]),
        "cpu_us_per_msg_1toN_le_15": at_most(ours.get("cpu_us_per_msg_1toN"), TARGETS["cpu_us_per_msg_max"]),
        "rss_per_conn_le_6KiB": at_most(ours.get("rss_per_conn_bytes"), TARGETS["rss_per_conn_bytes_max"]),
        # issue 13: MQTT 5 costs at most 10 % more CPU per message than 3.1.1, and >= 0.8x Mosquitto's MQTT 5
        **{f"cpu_us_per_msg_{label}_le_1.1x_v311": at_most(ratios[f"cpu_us_per_msg_{label}_vs_v311"],
                                                            TARGETS["v5_cpu_vs_v311_max"]) for label in V5_LABELS},
        **{f"throughput_{label}_ge_0.8x_mosquitto": at_least(ratios[f"throughput_{label}_vs_mosquitto"],
                                                             TARGETS["throughput_vs_mosquitto_min"]) for label in V5_LABELS},
    }


def plot(result: dict[str, Any], name: str, out_dir: str | Path | None) -> Path:
    """Grouped bars per scenario per system: throughput, CPU per message, RSS per connection, latency."""
    fig, axes = pyplot().subplots(2, 2, figsize=(16, 8))
    series = functools.partial(system_series, result["systems"])
    p = result["params"]

    n = p["subscribers"]
    v5_groups = ["MQTT 5\n1 -> 1", "MQTT 5 aliases\n1 -> 1", f"MQTT 5\n1 -> {n:,}", f"MQTT 5 aliases\n1 -> {n:,}"]
    grouped_bars(axes[0][0], ["1 -> 1\n(lean client)", f"1 -> {n:,}\n(lean client)", "1 -> 1\n(paho-mqtt)", *v5_groups],
                 series(["throughput_1to1_msg_s", "throughput_1toN_msg_s", "paho_throughput_1to1_msg_s",
                         *(f"throughput_{label}_msg_s" for label in V5_LABELS)]),
                 ylabel="QoS 1 messages / s (log)", log=True,
                 title="End-to-end QoS 1 throughput (higher is better; target fanout >= 0.8x mosquitto)")
    grouped_bars(axes[0][1], ["1 -> 1", f"1 -> {n:,}", *v5_groups],
                 series(["cpu_us_per_msg_1to1", "cpu_us_per_msg_1toN", *(f"cpu_us_per_msg_{label}" for label in V5_LABELS)]),
                 ylabel="broker CPU us / routed message", title="Broker CPU per routed QoS 1 message (lower is better)",
                 target=TARGETS["cpu_us_per_msg_max"], target_label="target 15 us", fmt="{:,.1f}", log=True)
    grouped_bars(axes[1][0], [f"{p['idle_connections']:,} idle connections"], series(["rss_per_conn_bytes"], 1 / 1024),
                 ylabel="KiB RSS / connection", title="Broker RSS per idle connection (lower is better)",
                 target=TARGETS["rss_per_conn_bytes_max"] / 1024, target_label="target 6 KiB", fmt="{:,.1f}")
    grouped_bars(axes[1][1], ["1 -> 1 p50", "1 -> 1 p99", f"1 -> {n:,} p50", f"1 -> {n:,} p99"],
                 series(["latency_1to1_p50_ms", "latency_1to1_p99_ms", "latency_1toN_p50_ms", "latency_1toN_p99_ms"]),
                 ylabel="ms (log)", fmt="{:,.1f}", log=True,
                 title=f"End-to-end latency (<= {p['window']} unacked, <= {p['max_undelivered']} undelivered)")
    machine_title(fig, result, name, "broker and load generator share the machine")
    return save_figure(fig, name, out_dir)


def run(quick: bool = False, *, systems: Sequence[str] = SYSTEMS, out_dir: str | Path | None = None) -> dict[str, Any]:
    """Run every figure for every system; write ``<results>/broker_bench[_quick].json`` and ``.png``.

    Args:
        quick: small numbers (CI smoke), written as ``broker_bench_quick``.
        systems: brokers to measure (default all three).
        out_dir: results folder (default benchmarks/results or ``$FANOUT_BENCH_RESULTS``).

    Returns:
        The result object written to JSON.
    """
    sizes = QUICK if quick else FULL
    name = result_name(NAME, quick, partial=set(systems) != set(SYSTEMS))
    soft, hard = raise_nofile_limit()
    notes = [
        "Each broker runs in its own process on 127.0.0.1 and shares the machine's CPUs with the single "
        "load-generator process; generator CPU per message and CPU used by other processes are recorded "
        "next to each figure.",
        f"Same broker settings where they exist: outbound inflight window {INFLIGHT_WINDOW} per client "
        "(amqtt has none), per-client queues large enough that no QoS 1 message is dropped, no persistence, "
        "TCP_NODELAY (set_tcp_nodelay for Mosquitto).",
        f"(a), paho (a) and (b) run in {sizes.rounds} round(s) interleaved over the systems, each round on a "
        "fresh broker process; figures are medians over rounds (each round's values under 'rounds'); "
        "ratios of such figures are medians of the per-round ratios, so they need not equal the ratio of "
        "the medians; (d) runs once on a fresh broker.",
        f"The publisher keeps {WINDOW} publishes unacknowledged and at most {MAX_UNDELIVERED} undelivered; "
        "latency percentiles are therefore the time a message waits behind up to that many others.",
        f"A (a)/(b)/paho run stops publishing after {sizes.max_run_s:.0f} s (time_capped_* = true) and its "
        "figures use the messages that arrived (messages_*); the same N and cap apply to every system.",
        "other_cpu_share_* is the share of the machine's CPU used by processes other than the broker and "
        "the generator during that run (e.g. other test suites); figures with a high share are noisy.",
    ]
    need = sizes.idle_connections + sizes.subscribers + 100
    if hard < need:
        notes.append(f"RLIMIT_NOFILE hard limit {hard} is below the {need} descriptors needed; "
                     "connection figures will fail")
    pubacks()
    started = time.time()
    result: dict[str, Any] = {
        **run_header(name, quick, started),
        "params": {**asdict(sizes), "window": WINDOW, "max_undelivered": MAX_UNDELIVERED,
                   "payload_bytes": PAYLOAD_SIZE, "qos": 1, "broker_inflight_window": INFLIGHT_WINDOW,
                   "nofile_soft": soft, "nofile_hard": hard, "warmup_max_s": WARMUP_MAX_S,
                   "stall_timeout_s": STALL_S, "generator": "asyncio + uvloop, fanout.mqtt.codec, one process"},
        "targets": TARGETS,
        "notes": notes,
        "systems": {},
    }
    log(NAME, f"mode={result['mode']} systems={list(systems)} sizes={asdict(sizes)}")
    rounds: dict[str, list[dict[str, Any]]] = {s: [] for s in systems}
    for r in range(sizes.rounds):  # interleaved, so slow drifts in background load hit every system
        log(NAME, f"round {r + 1}/{sizes.rounds}")
        for system in systems:
            rounds[system].append(bench_round(system, sizes))
    for system in systems:
        result["systems"][system] = aggregate(rounds[system], bench_idle(system, sizes))
    result["ratios"] = compute_ratios(result["systems"])
    result["targets_met"] = check_targets(result["systems"], result["ratios"])
    save_result(name, result, plot, out_dir, started=started)
    return result


def main(argv: Sequence[str] | None = None) -> int:
    parser = bench_parser(NAME, __doc__)
    parser.add_argument("--systems", nargs="+", choices=SYSTEMS, default=list(SYSTEMS))
    args = parser.parse_args(argv)
    result = run(args.quick, systems=args.systems, out_dir=args.out_dir)
    log_ratios(NAME, result["ratios"])
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
