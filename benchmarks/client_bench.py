"""Platform client benchmark: submit latency (HOT and COLD) and acknowledged 1,000-VIN submissions/s.

Runs against the project's broker started as a subprocess (``fanout broker --port 0 --config``, through
:class:`~benchmarks.harness.peers.PeerBroker`), on loopback, and writes ``benchmarks/results/client_bench.json``
and ``client_bench.png`` (``client_bench_quick.*`` with ``--quick``).

Phases (bounded, ~30 s in total):

1. ``hot_latency``: ``durability="hybrid"``, connected, paced below capacity so the ring never fills:
   time of each ``await client.submit(...)`` call (accepted into the ring), wall clock, plus the
   submitting thread's CPU time (on a shared 2-core machine the difference is time the OS ran others).
2. ``cold_latency``: ``durability="always"``, one submitter, paced: each ``submit`` returns after the
   outbox commit is fsynced (the COLD accept path; a disconnected hybrid client takes the same path).
3. ``hot_throughput``: submit as fast as the loop allows (yielding once per submission), wait for every
   PUBACK; acknowledged submissions/s = N / (last PUBACK - first submit).
4. ``always_throughput``: the same with ``durability="always"`` and 8 concurrent submitters (group
   commit shares fsyncs).
5. ``disk_fsync``: raw ``fdatasync`` of 4 KiB in the outbox directory, for context: COLD latency cannot
   be better than this disk (an LMDB durable commit is two synchronous writes: data, then meta page).
6. ``cold_latency_tmpfs``: phase 2 with the outbox on ``/dev/shm`` (fsync is free there, so this is
   not durable): the client's own cost of the COLD path, without the disk.

Usage: ``python -m benchmarks.client_bench [--quick]``, or through the runner
``python -m benchmarks.run --only client`` (:func:`run`).
"""
from __future__ import annotations

import asyncio
import functools
import json
import os
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any, Sequence

from .harness.peers import PeerBroker
from .harness.plots import label_bars, pyplot, save_figure
from .harness.results import bench_parser, load_avg, result_name, run_header, save_result

NAME = "client_bench"
# No users: the platform/platform dev login of a loopback listener; no $SYS traffic.
BROKER_CONFIG = '[mqtt]\nsys_interval = "0s"\n'
TARGETS = {"hot_accept_p99_ms": 1.0, "cold_accept_p99_ms": 5.0, "acked_submissions_per_s": 500.0}
VINS = [f"WVWZZZ1JZ{i:08d}" for i in range(1000)]
PAYLOAD = b'{"command":"ota","package":"fw-7.2.1","url":"https://example.invalid/fw"}'


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q / 100 * len(ordered)))]


def summary(lat_s: list[float]) -> dict[str, float]:
    ms = [v * 1000 for v in lat_s]
    return {"n": len(ms), "p50_ms": round(pct(ms, 50), 4), "p90_ms": round(pct(ms, 90), 4), "p99_ms": round(pct(ms, 99), 4),
            "max_ms": round(max(ms), 4), "mean_ms": round(statistics.fmean(ms), 4)}


def client(port: int, outbox: Path, **kw: Any) -> Any:
    from fanout.client import FanoutClient

    return FanoutClient(port=port, username="platform", password="platform", outbox_dir=outbox, **kw)


async def paced_latency(port: int, outbox: Path, n: int, rate: float, durability: str) -> tuple[list[float], dict[str, Any], list[float]]:
    lat: list[float] = []
    cpu: list[float] = []
    async with client(port, outbox, durability=durability) as c:
        interval = 1.0 / rate
        start = time.perf_counter()
        handles = []
        for i in range(n):
            t0, c0 = time.perf_counter(), time.thread_time()
            handles.append(await c.submit(VINS, PAYLOAD, request_id=f"{durability}-lat-{i}"))
            lat.append(time.perf_counter() - t0)
            cpu.append(time.thread_time() - c0)
            delay = start + (i + 1) * interval - time.perf_counter()
            await asyncio.sleep(max(0.0, delay))
        await asyncio.gather(*(h.acked() for h in handles))
        modes = {m: sum(h.mode == m for h in handles) for m in ("hot", "cold")}
    cpu_ms = sorted(v * 1000 for v in cpu)
    # CPU time of the submitting thread: wall minus this is time the OS gave the CPU to someone else
    return lat, {"rate_per_s": rate, "accepted_modes": modes, "thread_cpu_p50_ms": round(pct(cpu_ms, 50), 4),
                 "thread_cpu_p99_ms": round(pct(cpu_ms, 99), 4)}, cpu


