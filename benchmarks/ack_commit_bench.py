"""What an acknowledged delivery costs the store, by commit size: CPU and bytes written per ack.

Why: a PUBACK deletes the row's ``ids`` entry and rewrites its ``reqs`` status row, on the primary and again on
the replica. Acks arrive in no particular VIN order, so each one dirties a B-tree page of its own unless a
commit carries enough of them to share pages: the commit size, not the Python around it, decides much of the
cost. The dispatcher's group commit sets that size by itself (the acks that arrive while the previous commit
runs; ~2,300 per commit per shard in ``server_bench``'s fanout, see docs/profile.md). This measures the curve
on one real shard, so that a change of the store's layout can be judged against it.

What it does: a ``ShardStore`` (fsync on commit unless ``--no-sync``) gets ``requests`` requests of ``vins``
VINs each; then every row is acknowledged, in a shuffled VIN order per request, in commits of each size in
turn (a fresh shard per size). Per size: process CPU (user and system) per ack, bytes handed to ``write``
calls per ack (``/proc/self/io`` ``wchar``: the pages LMDB writes at commit, 4 KiB each, plus its meta page),
commits per second. Linux only. Not ``write_bytes``: on this machine's kernel it counts ~200-900 KiB per
4 KiB page rewritten and synced (a plain ``pwrite`` + ``fdatasync`` loop shows the same), so it says
nothing about the store.

    python -m benchmarks.ack_commit_bench [--quick] [--vins 5000] [--requests 10] [--sizes 50 200 1000 5000]
"""
from __future__ import annotations

import random
import resource
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from .harness.plots import machine_title, pyplot, save_figure
from .harness.results import bench_parser, load_avg, log, result_name, run_header, save_result

NAME = "ack_commit_bench"
SIZES = (50, 200, 1000, 5000)
QUICK = {"vins": 300, "requests": 2, "sizes": (10, 100)}
FULL = {"vins": 5000, "requests": 10, "sizes": SIZES}


def _io() -> dict[str, int]:
    with open("/proc/self/io") as f:
        return {k: int(v) for k, v in (line.split(": ") for line in f.read().splitlines() if line)}


def _cpu() -> tuple[float, float]:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime, r.ru_stime


def measure(path: Path, vins: int, requests: int, commit: int, sync: bool) -> dict[str, Any]:
    """Fill one shard at ``path``, then acknowledge every row in commits of ``commit`` acks."""
    from storage import ShardStore, WriteBatch

    names = [f"VIN{i:014d}" for i in range(vins)]
    with ShardStore(path, 0, sync=sync) as store:
        store.apply(WriteBatch().put_blob("d1", b"x" * 256, 1_000))
        for r in range(requests):
            store.apply(WriteBatch().enqueue_many(names, 1_000 + r, f"req-{r:04d}", "d1"))
        batches = []
        for r in range(requests):
            order = names[:]
            random.Random(r).shuffle(order)
            for k in range(0, len(order), commit):
                b = WriteBatch()
                for vin in order[k:k + commit]:
                    b.ack(vin, 1_000 + r, f"req-{r:04d}", 5_000 + r)
                batches.append(b)
        io0, (u0, s0), t0 = _io(), _cpu(), time.perf_counter()
        for b in batches:  # built beforehand: only the apply is measured
            store.apply(b)
        io1, (u1, s1), t1 = _io(), _cpu(), time.perf_counter()
        pending = store.pending_count()
    if pending:  # every ack must have deleted its row, else the figures are of something else
        raise RuntimeError(f"{pending} rows still pending after acknowledging every row")
    acks = vins * requests
    return {"commit": commit, "acks": acks, "commits": len(batches), "seconds": round(t1 - t0, 3),
            "cpu_us_per_ack": round((u1 - u0 + s1 - s0) / acks * 1e6, 2),
            "user_us_per_ack": round((u1 - u0) / acks * 1e6, 2), "sys_us_per_ack": round((s1 - s0) / acks * 1e6, 2),
            "wchar_bytes_per_ack": round((io1["wchar"] - io0["wchar"]) / acks),
            "commits_per_s": round(len(batches) / max(t1 - t0, 1e-9), 1)}


def run(quick: bool = False, *, vins: int | None = None, requests: int | None = None,
        sizes: tuple[int, ...] | None = None, sync: bool = True, data_dir: str | None = None,
        out_dir: str | None = None) -> dict[str, Any]:
    p = QUICK if quick else FULL
    vins, requests, sizes = vins or p["vins"], requests or p["requests"], tuple(sizes or p["sizes"])
    started = time.time()
    name = result_name(NAME, quick)
    result: dict[str, Any] = {**run_header(NAME, quick, started), "vins": vins, "requests": requests,
                              "sync": sync, "load_before": load_avg(), "runs": []}
    root = Path(tempfile.mkdtemp(prefix="ack-commit-", dir=data_dir))
    try:
        for size in sizes:
            one = measure(root / f"c{size}", vins, requests, size, sync)
            log(NAME, f"commit {size:>6,}: {one['cpu_us_per_ack']:.2f} us CPU per ack (sys {one['sys_us_per_ack']:.2f}), "
                      f"{one['wchar_bytes_per_ack']:,} B written per ack")
            result["runs"].append(one)
            shutil.rmtree(root / f"c{size}", ignore_errors=True)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    result["load_after"] = load_avg()
    save_result(name, result, _plot, out_dir, started=started)
    return result


def _plot(result: dict[str, Any], name: str, out_dir: str | None) -> Path:
    plt = pyplot()
    fig, (a, b) = plt.subplots(1, 2, figsize=(10, 4))
    x = [r["commit"] for r in result["runs"]]
    a.plot(x, [r["cpu_us_per_ack"] for r in result["runs"]], "o-", label="CPU (user + sys)")
    a.plot(x, [r["sys_us_per_ack"] for r in result["runs"]], "s--", label="of it sys")
    a.set(xscale="log", xlabel="acks per commit", ylabel="µs per ack", title="store CPU per acknowledged delivery")
    a.legend()
    b.plot(x, [r["wchar_bytes_per_ack"] / 1024 for r in result["runs"]], "o-")
    b.set(xscale="log", yscale="log", xlabel="acks per commit", ylabel="KiB per ack",
          title="bytes written per ack (pages at commit)")
    machine_title(fig, result, name, f"{result['vins']:,} VINs x {result['requests']} requests, "
                                     f"sync={result['sync']}, load {result['load_before'][0]}")
    return save_figure(fig, name, out_dir)


def main(argv: list[str] | None = None) -> int:
    parser = bench_parser(NAME, __doc__)
    parser.add_argument("--vins", type=int, default=None, help=f"VINs per request (default {FULL['vins']:,})")
    parser.add_argument("--requests", type=int, default=None, help=f"requests (default {FULL['requests']})")
    parser.add_argument("--sizes", type=int, nargs="+", default=None, help=f"acks per commit (default {SIZES})")
    parser.add_argument("--no-sync", action="store_true", help="no fsync on commit")
    parser.add_argument("--data-dir", default=None, help="scratch directory (default $TMPDIR)")
    args = parser.parse_args(argv)
    from fanout import log as fanout_log

    fanout_log.configure(level="warning")  # as the dispatchers of a benchmark cluster run (no line per commit)
    result = run(args.quick, vins=args.vins, requests=args.requests, sizes=tuple(args.sizes) if args.sizes else None,
                 sync=not args.no_sync, data_dir=args.data_dir, out_dir=args.out_dir)
    print(f"json: {result['json_path']}\npng: {result['png_path']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
