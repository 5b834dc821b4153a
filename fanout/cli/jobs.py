"""``fanout export``, ``fanout report`` and offline ``fanout gc``: the Spark maintenance jobs from the shell.

- ``fanout export --out DIR``: Parquet export of every shard (with ``_watermark.json`` per shard).
- ``fanout report [--request ID]``: per-request delivery report (queued, delivered, pending,
  expired, discarded, cancelled, delivery-time percentiles, delivery receipts per status) from a fresh export, or
  from ``--export DIR``.
- :func:`run_offline_gc`: one GC cycle (export, Spark plan, guarded apply) on the ``shard-<k>`` stores of
  a data dir opened in this process, with a progress display and a summary of what was deleted. The
  ``gc`` command itself is registered by :mod:`cluster.cli.gc`, which also offers ``--live`` (through the
  running cluster). Offline GC holds the data dir lock (:mod:`storage.data_dir_lock`) while it runs, so it
  refuses a data dir that ``fanout up`` is serving.

Heavy imports (pyarrow, PySpark) happen inside the commands.
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any


def register(sub: Any) -> None:
    e = sub.add_parser("export", help="export every shard to Parquet with its seq watermark")
    add_data_dir_arguments(e)
    e.add_argument("--out", required=True, help="export directory")
    e.add_argument("--row-group-rows", type=int, default=None, help="rows per Parquet row group")
    e.set_defaults(func=_export)

    r = sub.add_parser("report", help="delivery report per request_id (Spark over an export)")
    add_data_dir_arguments(r)
    r.add_argument("--request", default=None, metavar="ID", help="only this request_id")
    r.add_argument("--export", default=None, metavar="DIR", help="use this export instead of exporting now")
    r.add_argument("--out", default=None, help="also write the report as Parquet under OUT/report")
    r.add_argument("--now-ms", type=int, default=None, help="'now' for pending vs expired (default: the clock)")
    r.add_argument("--json", action="store_true", help="print JSON lines instead of a table")
    r.set_defaults(func=_report)


def add_data_dir_arguments(p: argparse.ArgumentParser) -> None:
    """``--config`` and ``--data-dir`` (read by :func:`load_job_config`)."""
    p.add_argument("--config", default=None, help="TOML config file")
    p.add_argument("--data-dir", default=None, help="root of the LMDB shards (default storage.data_dir)")


def load_job_config(args: argparse.Namespace) -> Any:
    """The config of ``--config`` with ``--data-dir`` as ``storage.data_dir``."""
    from fanout.config import load_config

    return load_config(args.config, overrides={"storage": {"data_dir": args.data_dir}})


# -- gc ----------------------------------------------------------------------------------------------------


def run_offline_gc(args: argparse.Namespace, cfg: Any, console: Any) -> int:
    """One GC cycle on the data dir's stores (``--now-ms``, ``--dry-run``, ``--work-dir``, ``--json``).

    Returns:
        0, or 1 with a message when there are no stores or ``fanout up`` holds the data dir.
    """
    from storage.data_dir_lock import DataDirBusy
    from storage.errors import StoreError
    from storage.jobs.cycle import run_gc_cycle

    data_dir = cfg.storage.data_dir
    try:
        with _Progress(console, enabled=not args.json) as progress:
            summary = run_gc_cycle(data_dir, config=cfg, now_ms=args.now_ms, progress=progress.update,
                                   dry_run=args.dry_run, work_dir=args.work_dir)
    except DataDirBusy as exc:
        print(f"fanout: gc: {exc}. Offline GC writes the stores itself and needs the cluster stopped; "
              f"to collect while it runs: fanout gc --live --data-dir {data_dir}", file=sys.stderr)
        return 1
    except (FileNotFoundError, StoreError) as exc:
        print(f"fanout: gc: {exc}", file=sys.stderr)
        return 1
    if args.json:
        print(json.dumps(summary.as_dict(), indent=2, sort_keys=True, default=str))
    else:
        print_summary(console, summary.as_dict())
    return 0


class _Progress:
    """Rich progress bars fed by ``run_gc_cycle``'s ``progress(stage, done, total)`` callback."""

    _LABELS = {"export": "export shards", "spark": "start Spark", "plan": "Spark plan", "apply": "apply plan"}

    def __init__(self, console: Any, *, enabled: bool = True) -> None:
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

        self._enabled = enabled
        self._bar = Progress(SpinnerColumn(), TextColumn("{task.description:<14}"), BarColumn(), MofNCompleteColumn(),
                             TimeElapsedColumn(), console=console, transient=False, disable=not enabled)
        self._tasks: dict[str, Any] = {}

    def __enter__(self) -> _Progress:
        self._bar.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        self._bar.__exit__(*exc)

    def update(self, stage: str, done: int, total: int) -> None:
        task = self._tasks.get(stage)
        if task is None:
            task = self._tasks[stage] = self._bar.add_task(self._LABELS.get(stage, stage), total=max(total, 1))
        self._bar.update(task, completed=done if total else 1, total=max(total, 1))


