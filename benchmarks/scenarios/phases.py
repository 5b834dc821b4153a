"""The measured phases shared by ``fanout_bench`` and ``fleet_bench``; each returns a flat dict of figures.

A *target* is either an :class:`~benchmarks.harness.cluster.EmbeddedCluster` (``system == "fanout"``:
requests go through the platform client, one trigger per request) or a
:class:`~benchmarks.harness.peers.PeerBroker` (Mosquitto, amqtt: the naive publisher sends one QoS 1
PUBLISH per vehicle and request). Both expose ``host``, ``port``, ``cpu_seconds()`` and ``rss_bytes()``.

Phases (every wait bounded by a cap and a stall limit; a capped phase reports what arrived):

- :func:`fanout_phase`: N vehicles connect and subscribe, then R requests go to all of them (pipelined,
  or one at a time with ``sequential``), optionally under a heartbeat storm whose server CPU cost is
  measured first in a window without deliveries.
- :func:`ingest_phase`: one trigger naming N VINs of offline vehicles, until its PUBACK.
- :func:`drain_phase`: R requests x N VINs queued while the vehicles are offline, then the vehicles
  come online and the queue drains.
- :func:`storm_phase`: N vehicles connect at once; connect rate and server RSS per connection.

Delivery rates: ``deliveries_per_s`` is unique deliveries / (last arrival - first send) for requests
sent to connected vehicles, and / (last arrival - first arrival) for a drain; ``steady_deliveries_per_s``
is the rate between 10% and 90% of the deliveries (from the fleet's progress samples), which leaves out
the connection ramp and the tail.
"""
from __future__ import annotations

import asyncio
import time
from typing import Any, Awaitable, Callable

from ..harness.cluster import EmbeddedCluster, cpu_delta
from ..harness.processes import processes_for
from ..harness.report import busy_us_per
from .fleet import FleetRun, delivery_window, fleet_options, nearest_rank, request_times, steady_rate, vins_for
from .senders import NaivePublisher, PlatformSender, Sent, raw_trigger

STALL_S = 30.0


def _r(v: float | None, nd: int = 3) -> float | None:
    return None if v is None else round(v, nd)


def _fleet_processes(vehicles: int, at_least: int) -> int:
    """Fleet processes for ``vehicles``: each stays under the descriptor limit (100,000 need 6 here)."""
    return min(processes_for(vehicles, at_least=at_least), vehicles)


def _is_cluster(target: Any) -> bool:
    return isinstance(target, EmbeddedCluster)


def _cpu(target: Any) -> tuple[float, dict[str, float] | None]:
    if _is_cluster(target):
        roles = target.cpu_by_role()
        return sum(roles.values()), roles
    return target.cpu_seconds(), None


async def idle_cpu_rate(target: Any, seconds: float) -> float:
    """Server CPU seconds per second with no load (background: $SYS, Ray heartbeats, ...)."""
    c0, _ = _cpu(target)
    t0 = time.monotonic()
    await asyncio.sleep(seconds)
    c1, _ = _cpu(target)
    return (c1 - c0) / (time.monotonic() - t0)


async def _subscribed(fleet: FleetRun, cap_s: float) -> dict[str, Any]:
    status = await fleet.until("subscribed", fleet.vehicles, max_s=cap_s, stall_s=60.0)
    if status != "done":
        subscribed, errors = fleet.value("subscribed"), fleet.value("connect_errors")
        fleet.stop_quietly()
        kinds = dict(sorted((fleet.summary or {}).get("errors", {}).items(), key=lambda kv: -kv[1])[:5])
        raise RuntimeError(f"{fleet.label}: only {subscribed} of {fleet.vehicles} vehicles subscribed ({status}); "
                           f"connect errors {errors}: {kinds}")
    return {"connected": fleet.value("connected")}


