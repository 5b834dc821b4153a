"""GC cycle benchmark: export + Spark plan + guarded apply over N ``ids`` rows spread across shards.

``python -m benchmarks.gc_bench [--rows N] [--shards K] [--quick]`` (default 10,000,000 rows over 4
shards; ``--quick``: 100,000), also ``python -m benchmarks.run --only gc``. Writes
``benchmarks/results/gc_bench.json`` and ``gc_bench.png`` (``gc_bench_pipelined.*`` with ``--pipeline``,
``*_quick.*`` with ``--quick``).

Data set (built with ``enqueue_many`` batches of <= 1M VINs, not timed): a fleet of N/5 VINs and five
requests to every VIN (r0, r1 older than the 7-day retention, r2-r4 young; the blob of r4 is a
content duplicate of r3's), plus 0.5% orphan rows (blob never stored) and 0.5% of VINs with a
duplicate pending row (request id re-used A -> B -> A). So a cycle deletes ~40% of ids and reqs rows.

Timed per stage through ``storage.jobs.cycle.run_gc_cycle`` (the code the CLI and the Controller
run): export (rows/s over ids + reqs + meta, and ids rows/s), Spark session start (reported apart:
once per process), plan, apply, one stage after the other as the CLI and the Controller run them;
``--pipeline`` overlaps the shards' stages (export k+1 and apply k during the plan of k / k+1), where
the per-stage busy times add up to more than ``cycle_s``, the wall time of the whole cycle. Targets (issue 5): cycle <= 120 s for 10M ids rows,
export >= 500,000 rows/s. The machine is shared: the load average and the CPU seconds of this
process and of the Spark JVM are recorded (CPU seconds do not depend on the load).
"""
from __future__ import annotations

import os
import shutil
import sys
import time
from pathlib import Path
from typing import Any

from .harness.plots import label_bars, pyplot, save_figure
from .harness.results import bench_parser, load_avg, log, result_name, save_result

NAME = "gc_bench"
DAY = 86_400_000
NOW = 1_800_000_000_000
RETENTION = 7 * DAY
FULL_ROWS = 10_000_000
QUICK_ROWS = 100_000
ENQUEUE_CHUNK = 1_000_000
TARGET_CYCLE_S = 120.0
TARGET_EXPORT_ROWS_S = 500_000
FIGURES = ("ids_rows", "export_s", "export_rows_per_s", "export_ids_rows_per_s", "spark_start_s", "plan_s",
           "apply_s", "apply_ops_per_s", "cycle_s", "stages_sequential_s", "cpu_s_python", "cpu_s_jvm", "deleted",
           "load_avg_1m_start", "load_avg_1m_end")