def print_summary(console: Any, summary: dict[str, Any]) -> None:
    """Print a GC summary (``GcSummary.as_dict()``) as rich tables."""
    from rich.table import Table

    verb = "would delete (dry run)" if summary.get("dry_run") else "planned"
    plan = Table(title=f"GC plan {summary.get('plan_id', '')[:12]} - cutoff {_iso(summary['cutoff_ms'])}")
    for name in ("op", "reason", verb):
        plan.add_column(name, justify="right" if name == verb else "left")
    for key, n in sorted(summary.get("planned", {}).items()):
        op, _, reason = key.partition("/")
        plan.add_row(op, reason, f"{n:,}")
    if not summary.get("planned"):
        plan.add_row("-", "nothing to collect", "0")
    console.print(plan)
    if summary.get("content_dup_groups"):
        console.print(f"content-duplicate blob groups: {summary['content_dup_groups']:,}")
    if not summary.get("dry_run"):
        applied = Table(title="applied")
        for name in ("shard", "batches", "deleted", "repointed", "kept by guard"):
            applied.add_column(name, justify="right")
        for shard, info in sorted(summary.get("applied", {}).items(), key=lambda kv: int(kv[0])):
            c = info.get("counts", {})
            applied.add_row(str(shard), str(info.get("batches", 0)), f"{c.get('deleted', 0):,}",
                            f"{c.get('repointed', 0):,}", f"{c.get('guard_skipped', 0):,}")
        console.print(applied)
        for shard, why in summary.get("refused", {}).items():
            console.print(f"[yellow]shard {shard}: plan refused: {why}[/yellow]")
    stages = ", ".join(f"{k} {v:.2f}s" for k, v in summary.get("stage_s", {}).items())
    console.print(f"exported {summary.get('exported_rows', 0):,} rows from {len(summary.get('shards', []))} shard(s); "
                  f"deleted {summary.get('deleted', 0):,}, repointed {summary.get('repointed', 0):,}, "
                  f"kept {summary.get('skipped', 0):,}; {stages}")


def _iso(ms: int) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(ms / 1000)) + "Z"


# -- export ------------------------------------------------------------------------------------------------


def _export(args: argparse.Namespace) -> int:
    from rich.console import Console

    from storage.jobs.export import DEFAULT_ROW_GROUP_ROWS

    cfg = load_job_config(args)
    console = Console()
    infos = _export_data_dir(cfg, args.out, "export", row_group_rows=args.row_group_rows or DEFAULT_ROW_GROUP_ROWS,
                             progress=lambda i: console.print(
                                 f"shard {i.shard}: seq {i.applied_seq}, {i.rows} in {i.duration_s:.2f}s"))
    if infos is None:
        return 1
    total = sum(i.total_rows for i in infos.values())
    console.print(f"exported {total:,} rows from {len(infos)} shard(s) to {Path(args.out)}")
    return 0


def _export_data_dir(cfg: Any, out_dir: str, command: str, **export_options: Any) -> dict[int, Any] | None:
    """Export every shard of ``storage.data_dir`` to ``out_dir`` (``export_shards``); None after a message
    naming ``command`` when the stores cannot be opened."""
    from storage.errors import StoreError
    from storage.jobs.cycle import open_shards
    from storage.jobs.export import export_shards

    try:
        stores = open_shards(cfg.storage.data_dir, sync=bool(cfg.storage.sync))
    except (FileNotFoundError, StoreError) as exc:
        print(f"fanout: {command}: {exc}", file=sys.stderr)
        return None
    try:
        return export_shards(stores, out_dir, **export_options)
    finally:
        for store in stores.values():
            store.close()


# -- report ------------------------------------------------------------------------------------------------


def _report(args: argparse.Namespace) -> int:
    from rich.console import Console

    from storage.jobs.cycle import default_work_dir
    from storage.jobs.report import compute_report
    from storage.jobs.spark import get_spark

    cfg = load_job_config(args)
    console = Console()
    export_dir = args.export
    if export_dir is None:
        export_dir = str(default_work_dir(cfg, cfg.storage.data_dir) / "report-snapshot")
        if _export_data_dir(cfg, export_dir, "report") is None:
            return 1
    now_ms = args.now_ms if args.now_ms is not None else int(time.time() * 1000)
    with console.status("Spark: computing the delivery report...", spinner="dots"):
        try:
            rows = compute_report(get_spark(cfg), export_dir, now_ms=now_ms, retention_ms=cfg.fanout.data_retention_ms,
                                  request_id=args.request, out_dir=args.out)
        except ValueError as exc:
            print(f"fanout: report: {exc}", file=sys.stderr)
            return 1
    if args.json:
        for row in rows:
            print(json.dumps(row, sort_keys=True))
    else:
        print_report(console, rows)
    return 0 if rows or args.request is None else 1


def print_report(console: Any, rows: list[dict[str, Any]]) -> None:
    """Print report rows (``compute_report`` output) as a rich table."""
    from rich.table import Table

    table = Table(title="delivery report")
    counted = ("queued", "delivered", "pending", "expired", "discarded", "cancelled")
    receipts = ("receipts_delivered", "receipts_expired", "receipts_discarded", "receipts_cancelled")
    for name in ("request_id", *counted, "p50 ms", "p95 ms", "p99 ms", "receipts d/e/x/c"):
        table.add_column(name, justify="left" if name == "request_id" else "right")
    for r in rows:
        table.add_row(r["request_id"], *(f"{r[k]:,}" for k in counted),
                      *(_ms(r[k]) for k in ("p50_ms", "p95_ms", "p99_ms")),
                      "/".join(f"{r.get(k) or 0:,}" for k in receipts))
    if not rows:
        table.add_row("-", *("0" for _ in counted), "-", "-", "-", "-")
    console.print(table)


def _ms(value: float | None) -> str:
    return "-" if value is None else f"{value:,.1f}"