def _delivery_figures(summary: dict[str, Any], fleet: FleetRun, sents: list[Sent], expected: int, status: str,
                      *, drain: bool = False) -> dict[str, Any]:
    sent_us = {s.request_id: s.sent_us for s in sents}
    times = request_times(summary, sent_us)
    window = delivery_window(summary, sent_us)
    unique = summary["unique"]
    rate = None
    if window is not None:
        start = window[1] if drain else window[0]
        rate = unique / (window[2] - start) if window[2] > start else None
    firsts = [t["first_ms"] for t in times.values()]
    acks = [s.ack_s * 1000 for s in sents if s.ack_s is not None]
    lat = summary["latency_ms"]
    return {
        "deliveries": unique,
        "expected_deliveries": expected,
        "complete": unique >= expected,
        "status": status,
        "deliveries_per_s": _r(rate, 1),
        "steady_deliveries_per_s": _r(steady_rate(fleet.samples, "unique", total=unique), 1),
        "delivery_seconds": _r(None if window is None else window[2] - (window[1] if drain else window[0])),
        "first_delivery_p50_ms": _r(nearest_rank(firsts, 0.50)),
        "first_delivery_p99_ms": _r(nearest_rank(firsts, 0.99)),
        "first_delivery_max_ms": _r(max(firsts) if firsts else None),
        "first_delivery_ms_per_request": [_r(f) for f in firsts],
        "latency_p50_ms": lat["p50"], "latency_p90_ms": lat["p90"], "latency_p99_ms": lat["p99"],
        "latency_max_ms": lat["max"],
        "request_ack_p50_ms": _r(nearest_rank(acks, 0.5)), "request_ack_max_ms": _r(max(acks) if acks else None),
        "duplicates": summary["duplicates"]["total"],
        "order_violations": summary["order_violations"],
        "connect_errors": summary["connect_errors"],
        "fleet_cpu_s": summary["cpu_s"],
    }


