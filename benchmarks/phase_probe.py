"""One or more fanout_bench phases on a fresh embedded cluster, with the actors' call counters: the quick
loop used while optimising (the full benchmark takes ~15 minutes and waits for quiet between phases).

    python -m benchmarks.phase_probe realtime sequential probe drain_small drain_large profile

Prints one JSON line per phase: the phase figures, the load average before it, server CPU µs per delivery
by role, and from ``fanout status`` the node's and each shard's call counts (events/deliver calls, their
average duration, the node's worst event-loop lag). ``profile`` runs the realtime phase under py-spy and
prints the node's and dispatchers' top frames (``FANOUT_PROFILE_TOP`` sets how many). With
``PHASE_PROBE_DEBUG=1`` the cluster logs at debug level and the ingest timings are printed.
"""
from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from fanout import log as fanout_log

from .harness.cluster import LOG_LEVEL, EmbeddedCluster
from .harness.processes import raise_nofile_limit
from .harness.profiles import finish_profiles, start_profiles
from .harness.results import load_avg
from .scenarios import phases

KEYS = ("deliveries_per_s", "steady_deliveries_per_s", "first_delivery_p50_ms", "first_delivery_p99_ms",
        "first_delivery_ms_per_request", "server_cpu_us_per_delivery", "fleet_cpu_s", "deliveries", "duplicates",
        "order_violations", "queue_s", "ack_s")


def _status(c: EmbeddedCluster) -> Any:
    out = subprocess.run([sys.executable, "-m", "cluster.cli", "status", "--data-dir", str(c.data_dir)],
                         capture_output=True, text=True, timeout=120)
    try:
        st = json.loads(out.stdout)
    except ValueError:
        return (out.stdout + out.stderr)[-500:]
    keep: dict[str, Any] = {}
    for n in st.get("nodes", []):
        keep["node"] = {k: n.get(k) for k in ("deliver_calls", "event_calls", "deliver_ms_avg", "loop_lag_ms_max")}
    for s in st.get("shards", []):
        keep[f"shard{s.get('shard')}"] = {k: s.get(k) for k in ("event_calls", "deliver_calls", "deliver_call_ms_avg",
                                                                  "commits", "sent")}
    return keep


def _phase(c: EmbeddedCluster, what: str) -> dict[str, Any]:
    tag = str(time.time_ns() % 100_000)
    if what == "realtime":
        return asyncio.run(phases.fanout_phase(c, vehicles=10_000, requests=10, vin_prefix=f"RT{tag}", cap_s=180,
                                               label="rt"))
    if what == "sequential":
        return asyncio.run(phases.fanout_phase(c, vehicles=10_000, requests=5, vin_prefix=f"SQ{tag}", cap_s=180,
                                               sequential=True, label="sq"))
    if what == "probe":
        return asyncio.run(phases.fanout_phase(c, vehicles=1, requests=10, vin_prefix=f"PB{tag}", cap_s=60,
                                               sequential=True, fleet_processes=1, label="pb"))
    if what in ("drain_small", "drain_large"):
        n, r = (1_000, 10) if what == "drain_small" else (1_000, 200)
        return asyncio.run(phases.drain_phase(c, vehicles=n, requests=r, vin_prefix=f"D{what[6].upper()}{tag}",
                                              cap_s=400, connect_first=True, label=what[6:]))
    if what == "ingest":
        return asyncio.run(phases.ingest_phase(c, 1_000_000, mode="raw", vin_prefix=f"IR{tag}"))
    if what == "profile":
        c.refresh_pids()
        pids = {"node": c.node_pid, **{f"dispatcher_{i}": p for i, p in enumerate(c.pids("dispatcher"))}}
        started: list[Any] = []
        tmp = Path(tempfile.mkdtemp(prefix="phase-probe-"))

        async def begin() -> None:
            started.extend(start_profiles(pids, 6.0, tmp, rate=97))
            await asyncio.sleep(0.5)

        out = asyncio.run(phases.fanout_phase(c, vehicles=10_000, requests=10, vin_prefix=f"PR{tag}", cap_s=180,
                                              label="pr", on_send=begin))
        out["profile"] = finish_profiles(started)
        return out
    raise SystemExit(f"unknown phase {what!r}")


def main(argv: list[str]) -> None:
    fanout_log.configure(level="warning")
    raise_nofile_limit()
    debug = bool(os.environ.get("PHASE_PROBE_DEBUG"))
    with EmbeddedCluster(log_level="debug" if debug else LOG_LEVEL) as c:
        for what in argv or ["realtime"]:
            load = load_avg()
            r = _phase(c, what)
            d = max(1, r.get("deliveries") or 1)
            cpu = {k: round(1e6 * v / d, 1) for k, v in (r.get("cpu_by_role_s") or {}).items()}
            if debug:
                for line in c.log_lines():
                    if "ingest round" in line or "ingest applied" in line or "ingest head" in line:
                        print(line.strip()[:400])
            print(json.dumps({"phase": what, "loadavg_before": load,
                              **{k: r[k] for k in KEYS if k in r}, "us_per_delivery_by_role": cpu,
                              "status": _status(c), **({"profile": r["profile"]} if "profile" in r else {})}),
                  flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