async def throughput(port: int, outbox: Path, n: int, durability: str, submitters: int) -> dict[str, Any]:
    async with client(port, outbox, durability=durability) as c:
        per = n // submitters
        t0 = time.perf_counter()

        async def run(k: int) -> list[Any]:
            out = []
            for i in range(per):
                out.append(await c.submit(VINS, PAYLOAD, request_id=f"{durability}-tp-{k}-{i}"))
                await asyncio.sleep(0)
            return out

        groups = await asyncio.gather(*(run(k) for k in range(submitters)))
        accepted = time.perf_counter() - t0
        await asyncio.gather(*(h.acked() for g in groups for h in g))
        elapsed = time.perf_counter() - t0
        commits = c._writer.commits if c._writer else 0
    total = per * submitters
    return {"n": total, "submitters": submitters, "seconds": round(elapsed, 3), "acked_per_s": round(total / elapsed, 1),
            "accept_per_s": round(total / accepted, 1), "outbox_commits": commits}


def disk_fsync(directory: Path, n: int = 200) -> dict[str, float]:
    path = directory / "fsync.probe"
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    lat = []
    try:
        for i in range(n):
            os.pwrite(fd, os.urandom(4096), (i % 16) * 4096)
            t0 = time.perf_counter()
            os.fdatasync(fd)
            lat.append(time.perf_counter() - t0)
    finally:
        os.close(fd)
        path.unlink()
    return summary(lat)


def plot(result: dict[str, Any], name: str, out_dir: str | Path | None, *, curves: dict[str, list[float]]) -> Path:
    """Accept-latency distributions (``curves``: hot, hot_cpu, cold, cold_shm samples in s) and throughput."""
    plt = pyplot()
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(12, 4.5))
    lines = [("HOT (ring), wall", curves["hot"], "tab:red", "-"),
             ("HOT, CPU time of the submitting thread", curves["hot_cpu"], "tab:red", "--"),
             ("COLD (fsynced outbox)", curves["cold"], "tab:blue", "-")]
    if curves["cold_shm"]:
        lines.append(("COLD path on tmpfs (no disk, not durable)", curves["cold_shm"], "tab:gray", "-"))
    for label, lat, color, style in lines:
        ms = sorted(max(v, 1e-6) * 1000 for v in lat)
        ax1.plot(ms, [i / len(ms) for i in range(len(ms))], label=label, color=color, ls=style)
    ax1.axvline(TARGETS["hot_accept_p99_ms"], color="tab:red", ls=":", lw=1, label="HOT p99 target")
    ax1.axvline(TARGETS["cold_accept_p99_ms"], color="tab:blue", ls=":", lw=1, label="COLD p99 target")
    ax1.set_xscale("log")
    ax1.set_xlabel("submit() latency, ms (log)")
    ax1.set_ylabel("fraction of submissions")
    ax1.set_title("accept latency, 1,000-VIN submissions")
    ax1.legend(fontsize=8)
    names = ["hybrid (HOT)", "always (COLD), 8 submitters"]
    values = [result["hot_throughput"]["acked_per_s"], result["always_throughput"]["acked_per_s"]]
    bars = ax2.bar(names, values, color=["tab:red", "tab:blue"])
    ax2.axhline(TARGETS["acked_submissions_per_s"], color="k", ls=":", lw=1, label="target 500/s")
    label_bars(ax2, bars, [f"{v:.0f}/s" for v in values], fontsize=10)
    ax2.set_ylabel("acknowledged submissions/s")
    ax2.set_title("throughput, 1,000 VINs each (fanout broker, loopback)")
    ax2.legend(fontsize=8)
    fig.suptitle(f"sdv-fanout platform client - {result['machine']['logical_cpus']} CPUs, "
                 f"load {result['load_avg_1m_start']}")
    return save_figure(fig, name, out_dir)