async def fanout_phase(target: Any, *, vehicles: int, requests: int, vin_prefix: str, cap_s: float,
                       payload_size: int = 256, sequential: bool = False, heartbeat_interval: float = 0.0,
                       hb_window_s: float = 0.0, idle_cpu_per_s: float | None = None, idle_s: float = 0.0,
                       connect_cap_s: float = 300.0, fleet_processes: int = 2, label: str = "fanout",
                       on_send: Callable[[], Awaitable[None]] | None = None) -> dict[str, Any]:
    """R requests to N connected vehicles; see the module docstring.

    ``on_send`` is awaited once the vehicles are ready, just before the measured sending starts (profilers).

    With ``heartbeat_interval`` > 0 and ``hb_window_s`` > 0, the heartbeat cost is measured first over
    ``hb_window_s`` seconds without deliveries (server CPU minus ``idle_cpu_per_s``, per heartbeat). With
    ``idle_s`` > 0 that idle rate is measured here instead, over ``idle_s`` just before the fleet starts:
    the cluster's background (Ray, ``$SYS``, ticks) drifts by a few hundredths of a core between phases,
    which is as much as a small heartbeat load costs, so a rate measured at the start of the run can exceed
    the window's whole CPU. A window whose CPU is not above the idle share gives no figure (and says so),
    never a negative one.
    """
    measure_hb = heartbeat_interval > 0 and hb_window_s > 0
    idle_here = await idle_cpu_rate(target, idle_s) if measure_hb and idle_s > 0 else None
    if idle_here is not None:
        idle_cpu_per_s = idle_here
    vins = vins_for(vin_prefix, vehicles)
    rids = [f"{label}-{i:05d}" for i in range(1, requests + 1)]
    opts = fleet_options(target.host, target.port, vins, processes=_fleet_processes(vehicles, fleet_processes),
                         heartbeat_interval=heartbeat_interval, expect_order=True, order_ids=rids)
    fleet = FleetRun(opts, label).start()
    out: dict[str, Any] = {"vehicles": vehicles, "requests": requests, "payload_bytes": payload_size,
                           "sequential": sequential}
    if idle_here is not None:
        out["idle_cpu_per_s"] = _r(idle_here, 4)
    try:
        t0 = time.monotonic()
        out.update(await _subscribed(fleet, connect_cap_s))
        out["subscribe_all_s"] = _r(time.monotonic() - t0)
        await fleet.sleep_observed(1.0)  # let the last subscriptions reach the dispatchers
        if measure_hb:
            await fleet.sleep_observed(min(heartbeat_interval, 30.0))  # heartbeats spread over the interval
            c0, r0 = _cpu(target)
            h0, t0 = fleet.value("heartbeats"), time.monotonic()
            await fleet.sleep_observed(hb_window_s)
            c1, r1 = _cpu(target)
            h1, dt = fleet.value("heartbeats"), time.monotonic() - t0
            per_hb, error = busy_us_per(c1 - c0, idle_cpu_per_s, dt, h1 - h0, "heartbeats")
            out.update({"heartbeats_per_s": _r((h1 - h0) / dt, 1), "heartbeat_window_s": _r(dt),
                        "server_cpu_heartbeat_window_s": _r(c1 - c0), "server_cpu_us_per_heartbeat": per_hb,
                        "server_cpu_share_heartbeats": _r((c1 - c0) / dt, 3)})
            if error is not None:
                out["heartbeat_cpu_error"] = error
            if r0 is not None and r1 is not None:
                out["cpu_by_role_heartbeat_window_s"] = cpu_delta(r0, r1)
        expected = vehicles * requests
        if on_send is not None:
            await on_send()
        c0, r0 = _cpu(target)
        h0 = fleet.value("heartbeats")
        t_start = time.monotonic()
        capped = False
        if _is_cluster(target):
            async with PlatformSender(target.host, target.port, payload_size=payload_size) as platform:
                sents = []
                for i, rid in enumerate(rids):
                    sents.append(await platform.submit(rid, vins))
                    if sequential:
                        left = cap_s - (time.monotonic() - t_start)
                        st = await fleet.until("unique", (i + 1) * vehicles, max_s=max(0.0, left), stall_s=STALL_S)
                        if st != "done":
                            capped = True
                            break
                await platform.all_acked()
        else:
            async with NaivePublisher(target.host, target.port, payload_size=payload_size) as pub:
                sents, capped = await pub.publish(rids, vins, max_s=cap_s)
            expected = sum(s.vins for s in sents)
        left = max(0.0, cap_s - (time.monotonic() - t_start)) if not capped else 10.0
        status = await fleet.until("unique", expected, max_s=left, stall_s=STALL_S)
        status = "capped" if capped and status == "done" else status
        dt = time.monotonic() - t_start
        c1, r1 = _cpu(target)
        hb = fleet.value("heartbeats") - h0
        summary = fleet.finish()
    except BaseException:
        fleet.stop_quietly()
        raise
    out.update(_delivery_figures(summary, fleet, sents, expected, status))
    per_delivery, error = busy_us_per(c1 - c0, idle_cpu_per_s, dt, out["deliveries"], "deliveries")
    out.update({"server_cpu_s": _r(c1 - c0), "server_cpu_us_per_delivery": per_delivery, "phase_seconds": _r(dt)})
    if error is not None:
        out["delivery_cpu_error"] = error
    if heartbeat_interval > 0:
        out["heartbeats_per_s_during_deliveries"] = _r(hb / dt, 1) if dt > 0 else None
    if r0 is not None and r1 is not None:
        out["cpu_by_role_s"] = cpu_delta(r0, r1)
    return out


