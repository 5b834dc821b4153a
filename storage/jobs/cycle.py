"""One GC cycle: export every shard, compute the plan on Spark, apply it shard by shard.

Strategy: the cycle only orchestrates; each stage is its own module (``export``, ``plan``,
``apply``) and the shards are reached through a small ``GcTarget`` interface, so the same code
runs offline (``LocalShards``: stores opened in this process, e.g. ``fanout gc --data-dir`` on a
stopped cluster) and in the live cluster (the Controller's target asks each shard's Dispatcher to
export its snapshot and ships the plan's WriteBatches to the primary, which replicates them).

Stages run one after the other: every export, then the plan of every shard, then the apply of
every shard. Shards are independent (a plan never relates two shards), so with ``pipeline=True``
Spark plans shard k on a planner thread while this thread exports shard k+1, and shard k is applied
while Spark plans shard k+1. That pays off when Spark runs elsewhere (``gc.spark_master`` on a real
cluster); on the 2-core dev machine the local JVM and the Python stages compete for the same cores
and the pipelined 10M-row cycle was slower (139.7 s against 127.4 s, see benchmarks/gc_bench.py),
hence off by default. A shard's plan always comes from its finished export, and the apply only
issues guarded ops (see ``storage.jobs.plan_apply``), so writes that keep arriving during the cycle are
safe. Per-stage busy times (with ``pipeline`` they overlap and add up to more than the wall time
``total``) and counts come back as a ``GcSummary`` and go to ``<work_dir>/last_gc.json``.
"""
from __future__ import annotations

import json
import os
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Mapping, Protocol, runtime_checkable

import structlog

from storage.batch import WriteBatch
from storage.data_dir_lock import DataDirLock
from storage.jobs.plan_apply import DEFAULT_CHUNK_OPS, ApplyInfo, apply_batches, resume_chunk
from storage.jobs.export import DEFAULT_ROW_GROUP_ROWS, export_shard
from storage.jobs.plan import PlanInfo, compute_plan, read_plan
from storage.shard import ShardStore

if TYPE_CHECKING:  # pragma: no cover
    from pyspark.sql import SparkSession

log = structlog.get_logger(__name__)

GcProgress = Callable[[str, int, int], None]
"""``progress(stage, done, total)``; stages ``export`` (shards), ``spark``, ``plan``, ``apply`` (ops)."""

SNAPSHOT_SUBDIR = "snapshot"
PLAN_SUBDIR = "plan"
SUMMARY_FILE = "last_gc.json"


@runtime_checkable
class GcTarget(Protocol):
    """How a cycle reaches the shards (local stores, or the live cluster's primaries)."""

    def shard_ids(self) -> list[int]:
        """The shards to collect."""
        ...

    def export(self, shard_id: int, out_dir: str) -> dict[str, Any]:
        """Export one shard (``export_shard(...).as_dict()``)."""
        ...

    def applied_seq(self, shard_id: int) -> int:
        """The shard's current ``applied_seq`` (checked against the plan's watermark)."""
        ...

    def apply(self, shard_id: int, batch: WriteBatch) -> Mapping[str, int]:
        """Apply one batch on the shard (its primary) and return the counters."""
        ...


class LocalShards:
    """``GcTarget`` over stores open in this process."""

    def __init__(self, stores: Mapping[int, ShardStore], *, row_group_rows: int = DEFAULT_ROW_GROUP_ROWS) -> None:
        """Args:
        stores: shard id -> open store.
        row_group_rows: export chunk size.
        """
        self.stores = dict(stores)
        self.row_group_rows = row_group_rows

    def shard_ids(self) -> list[int]:
        return sorted(self.stores)

    def export(self, shard_id: int, out_dir: str) -> dict[str, Any]:
        return export_shard(self.stores[shard_id], out_dir, row_group_rows=self.row_group_rows).as_dict()

    def applied_seq(self, shard_id: int) -> int:
        return self.stores[shard_id].applied_seq

    def apply(self, shard_id: int, batch: WriteBatch) -> Mapping[str, int]:
        return self.stores[shard_id].apply(batch).counts

    def resume_chunk(self, shard_id: int, plan_id: str) -> int:
        """First uncommitted chunk of ``plan_id`` on the shard (crash recovery)."""
        return resume_chunk(self.stores[shard_id], plan_id)