async def measure(quick: bool, out_dir: str | Path | None = None) -> dict[str, Any]:
    """Run every phase against a fresh broker; write the JSON and the PNG; returns the result."""
    from fanout import log

    log.configure(json=True, level="warning")
    scale = 0.3 if quick else 1.0
    name = result_name(NAME, quick)
    started = time.time()
    result: dict[str, Any] = {**run_header(name, quick, started), "load_avg_1m_start": load_avg()[0]}
    with (tempfile.TemporaryDirectory(prefix="client-bench-") as d,
          PeerBroker("fanout", fanout_config=BROKER_CONFIG) as broker):
        tmp, port = Path(d), broker.port
        t0 = time.perf_counter()
        hot, hot_info, hot_cpu = await paced_latency(port, tmp / "ob-hot", int(2000 * scale), 400.0, "hybrid")
        cold, cold_info, _ = await paced_latency(port, tmp / "ob-cold", int(1000 * scale), 150.0, "always")
        hot_tp = await throughput(port, tmp / "ob-tp-hot", int(4000 * scale), "hybrid", 1)
        always_tp = await throughput(port, tmp / "ob-tp-always", int(1600 * scale), "always", 8)
        fsync = disk_fsync(tmp)
        shm = Path("/dev/shm")
        cold_shm: list[float] = []
        if shm.is_dir():
            with tempfile.TemporaryDirectory(prefix="client-bench-", dir=shm) as sd:
                cold_shm, _, _ = await paced_latency(port, Path(sd) / "ob", int(1000 * scale), 150.0, "always")
        wall = time.perf_counter() - t0
    result.update({
        "broker": "fanout broker (subprocess, loopback)",
        "transport": "paho-mqtt 2.x on the asyncio loop, MQTT 3.1.1, QoS 1, max_inflight 128",
        "submission": {"vins": len(VINS), "payload_bytes": len(PAYLOAD)},
        "load_avg_1m_end": load_avg()[0],
        "hot_latency": summary(hot) | hot_info,
        "cold_latency": summary(cold) | cold_info,
        "hot_throughput": hot_tp,
        "always_throughput": always_tp,
        "disk_fsync_4k": fsync,
        "cold_latency_tmpfs": summary(cold_shm) if cold_shm else None,
        "targets": TARGETS,
        "wall_s": round(wall, 1),
    })
    result["meets"] = {
        "hot_accept_p99": result["hot_latency"]["p99_ms"] <= TARGETS["hot_accept_p99_ms"],
        "cold_accept_p99": result["cold_latency"]["p99_ms"] <= TARGETS["cold_accept_p99_ms"],
        "acked_submissions_per_s": hot_tp["acked_per_s"] >= TARGETS["acked_submissions_per_s"],
    }
    curves = {"hot": hot, "hot_cpu": hot_cpu, "cold": cold, "cold_shm": cold_shm}
    save_result(name, result, functools.partial(plot, curves=curves), out_dir)
    return result


FIGURES = ("accept_p50_ms", "accept_p99_ms", "thread_cpu_p99_ms", "acked_per_s")


def run(quick: bool = False, *, out_dir: str | Path | None = None) -> dict[str, Any]:
    """Entry point for ``benchmarks.run``: the figures per durability mode plus targets met."""
    r = asyncio.run(measure(quick, out_dir))
    systems = {
        "hybrid (HOT)": {"accept_p50_ms": r["hot_latency"]["p50_ms"], "accept_p99_ms": r["hot_latency"]["p99_ms"],
                         "thread_cpu_p99_ms": r["hot_latency"]["thread_cpu_p99_ms"],
                         "acked_per_s": r["hot_throughput"]["acked_per_s"]},
        "always (COLD)": {"accept_p50_ms": r["cold_latency"]["p50_ms"], "accept_p99_ms": r["cold_latency"]["p99_ms"],
                          "thread_cpu_p99_ms": r["cold_latency"]["thread_cpu_p99_ms"],
                          "acked_per_s": r["always_throughput"]["acked_per_s"]},
    }
    return {"mode": r["mode"], "duration_s": r["wall_s"], "systems": systems, "targets_met": r["meets"],
            "json_path": r["json_path"], "png_path": r["png_path"]}


def main(argv: Sequence[str] | None = None) -> int:
    args = bench_parser(NAME, __doc__, quick_help="30%% of the work (smoke run)").parse_args(argv)
    out = asyncio.run(measure(args.quick, args.out_dir))
    keys = ("hot_latency", "cold_latency", "cold_latency_tmpfs", "hot_throughput", "always_throughput", "disk_fsync_4k",
            "meets", "load_avg_1m_start", "load_avg_1m_end")
    print(json.dumps({k: out[k] for k in keys}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