async def ingest_phase(cluster: EmbeddedCluster, vins_count: int, *, mode: str, vin_prefix: str,
                       payload_size: int = 256, timeout_s: float = 300.0) -> dict[str, Any]:
    """One trigger naming ``vins_count`` VINs of offline vehicles, until its PUBACK (durable).

    ``mode``: ``raw`` (one PUBLISH; time from its write to its PUBACK) or ``client`` (the platform client,
    split into <= 1 MiB PUBLISHes; time from ``submit`` to the last PUBACK).
    """
    vins = vins_for(vin_prefix, vins_count)
    rid = f"{vin_prefix.lower()}-{mode}"
    c0 = cluster.cpu_by_role()
    out: dict[str, Any] = {"vins": vins_count, "mode": mode}
    if mode == "raw":
        got = await raw_trigger(cluster.host, cluster.port, vins, rid, payload_size=payload_size, timeout_s=timeout_s)
        ack_s = got["ack_s"]
        out.update({"trigger_bytes": got["payload_bytes"], "encode_s": _r(got["encode_s"]), "publishes": 1})
    else:
        async with PlatformSender(cluster.host, cluster.port, payload_size=payload_size, ack_timeout_s=timeout_s) as p:
            sent = await p.submit(rid, vins)
            await p.all_acked(timeout_s)
        ack_s = sent.ack_s
        out["publishes"] = sent.chunks
    c1 = cluster.cpu_by_role()
    out.update({"ack_s": _r(ack_s), "rows_per_s": _r(vins_count / ack_s, 1) if ack_s else None,
                "cpu_by_role_s": cpu_delta(c0, c1)})
    return out


async def drain_phase(cluster: EmbeddedCluster, *, vehicles: int, requests: int, vin_prefix: str, cap_s: float,
                      payload_size: int = 256, connect_cap_s: float = 300.0, fleet_processes: int = 2,
                      label: str = "drain", connect_first: bool = False) -> dict[str, Any]:
    """Queue ``requests`` x ``vehicles`` rows while the vehicles are offline, then let them drain.

    With ``connect_first`` the vehicles connect and subscribe first and the rows are queued then: each
    vehicle gets its first row at once and the rest queue behind it. The rate then depends on the queued
    rows and the concurrency only, not on how fast the fleet connects (an offline drain of 10 rows per
    vehicle is over before 1,000 vehicles have connected, so it measured the connect ramp).
    """
    vins = vins_for(vin_prefix, vehicles)
    rids = [f"{label}-{i:05d}" for i in range(1, requests + 1)]
    out: dict[str, Any] = {"vehicles": vehicles, "requests": requests, "queued_rows": vehicles * requests,
                           "connect_first": connect_first}
    opts = fleet_options(cluster.host, cluster.port, vins, processes=_fleet_processes(vehicles, fleet_processes),
                         expect_order=True, order_ids=rids)
    fleet: FleetRun | None = None
    if connect_first:
        fleet = FleetRun(opts, label).start()
        await _subscribed(fleet, connect_cap_s)
        await fleet.sleep_observed(1.0)  # let the last subscriptions reach the dispatchers
        c0 = cluster.cpu_by_role()
    t0 = time.monotonic()
    try:
        async with PlatformSender(cluster.host, cluster.port, payload_size=payload_size, ack_timeout_s=cap_s) as p:
            sents = [await p.submit(rid, vins) for rid in rids]
            await p.all_acked(cap_s)
    except BaseException:
        if fleet is not None:
            fleet.stop_quietly()
        raise
    out["queue_s"] = _r(time.monotonic() - t0)
    out["queue_rows_per_s"] = _r(vehicles * requests / (time.monotonic() - t0), 1)
    if fleet is None:
        c0 = cluster.cpu_by_role()
        fleet = FleetRun(opts, label).start()
        t_start = time.monotonic()
    else:
        t_start = t0
    try:
        status = await fleet.until("unique", vehicles * requests, max_s=cap_s, stall_s=STALL_S)
        dt = time.monotonic() - t_start
        c1 = cluster.cpu_by_role()
        summary = fleet.finish()
    except BaseException:
        fleet.stop_quietly()
        raise
    figures = _delivery_figures(summary, fleet, sents, vehicles * requests, status, drain=True)
    keep = ("deliveries", "expected_deliveries", "complete", "status", "deliveries_per_s", "steady_deliveries_per_s",
            "delivery_seconds", "duplicates", "order_violations", "connect_errors", "fleet_cpu_s")
    out.update({k: figures[k] for k in keep})
    cpu = sum(c1.values()) - sum(c0.values())
    out.update({"server_cpu_s": _r(cpu), "server_cpu_us_per_delivery": _r(cpu / out["deliveries"] * 1e6, 2)
                if out["deliveries"] else None, "phase_seconds": _r(dt), "cpu_by_role_s": cpu_delta(c0, c1),
                "connect_per_s": summary["connect"]["rate_per_s"]})
    return out