class FunctionTarget:
    """``GcTarget`` from plain callables (the Controller wraps its Dispatcher calls in these).

    Example (inside the Controller, off the event loop)::

        FunctionTarget(range(n), export=lambda k, out: ray.get(ds[k].export_snapshot.remote(out)),
                       applied_seq=..., apply=lambda k, b: ray.get(ds[k].apply_batch.remote(b.to_bytes()))["counts"])
    """

    def __init__(
        self,
        shard_ids: Any,
        *,
        export: Callable[[int, str], Any],
        applied_seq: Callable[[int], int],
        apply: Callable[[int, WriteBatch], Mapping[str, int]],
    ) -> None:
        """Args:
        shard_ids: the shards.
        export: ``export(shard_id, out_dir)`` -> ``ExportInfo`` or its dict.
        applied_seq: ``applied_seq(shard_id)`` -> the primary's seq.
        apply: ``apply(shard_id, batch)`` -> counters.
        """
        self._ids = sorted(int(k) for k in shard_ids)
        self._export, self._seq, self._apply = export, applied_seq, apply

    def shard_ids(self) -> list[int]:
        return list(self._ids)

    def export(self, shard_id: int, out_dir: str) -> dict[str, Any]:
        info = self._export(shard_id, out_dir)
        return info.as_dict() if hasattr(info, "as_dict") else dict(info)

    def applied_seq(self, shard_id: int) -> int:
        return int(self._seq(shard_id))

    def apply(self, shard_id: int, batch: WriteBatch) -> Mapping[str, int]:
        return self._apply(shard_id, batch)


@dataclass(slots=True)
class GcSummary:
    """What a cycle did: per-stage seconds, exported rows, planned and applied counts."""

    now_ms: int
    cutoff_ms: int
    retention_ms: int
    dry_run: bool
    work_dir: str
    plan_id: str = ""
    shards: list[int] = field(default_factory=list)
    stage_s: dict[str, float] = field(default_factory=dict)
    """Seconds per stage: ``export``, ``spark`` (session start), ``plan``, ``apply``, ``total``."""
    exported: dict[int, dict[str, Any]] = field(default_factory=dict)
    planned: dict[str, int] = field(default_factory=dict)
    """``"<op>/<reason>"`` -> actions over all shards."""
    content_dup_groups: int = 0
    topic_retention: dict[str, int] = field(default_factory=dict)
    """Durable topics' prunes over all shards: partitions, entries, bytes, dropped_unconsumed."""
    applied: dict[int, dict[str, Any]] = field(default_factory=dict)
    refused: dict[int, str] = field(default_factory=dict)
    """Shards whose plan was not applied, and why."""

    @property
    def exported_rows(self) -> int:
        """Rows exported over all shards and tables."""
        return sum(sum(info["rows"].values()) for info in self.exported.values())

    @property
    def deleted(self) -> int:
        """Rows and blobs deleted by the apply stage."""
        return sum(a["counts"].get("deleted", 0) for a in self.applied.values())

    @property
    def repointed(self) -> int:
        """Rows repointed to a canonical blob."""
        return sum(a["counts"].get("repointed", 0) for a in self.applied.values())

    @property
    def skipped(self) -> int:
        """Planned ops kept by their guard (changed after the snapshot)."""
        return sum(a["counts"].get("guard_skipped", 0) for a in self.applied.values())

    def as_dict(self) -> dict[str, Any]:
        """Plain dict (JSON-able) with the derived totals."""
        out = asdict(self)
        out.update(exported_rows=self.exported_rows, deleted=self.deleted, repointed=self.repointed,
                   skipped=self.skipped)
        return out


def shard_paths(data_dir: str | os.PathLike[str]) -> list[Path]:
    """The ``shard-<k>`` store directories under ``data_dir``, by name.

    Raises:
        FileNotFoundError: no shard directory there.
    """
    paths = sorted(p for p in Path(data_dir).glob("shard-*") if p.is_dir() and p.name[6:].isdigit())
    if not paths:
        raise FileNotFoundError(f"no shard-<k> store under {data_dir}")
    return paths


def open_shards(data_dir: str | os.PathLike[str], **store_options: Any) -> dict[int, ShardStore]:
    """Open every ``shard-<k>`` store under ``data_dir`` (offline GC).

    Raises:
        FileNotFoundError: no shard directory there.
    """
    stores: dict[int, ShardStore] = {}
    paths = shard_paths(data_dir)
    try:
        for path in paths:
            stores[int(path.name[6:])] = ShardStore(path, int(path.name[6:]), **store_options)
    except BaseException:
        for store in stores.values():
            store.close()
        raise
    return stores


