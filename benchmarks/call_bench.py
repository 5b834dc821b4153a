"""What one call between two actors costs: a Ray actor call against the same call over a direct channel.

The measurement behind the direct channels (docs/architecture.md, "Direct channels"): a caller actor awaits
``count`` sequential calls of a callee's async no-op method with one argument of ``size`` bytes, made as Ray
calls (``handle.method.remote``) and through :class:`actors.channels.DirectCalls` (the production channel
path, with the callee's :class:`actors.channels.ServedChannel`), the latter in plain TCP (``channel``, what a
cluster on one machine uses) and with TLS 1.3 (``channel_tls``, ``cluster.channel_tls = "on"``: what channels
between machines use), on one local Ray instance. Figures per call:
CPU of the caller's and the callee's processes (``/proc/<pid>/task/*/schedstat``, ns resolution) and wall
time. Both actors are ``num_cpus=0`` async actors like the cluster's; nothing else runs in the Ray instance.

It also times the hop from an actor's event loop to its store-writer thread and back, in this process under
uvloop (as in Ray's async actors), for an async no-op job: ``loop.run_in_executor`` on a one-thread
``ThreadPoolExecutor`` against :class:`actors.writer_thread.WriterThread` (``thread_hop`` in the JSON).

    python -m benchmarks.call_bench [--quick] [--out-dir DIR]

Results: ``benchmarks/results/call_bench[_quick].json`` and ``.png``.
"""
from __future__ import annotations

import os
import sys
import time
from pathlib import Path
from typing import Any

from .harness.plots import grouped_bars, pyplot, save_figure
from .harness.processes import proc_cpu_seconds, proc_cpu_seconds_precise
from .harness.results import bench_parser, load_avg, log, result_name, run_header, save_result

NAME = "call_bench"
SIZES = (1024, 32 * 1024)
SYSTEMS = ("ray_call", "channel", "channel_tls")
FIGURES = ("caller_cpu_us", "callee_cpu_us", "total_cpu_us", "wall_us")


def _cpu(pid: int) -> float:
    precise = proc_cpu_seconds_precise(pid)
    return precise if precise is not None else proc_cpu_seconds(pid)


def _actors(ray: Any, tls: bool) -> tuple[Any, Any]:
    from actors.channels import DirectCalls, ServedChannel
    from fanout.config import load_config

    config = load_config(None, env={}).replace("cluster", channel_tls="on" if tls else "off")

    @ray.remote(num_cpus=0)
    class Callee:
        def __init__(self) -> None:
            self.channel = ServedChannel(config, "bench/callee", {"call": self.call})

        async def call(self, arg: bytes) -> int:
            return len(arg)

        async def channel_address(self) -> tuple[str, int, str, bool]:
            return await self.channel.address()

        def pid(self) -> int:
            return os.getpid()

    @ray.remote(num_cpus=0)
    class Caller:
        def __init__(self, callee: Any) -> None:
            self.callee = callee
            self.direct = DirectCalls(config, callee, "bench/callee")

        def pid(self) -> int:
            return os.getpid()

        async def run(self, how: str, count: int, size: int) -> dict[str, float]:
            arg = b"x" * size
            if how != "ray_call":
                call = self.direct.call
                for _ in range(count):
                    await call("call", arg)
                return {"fallbacks": self.direct.fallbacks}
            method = self.callee.call
            for _ in range(count):
                await method.remote(arg)
            return {"fallbacks": 0}

    callee = Callee.remote()
    return callee, Caller.remote(callee)