async def storm_phase(target: Any, *, vehicles: int, vin_prefix: str, cap_s: float, fleet_processes: int = 2,
                      concurrency: int = 1000, label: str = "storm", idle_hold_s: float = 5.0) -> dict[str, Any]:
    """N vehicles connect at once (no rate limit, ``concurrency`` handshakes in flight per fleet process),
    then stay idle ``idle_hold_s``: the server's CPU while it holds them, and how many are still connected."""
    vins = vins_for(vin_prefix, vehicles)
    await asyncio.sleep(0.5)
    rss0 = target.rss_bytes()
    cluster_rss0 = target.rss_by_role() if _is_cluster(target) else None
    c0, r0 = _cpu(target)
    opts = fleet_options(target.host, target.port, vins, processes=_fleet_processes(vehicles, fleet_processes),
                         connect_concurrency=concurrency, connect_timeout=60.0)
    fleet = FleetRun(opts, label).start()
    out: dict[str, Any] = {"vehicles": vehicles, "concurrency_per_process": concurrency,
                           "fleet_processes": opts.processes,
                           "listener_processes": len(target.pids("node")) if _is_cluster(target) else 1}
    try:
        status = await fleet.until("subscribed", vehicles, max_s=cap_s, stall_s=STALL_S)
        await fleet.sleep_observed(2.0)  # let the server settle (and its allocator return what it can)
        connected = fleet.value("connected")
        rss1 = target.rss_bytes()
        c1, r1 = _cpu(target)
        cluster_rss1 = target.rss_by_role() if _is_cluster(target) else None
        await fleet.sleep_observed(idle_hold_s)
        c2 = target.cpu_seconds()
        out["idle_server_cpu_pct"] = _r((c2 - c1) / idle_hold_s * 100, 1)
        out["connected_after_idle"] = fleet.value("connected")
        summary = fleet.finish()
    except BaseException:
        fleet.stop_quietly()
        raise
    conn = summary["connect"]
    out.update({
        "status": status, "connected": connected, "subscribed": summary["subscribed"],
        "connect_errors": summary["connect_errors"], "connect_error_kinds": dict(list(summary["errors"].items())[:5]),
        "connect_per_s": conn["rate_per_s"], "connect_seconds": conn["seconds"],
        "server_rss_before_bytes": rss0, "server_rss_after_bytes": rss1,
        "rss_per_conn_bytes": _r((rss1 - rss0) / connected, 1) if connected else None,
        "server_cpu_us_per_connect": _r((c1 - c0) / connected * 1e6, 1) if connected else None,
        "fleet_rss_per_conn_bytes": summary["rss"]["per_connection_bytes"],
    })
    if cluster_rss0 is not None and cluster_rss1 is not None and connected:
        out["cluster_rss_per_conn_bytes"] = _r((sum(cluster_rss1.values()) - sum(cluster_rss0.values())) / connected, 1)
        out["rss_by_role_after_bytes"] = cluster_rss1
    if r0 is not None and r1 is not None:
        out["cpu_by_role_s"] = cpu_delta(r0, r1)
    return out


__all__ = ["fanout_phase", "ingest_phase", "drain_phase", "storm_phase", "idle_cpu_rate"]