def default_work_dir(config: Any, data_dir: str | os.PathLike[str] | None) -> Path:
    """``gc.export_dir`` from the config, else ``<data_dir>/export``."""
    configured = getattr(config.gc, "export_dir", "") if config is not None else ""
    if configured:
        return Path(configured)
    return Path(data_dir if data_dir is not None else config.storage.data_dir) / "export"


def run_gc_cycle(
    shards: Mapping[int, ShardStore] | str | os.PathLike[str] | GcTarget,
    *,
    config: Any,
    now_ms: int | None = None,
    progress: GcProgress | None = None,
    spark: SparkSession | None = None,
    dry_run: bool = False,
    work_dir: str | os.PathLike[str] | None = None,
    chunk_ops: int = DEFAULT_CHUNK_OPS,
    pipeline: bool = False,
) -> GcSummary:
    """Export, plan and apply (unless ``dry_run``) one GC cycle.

    Args:
        shards: open stores by shard id, a data directory of ``shard-<k>`` stores (opened and
            closed here under the data dir lock, so never while ``fanout up`` runs on it), or a
            ``GcTarget`` (the live cluster).
        config: ``fanout.config.Config`` (``fanout.data_retention_ms``, ``gc.*``, ``storage.*``).
        now_ms: the cycle's "now" (default: wall clock).
        progress: ``progress(stage, done, total)`` callback.
        spark: a SparkSession to use (default: ``storage.jobs.spark.get_spark(config)``).
        dry_run: stop after the plan (nothing is deleted).
        work_dir: where the snapshot and the plan go (default ``default_work_dir``).
        chunk_ops: most ops per applied WriteBatch.
        pipeline: overlap the shards' stages (see the module docstring); by default every export
            runs, then every plan, then every apply.

    Returns:
        ``GcSummary``.

    Raises:
        FileNotFoundError: ``shards`` is a directory without shard stores.
        DataDirBusy: ``shards`` is a directory another process holds (a running ``fanout up``).
        StoreError: a shard could not be exported or written.
    """
    if isinstance(shards, (str, os.PathLike)):
        shard_paths(shards)  # a directory without stores is refused before a lock file is created in it
        with DataDirLock(shards, "offline gc"):
            opened = open_shards(shards, sync=bool(config.storage.sync))
            try:
                return _run(LocalShards(opened), config, now_ms, progress, spark, dry_run,
                            _work_dir(config, shards, work_dir), chunk_ops, pipeline)
            finally:
                for store in opened.values():
                    store.close()
    if isinstance(shards, GcTarget):
        return _run(shards, config, now_ms, progress, spark, dry_run, _work_dir(config, None, work_dir), chunk_ops,
                    pipeline)
    paths = {Path(s.path).parent for s in shards.values()}
    return _run(LocalShards(shards), config, now_ms, progress, spark, dry_run,
                _work_dir(config, paths.pop() if len(paths) == 1 else None, work_dir), chunk_ops, pipeline)


def _work_dir(config: Any, data_dir: str | os.PathLike[str] | None, work_dir: str | os.PathLike[str] | None) -> Path:
    return Path(work_dir) if work_dir is not None else default_work_dir(config, data_dir)


