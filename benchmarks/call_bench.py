"""What one call between two actors costs: a Ray actor call against the same call over a direct channel.

The measurement behind the direct channels (docs/architecture.md, "Direct channels"): a caller actor awaits
``count`` sequential calls of a callee's async no-op method with one argument of ``size`` bytes, made as Ray
calls (``handle.method.remote``) and through :class:`actors.channels.DirectCalls` (the production channel
path, with the callee's :class:`actors.channels.ServedChannel`), on one local Ray instance. Figures per call:
CPU of the caller's and the callee's processes (``/proc/<pid>/task/*/schedstat``, ns resolution) and wall
time. Both actors are ``num_cpus=0`` async actors like the cluster's; nothing else runs in the Ray instance.

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
SYSTEMS = ("ray_call", "channel")
FIGURES = ("caller_cpu_us", "callee_cpu_us", "total_cpu_us", "wall_us")


def _cpu(pid: int) -> float:
    precise = proc_cpu_seconds_precise(pid)
    return precise if precise is not None else proc_cpu_seconds(pid)


def _actors(ray: Any) -> tuple[Any, Any]:
    from actors.channels import DirectCalls, ServedChannel
    from fanout.config import load_config

    config = load_config(None, env={})

    @ray.remote(num_cpus=0)
    class Callee:
        def __init__(self) -> None:
            self.channel = ServedChannel(config, "bench/callee", {"call": self.call})

        async def call(self, arg: bytes) -> int:
            return len(arg)

        async def channel_address(self) -> tuple[str, int, str]:
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
            if how == "channel":
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

    ray.init(address="local", num_cpus=2, include_dashboard=False, object_store_memory=100 << 20,
             log_to_driver=False, configure_logging=False)
    try:
        callee, caller = _actors(ray)
        pids = ray.get([caller.pid.remote(), callee.pid.remote()])
        out: dict[str, dict[str, float]] = {s: {} for s in SYSTEMS}
        for size in sizes:
            for system in SYSTEMS:
                ray.get(caller.run.remote(system, max(20, count // 10), size))  # warm: connect, caches
                c0, e0, t0 = _cpu(pids[0]), _cpu(pids[1]), time.perf_counter()
                extra = ray.get(caller.run.remote(system, count, size))
                c1, e1, t1 = _cpu(pids[0]), _cpu(pids[1]), time.perf_counter()
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


def plot(result: dict[str, Any], name: str, out_dir: str | Path | None) -> Path:
    plt = pyplot()
    sizes = result["sizes"]
    fig, axes = plt.subplots(1, len(sizes), figsize=(6 * len(sizes), 4.5))
    for ax, size in zip(axes if len(sizes) > 1 else [axes], sizes):
        groups = ["caller CPU", "callee CPU", "wall"]
        series = {s: [result["systems"][s].get(f"{k}_{size}") for k in ("caller_cpu_us", "callee_cpu_us", "wall_us")]
                  for s in SYSTEMS}
        grouped_bars(ax, groups, series, ylabel="µs per call", title=f"One actor call, {size:,} B argument",
                     log=True)
    return save_figure(fig, name, out_dir)


def run(quick: bool = False, *, out_dir: str | Path | None = None) -> dict[str, Any]:
    started = time.time()
    count = 200 if quick else 2000
    result: dict[str, Any] = {**run_header(NAME, quick, started), "count": count, "sizes": list(SIZES),
                              "load_average_start": load_avg()}
    result["systems"] = measure(count)
    result["load_average_end"] = load_avg()
    result["ratios"] = {f"ray_over_channel_total_cpu_{s}": round(result["systems"]["ray_call"][f"total_cpu_us_{s}"]
                                                                 / result["systems"]["channel"][f"total_cpu_us_{s}"], 1)
                        for s in SIZES}
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