def measure(count: int, sizes: tuple[int, ...] = SIZES) -> dict[str, dict[str, float]]:
    """``{system: {"<figure>_<size>": value}}`` on a fresh local Ray instance (shut down at the end)."""
    import ray

    from actors.ray_observability import quiet_system_config

    ray.init(address="local", num_cpus=2, include_dashboard=False, object_store_memory=100 << 20,
             log_to_driver=False, configure_logging=False,
             _system_config=quiet_system_config())  # as `fanout up` starts Ray
    try:
        plain, tls = _actors(ray, False), _actors(ray, True)  # (callee, caller) pairs
        pairs = {"ray_call": plain, "channel": plain, "channel_tls": tls}
        pids = {s: ray.get([caller.pid.remote(), callee.pid.remote()]) for s, (callee, caller) in pairs.items()}
        if [ray.get(callee.channel_address.remote())[3] for callee, _ in (plain, tls)] != [False, True]:
            raise RuntimeError("the callees do not speak what cluster.channel_tls says: not a TLS figure")
        out: dict[str, dict[str, float]] = {s: {} for s in SYSTEMS}
        for size in sizes:
            for system in SYSTEMS:
                caller, (c_pid, e_pid) = pairs[system][1], pids[system]
                ray.get(caller.run.remote(system, max(20, count // 10), size))  # warm: connect, caches
                c0, e0, t0 = _cpu(c_pid), _cpu(e_pid), time.perf_counter()
                extra = ray.get(caller.run.remote(system, count, size))
                c1, e1, t1 = _cpu(c_pid), _cpu(e_pid), time.perf_counter()
                if extra["fallbacks"]:
                    raise RuntimeError(f"{extra['fallbacks']} channel calls fell back to Ray: not a channel figure")
                row = {"caller_cpu_us": (c1 - c0) / count * 1e6, "callee_cpu_us": (e1 - e0) / count * 1e6,
                       "wall_us": (t1 - t0) / count * 1e6}
                row["total_cpu_us"] = row["caller_cpu_us"] + row["callee_cpu_us"]
                for k, v in row.items():
                    out[system][f"{k}_{size}"] = round(v, 1)
                log(NAME, f"{system} {size} B: " + ", ".join(f"{k} {v:,.1f}" for k, v in row.items()))
        return out
    finally:
        ray.shutdown()


HOPS = ("run_in_executor", "writer_thread")


def thread_hop(count: int) -> dict[str, dict[str, float]]:
    """``{hop: {"cpu_us", "wall_us"}}`` per no-op job handed from a uvloop loop to one thread and back."""
    import asyncio
    from concurrent.futures import ThreadPoolExecutor

    import uvloop

    from actors.writer_thread import WriterThread

    def noop() -> None:
        return None

    async def main() -> dict[str, dict[str, float]]:
        loop = asyncio.get_running_loop()
        executor, writer = ThreadPoolExecutor(max_workers=1), WriterThread("bench-writer")
        hops = {"run_in_executor": lambda: loop.run_in_executor(executor, noop), "writer_thread": lambda: writer.run(noop)}
        out = {}
        try:
            for name, hop in hops.items():
                for _ in range(max(20, count // 10)):
                    await hop()
                c0, t0 = time.process_time(), time.perf_counter()
                for _ in range(count):
                    await hop()
                out[name] = {"cpu_us": round((time.process_time() - c0) / count * 1e6, 1),
                             "wall_us": round((time.perf_counter() - t0) / count * 1e6, 1)}
                log(NAME, f"thread hop {name}: " + ", ".join(f"{k} {v:,.1f}" for k, v in out[name].items()))
        finally:
            executor.shutdown()
            writer.shutdown()
        return out

    return uvloop.run(main())


def plot(result: dict[str, Any], name: str, out_dir: str | Path | None) -> Path:
    plt = pyplot()
    sizes = result["sizes"]
    hops = result.get("thread_hop")
    fig, axes = plt.subplots(1, len(sizes) + (1 if hops else 0), figsize=(6 * (len(sizes) + 1), 4.5))
    axes = list(axes) if hasattr(axes, "__len__") else [axes]
    for ax, size in zip(axes, sizes):
        groups = ["caller CPU", "callee CPU", "wall"]
        series = {s: [result["systems"][s].get(f"{k}_{size}") for k in ("caller_cpu_us", "callee_cpu_us", "wall_us")]
                  for s in SYSTEMS}
        grouped_bars(ax, groups, series, ylabel="µs per call", title=f"One actor call, {size:,} B argument",
                     log=True)
    if hops:
        grouped_bars(axes[-1], ["CPU", "wall"], {h: [hops[h]["cpu_us"], hops[h]["wall_us"]] for h in HOPS},
                     ylabel="µs per job", title="Event loop -> writer thread -> loop (no-op job)")
    return save_figure(fig, name, out_dir)


def run(quick: bool = False, *, out_dir: str | Path | None = None) -> dict[str, Any]:
    started = time.time()
    count = 200 if quick else 2000
    result: dict[str, Any] = {**run_header(NAME, quick, started), "count": count, "sizes": list(SIZES),
                              "load_average_start": load_avg()}
    result["systems"] = measure(count)
    result["thread_hop"] = thread_hop(count * 5)
    result["load_average_end"] = load_avg()
    systems = result["systems"]
    result["ratios"] = {f"ray_over_channel_total_cpu_{s}": round(systems["ray_call"][f"total_cpu_us_{s}"]
                                                                 / systems["channel"][f"total_cpu_us_{s}"], 1)
                        for s in SIZES}
    result["ratios"].update({f"channel_tls_over_channel_total_cpu_{s}": round(
        systems["channel_tls"][f"total_cpu_us_{s}"] / systems["channel"][f"total_cpu_us_{s}"], 2) for s in SIZES})
    result["command"] = "python -m benchmarks.call_bench" + (" --quick" if quick else "")
    save_result(result_name(NAME, quick), result, plot, out_dir, started=started)
    return result


def main(argv: list[str] | None = None) -> int:
    args = bench_parser(NAME, __doc__).parse_args(argv)
    r = run(args.quick, out_dir=args.out_dir)
    print("ratios:", r["ratios"])
    return 0


if __name__ == "__main__":
    sys.exit(main())