def _run(target: GcTarget, config: Any, now_ms: int | None, progress: GcProgress | None,
         spark: SparkSession | None, dry_run: bool, work: Path, chunk_ops: int, pipeline: bool) -> GcSummary:
    report = progress or (lambda stage, done, total: None)
    now = int(time.time() * 1000) if now_ms is None else int(now_ms)
    retention = int(config.fanout.data_retention_ms)
    summary = GcSummary(now_ms=now, cutoff_ms=now - retention, retention_ms=retention, dry_run=dry_run,
                        work_dir=str(work), shards=target.shard_ids())
    summary.stage_s.update(export=0.0, spark=0.0, plan=0.0, apply=0.0)
    snapshot_dir, plan_dir = work / SNAPSHOT_SUBDIR, work / PLAN_SUBDIR
    n = len(summary.shards)
    started = time.perf_counter()
    log.info("gc_cycle_started", now_ms=now, retention_ms=retention, shards=summary.shards, dry_run=dry_run,
             work_dir=str(work))
    planner = ThreadPoolExecutor(max_workers=1, thread_name_prefix="gc-plan")
    state: dict[str, Any] = {"spark": spark, "plan_id": None, "planned": 0}

    def start_spark() -> None:  # on the planner thread, while the first shard is exported
        if state["spark"] is None:
            t = time.perf_counter()
            report("spark", 0, 1)
            from storage.jobs.spark import get_spark

            state["spark"] = get_spark(config)
            summary.stage_s["spark"] = time.perf_counter() - t
        report("spark", 1, 1)

    def plan_shard(shard_id: int) -> PlanInfo:  # on the planner thread, one shard after the other
        if state["spark"] is None:  # start_spark failed: fail here, where the caller sees it
            start_spark()
        t = time.perf_counter()
        info = compute_plan(state["spark"], snapshot_dir, plan_dir, now_ms=now, retention_ms=retention,
                            dedup_content=bool(config.gc.dedup_content), shards=[shard_id], plan_id=state["plan_id"])
        state["plan_id"] = info.plan_id
        summary.stage_s["plan"] += time.perf_counter() - t
        state["planned"] += 1
        report("plan", state["planned"], n)
        return info

    try:
        # pipelined: export shard k+1 (this thread) while Spark plans shard k (planner thread), and
        # apply shard k while Spark plans shard k+1; Spark starts while the first shard is exported
        report("export", 0, n)
        planner.submit(start_spark)
        report("plan", 0, n)
        futures = []
        for i, shard_id in enumerate(summary.shards, 1):
            t = time.perf_counter()
            summary.exported[shard_id] = dict(target.export(shard_id, str(snapshot_dir)))
            summary.stage_s["export"] += time.perf_counter() - t
            report("export", i, n)
            if pipeline:
                futures.append(planner.submit(plan_shard, shard_id))
        if not pipeline:
            futures = [planner.submit(plan_shard, shard_id) for shard_id in summary.shards]
            for future in futures:
                future.result()
        done_ops = 0
        for shard_id, future in zip(summary.shards, futures):
            plan = future.result()
            if not dry_run:
                t = time.perf_counter()
                done_ops = _apply_shard(target, plan, plan_dir, shard_id, summary, report, chunk_ops, done_ops)
                summary.stage_s["apply"] += time.perf_counter() - t
    finally:
        planner.shutdown(wait=True, cancel_futures=True)
    plan = read_plan(plan_dir)
    summary.plan_id = plan.plan_id
    for counts in plan.counts.values():
        for key, count in counts.items():
            summary.planned[key] = summary.planned.get(key, 0) + count
    summary.content_dup_groups = sum(plan.content_dup_groups.values())
    for stats in plan.topic_retention.values():
        for key, value in stats.items():
            summary.topic_retention[key] = summary.topic_retention.get(key, 0) + value
    if dry_run:
        del summary.stage_s["apply"]
    summary.stage_s["total"] = time.perf_counter() - started
    _write_summary(work / SUMMARY_FILE, summary)
    log.info("gc_cycle_done", plan_id=plan.plan_id, dry_run=dry_run, exported_rows=summary.exported_rows,
             planned=summary.planned, deleted=summary.deleted, repointed=summary.repointed,
             skipped=summary.skipped, refused=summary.refused, topic_retention=summary.topic_retention,
             stage_s={k: round(v, 3) for k, v in summary.stage_s.items()})
    return summary


def _apply_shard(target: GcTarget, plan: PlanInfo, plan_dir: Path, shard_id: int, summary: GcSummary,
                 report: GcProgress, chunk_ops: int, done_ops: int) -> int:
    """Apply one shard's part of the plan (unless the shard fell behind its watermark); returns ops done."""
    planned_total = sum(sum(c.values()) for c in plan.counts.values())
    shard_total = sum(plan.counts.get(shard_id, {}).values())
    mark = plan.watermarks[shard_id]
    if shard_total == 0:
        summary.applied[shard_id] = ApplyInfo(shard_id, plan.plan_id).as_dict()
        report("apply", done_ops, planned_total)
        return done_ops
    seq = target.applied_seq(shard_id)
    if seq < int(mark["applied_seq"]):
        summary.refused[shard_id] = f"shard at seq {seq}, below the plan's watermark {mark['applied_seq']}"
        log.warning("gc_plan_refused", shard=shard_id, applied_seq=seq, watermark=mark["applied_seq"])
        return done_ops + shard_total
    start = target.resume_chunk(shard_id, plan.plan_id) if hasattr(target, "resume_chunk") else 0
    info = apply_batches(lambda b: target.apply(shard_id, b), plan_dir, shard_id, chunk_ops=chunk_ops,
                         start_chunk=start,
                         progress=lambda _k, done, _t: report("apply", done_ops + done, planned_total))
    summary.applied[shard_id] = info.as_dict()
    return done_ops + shard_total


def _write_summary(path: Path, summary: GcSummary) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(json.dumps(summary.as_dict(), sort_keys=True, default=str), encoding="utf-8")
    os.replace(tmp, path)