def build(data_dir: Path, rows: int, shards: int) -> dict[str, Any]:
    """Fill ``shards`` stores under ``data_dir`` with about ``rows`` ids rows (see module docstring)."""
    from storage import ShardStore, WriteBatch, shard_of

    fleet = max(rows // 5, 10)
    vins = [f"VIN{i:014d}" for i in range(fleet)]
    per_shard: dict[int, list[str]] = {k: [] for k in range(shards)}
    for vin in vins:
        per_shard[shard_of(vin, shards)].append(vin)
    odd = max(fleet // 200, 1)  # 0.5% of the fleet
    times = {"r0": NOW - 30 * DAY, "r1": NOW - 10 * DAY, "r2": NOW - 3 * DAY, "r3": NOW - 2 * DAY, "r4": NOW - DAY}
    data = {"r0": "d0", "r1": "d1", "r2": "d2", "r3": "d3", "r4": "d4"}
    blobs = {"d0": b"zero" * 64, "d1": b"one" * 64, "d2": b"two" * 64, "d3": b"three" * 64, "d4": b"three" * 64}
    started = time.perf_counter()
    for k, mine in per_shard.items():
        store = ShardStore(data_dir / f"shard-{k}", k, sync=False, map_size_bytes=1 << 30)
        try:
            batch = WriteBatch()
            for did, blob in blobs.items():
                batch.put_blob(did, blob, NOW - 40 * DAY)
            store.apply(batch)
            for rid, ts in times.items():
                for i in range(0, len(mine), ENQUEUE_CHUNK):
                    store.apply(WriteBatch().enqueue_many(mine[i:i + ENQUEUE_CHUNK], ts, rid, data[rid]))
            few = mine[: max(odd // shards, 1)]
            store.apply(WriteBatch().enqueue_many(few, NOW - 3600_000, "r-orphan", "d-missing"))
            for ts, did in ((NOW - 5000, "d2"), (NOW - 4000, "d3"), (NOW - 3000, "d2")):
                store.apply(WriteBatch().enqueue_many(few, ts, "r-dup", did))
        finally:
            store.close()
    return {"fleet": fleet, "fill_s": time.perf_counter() - started}


def run(quick: bool = False, *, rows: int | None = None, shards: int = 4, data_dir: str | None = None,
        keep: bool = False, pipeline: bool = False, out_dir: str | Path | None = None) -> dict[str, Any]:
    """Build the shards, run one GC cycle, write JSON and PNG; returns the result dict."""
    os.environ.setdefault("FANOUT_LOG_LEVEL", "warning")
    from fanout import log as fanout_log

    fanout_log.configure(level=os.environ["FANOUT_LOG_LEVEL"])
    from fanout.config import load_config
    from storage.jobs.cycle import run_gc_cycle
    from storage.jobs.spark import get_spark

    n = rows or (QUICK_ROWS if quick else FULL_ROWS)
    root = Path(data_dir or Path(os.environ.get("TMPDIR", "/tmp")) / "sdv-gc-bench")
    shutil.rmtree(root, ignore_errors=True)
    root.mkdir(parents=True)
    load_start = load_avg()[0]
    started = time.perf_counter()
    log(NAME, f"building {n:,} ids rows over {shards} shards in {root} ...")
    built = build(root / "data", n, shards)
    log(NAME, f"filled in {built['fill_s']:.1f}s; starting Spark")
    t0 = time.perf_counter()
    spark = get_spark(conf={"spark.driver.memory": "4g"})
    spark_start = time.perf_counter() - t0
    cfg = load_config(None, env={}, overrides={"fanout": {"data_retention": "7d"}})
    last = {"stage": ""}

    def progress(stage: str, done: int, total: int) -> None:
        if stage != last["stage"]:
            last["stage"] = stage
            log(NAME, f"{stage} ...")

    cpu0 = _cpu_seconds()
    summary = run_gc_cycle(root / "data", config=cfg, now_ms=NOW, spark=spark, progress=progress,
                           work_dir=root / "work", pipeline=pipeline)
    cpu1 = _cpu_seconds()
    s = summary.stage_s
    ids_rows = sum(e["rows"]["ids"] for e in summary.exported.values())
    ops = sum(a["ops"] for a in summary.applied.values())
    result: dict[str, Any] = {
        "mode": "quick" if quick else "full",
        "pipeline": pipeline,
        "command": " ".join([sys.executable, "-m", "benchmarks.gc_bench", *sys.argv[1:]]),
        "ids_rows": ids_rows,
        "shards": shards,
        "exported_rows": summary.exported_rows,
        "export_s": round(s["export"], 3),
        "export_rows_per_s": round(summary.exported_rows / s["export"]),
        "export_ids_rows_per_s": round(ids_rows / s["export"]),
        "spark_start_s": round(spark_start + s["spark"], 3),
        "plan_s": round(s["plan"], 3),
        "apply_s": round(s["apply"], 3),
        "apply_ops": ops,
        "apply_ops_per_s": round(ops / s["apply"]) if s["apply"] else None,
        "cycle_s": round(s["total"], 3),
        "cycle_with_spark_start_s": round(s["total"] + spark_start, 3),
        "stages_sequential_s": round(s["export"] + s["plan"] + s["apply"], 3),
        "cpu_s_python": round(cpu1[0] - cpu0[0], 1),
        "cpu_s_jvm": round(cpu1[1] - cpu0[1], 1),
        "planned": summary.planned,
        "deleted": summary.deleted,
        "skipped": summary.skipped,
        "content_dup_groups": summary.content_dup_groups,
        "fill_s": round(built["fill_s"], 3),
        "load_avg_1m_start": load_start,
        "load_avg_1m_end": load_avg()[0],
        "cpus": os.cpu_count(),
        "duration_s": round(time.perf_counter() - started, 1),
    }
    result["targets"] = {"cycle_s": TARGET_CYCLE_S, "export_rows_per_s": TARGET_EXPORT_ROWS_S}
    result["targets_met"] = {"cycle_le_120s": result["cycle_s"] <= TARGET_CYCLE_S,
                             "export_ge_500k_rows_s": result["export_rows_per_s"] >= TARGET_EXPORT_ROWS_S}
    save_result(result_name(f"{NAME}_pipelined" if pipeline else NAME, quick), result, plot, out_dir)
    if not keep:
        shutil.rmtree(root, ignore_errors=True)
    return result


def _cpu_seconds() -> tuple[float, float]:
    """CPU seconds used so far by this process and by its children (the Spark JVM)."""
    import resource

    import psutil

    me = resource.getrusage(resource.RUSAGE_SELF)
    jvm = 0.0
    for child in psutil.Process().children(recursive=True):
        try:
            t = child.cpu_times()
            jvm += t.user + t.system
        except psutil.Error:
            continue
    return me.ru_utime + me.ru_stime, jvm


def plot(result: dict[str, Any], name: str = "gc_bench", out_dir: str | Path | None = None) -> Path:
    """Bar chart of the stage times and the export rate against the targets."""
    plt = pyplot()
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(10, 4), gridspec_kw={"width_ratios": [3, 1]})
    names = ["export", "spark start", "plan", "apply", "cycle"]
    values = [result["export_s"], result["spark_start_s"], result["plan_s"], result["apply_s"], result["cycle_s"]]
    bars = ax1.bar(names, values, color=["#1f77b4", "#bbbbbb", "#ff7f0e", "#2ca02c", "#9467bd"])
    label_bars(ax1, bars, [f"{v:,.1f}s" for v in values])
    ax1.axhline(TARGET_CYCLE_S, color="red", linestyle="--", linewidth=1, label="cycle target 120 s")
    ax1.set_ylabel("seconds")
    mode = "pipelined" if result["pipeline"] else "stage by stage"
    ax1.set_title(f"GC cycle ({mode}), {result['ids_rows']:,} ids rows, {result['shards']} shards "
                  f"(load {result['load_avg_1m_start']}-{result['load_avg_1m_end']} on {result['cpus']} CPUs)",
                  fontsize=9)
    ax1.legend(fontsize=7)
    rate = [result["export_rows_per_s"], result["export_ids_rows_per_s"]]
    bars = ax2.bar(["all tables", "ids only"], rate, color="#1f77b4")
    label_bars(ax2, bars, [f"{v:,.0f}" for v in rate])
    ax2.axhline(TARGET_EXPORT_ROWS_S, color="red", linestyle="--", linewidth=1, label="target 500k rows/s")
    ax2.set_ylabel("export rows/s")
    ax2.legend(fontsize=7)
    return save_figure(fig, name, out_dir)


def main(argv: list[str] | None = None) -> int:
    parser = bench_parser(NAME, __doc__, quick_help=f"{QUICK_ROWS:,} rows")
    parser.add_argument("--rows", type=int, default=None, help=f"ids rows (default {FULL_ROWS:,})")
    parser.add_argument("--shards", type=int, default=4, help="shards (default 4)")
    parser.add_argument("--data-dir", default=None, help="scratch directory (default $TMPDIR/sdv-gc-bench)")
    parser.add_argument("--keep", action="store_true", help="keep the shards and the export afterwards")
    parser.add_argument("--pipeline", action="store_true",
                        help="overlap the shards' stages (default: one stage after the other, exact stage times)")
    args = parser.parse_args(argv)
    result = run(args.quick, rows=args.rows, shards=args.shards, data_dir=args.data_dir, keep=args.keep,
                 pipeline=args.pipeline, out_dir=args.out_dir)
    for key in FIGURES:
        print(f"{key:>24}: {result.get(key)}")
    print(f"{'targets_met':>24}: {result['targets_met']}")
    print(f"{'json':>24}: {result['json_path']}\n{'png':>24}: {result['png_path']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
