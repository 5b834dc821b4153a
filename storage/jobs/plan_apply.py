"""Apply a GC plan to a shard as ordinary WriteBatches of guarded ops, in bounded chunks.

Strategy:
- Replication: the plan becomes plain ``WriteBatch``es (``repoint_ids_if``, ``delete_ids_if``,
  ``delete_reqs_if``, ``delete_blob_if``), so GC goes through the same path as any write: offline
  they are applied to the store directly (``apply_plan``); in the live cluster the Controller ships
  each batch of ``plan_batches`` to the shard's primary, which replicates it like an ingest batch.
- Guards: every op carries the value the row had at the export's watermark and LMDB checks it in
  the write transaction; a row acked, changed or re-queued after the watermark is kept (counted
  ``guard_skipped``). Hence idempotence: a second apply finds nothing that still matches.
- Bounded: ``chunk_ops`` ops per batch (default 50,000: one short write transaction, a few MB on
  the wire), in the plan's order -- repoints, ids deletes, reqs deletes, blob deletes -- and by key
  within a phase, so a crash between two batches never leaves a row pointing at a deleted blob and
  each transaction dirties a narrow key range.
- Resumable: each batch also upserts the metric ``gc/plan_progress`` = ``"<plan_id>:<next chunk>"``
  in the same transaction, so after a crash ``apply_plan`` resumes at the first chunk not
  committed. Chunking is deterministic (same files, same order), and even a full re-run would only
  skip guarded ops.
- Counters: an ``ids`` row deleted because it is past retention or its blob is gone becomes a
  ``settle_ids_if`` op, which also settles the row's pending ``reqs`` row (``expired``, ``discarded``) and so
  moves its request's counters (``storage.request_stats``) in the same transaction; a duplicate's delete is a
  plain ``delete_ids_if`` (the VIN's oldest row stays queued). The later ``delete_reqs_if`` of a row seen
  pending also takes it once settled undelivered, so retention still removes it in the same cycle.
- Topics: the plan's ``topic_prunes`` become ``topic_prune_if`` ops after every other phase (entries are immutable
  and offsets never reused, so the offset bound is the guard: entries appended after the snapshot stay).
- Watermark: a store whose ``applied_seq`` is below the plan's watermark for its shard is not the
  store the snapshot came from (or was restored to an older state): the plan is refused.
"""
from __future__ import annotations

import os
import time
from dataclasses import asdict, dataclass, field
from itertools import repeat
from pathlib import Path
from typing import Any, Callable, Iterator, Mapping

import pyarrow.compute as pc
import pyarrow.dataset as ds
import structlog

from storage import batch as B
from storage import tables
from storage.batch import WriteBatch
from storage.errors import StoreError
from storage.jobs.plan import (ACTIONS, OP_DELETE_BLOB, OP_DELETE_IDS, OP_DELETE_REQS, OP_REPOINT_IDS, PHASES,
                                REASON_EXPIRED, REASON_ORPHAN, read_plan)
from storage.jobs.topic_plan import prune_files
from storage.shard import ShardStore

log = structlog.get_logger(__name__)

DEFAULT_CHUNK_OPS = 50_000
PROGRESS_METRIC = "gc/plan_progress"

_COLUMNS: dict[str, list[str]] = {
    OP_REPOINT_IDS: ["vin", "ts_ms", "request_id", "data_id", "new_data_id"],
    OP_DELETE_IDS: ["vin", "ts_ms", "request_id", "data_id", "reason"],
    OP_DELETE_REQS: ["request_id", "vin", "ts_ms", "status"],
    OP_DELETE_BLOB: ["data_id", "ts_ms"],
}
_OPCODE: dict[str, int] = {
    OP_REPOINT_IDS: B.REPOINT_IDS_IF,
    OP_DELETE_IDS: B.DELETE_IDS_IF,
    OP_DELETE_REQS: B.DELETE_REQS_IF,
    OP_DELETE_BLOB: B.DELETE_BLOB_IF,
}

_SETTLE_STATUS: dict[str, str] = {REASON_EXPIRED: tables.STATUS_EXPIRED, REASON_ORPHAN: tables.STATUS_DISCARDED}
"""What an ``ids`` row deleted for this reason makes of its pending ``reqs`` row (a duplicate: nothing, the
VIN's oldest row of the same blob stays queued)."""

ApplyProgress = Callable[[int, int, int], None]
"""``progress(shard, ops_done, ops_total)``, called after each committed batch."""


class PlanRefusedError(StoreError):
    """The plan does not fit this store (behind the plan's watermark, or another shard)."""


@dataclass(slots=True)
class ApplyInfo:
    """What applying a plan to one shard did."""

    shard: int
    plan_id: str
    batches: int = 0
    ops: int = 0
    counts: dict[str, int] = field(default_factory=dict)
    """Merged ``ApplyResult.counts``: ``deleted``, ``repointed``, ``guard_skipped``, ..."""
    resumed_at_chunk: int = 0
    duration_s: float = 0.0

    @property
    def deleted(self) -> int:
        """Rows and blobs deleted."""
        return self.counts.get("deleted", 0)

    @property
    def repointed(self) -> int:
        """``ids`` rows repointed to a canonical blob."""
        return self.counts.get("repointed", 0)

    @property
    def skipped(self) -> int:
        """Ops whose guard failed (row changed since the watermark, or already applied)."""
        return self.counts.get("guard_skipped", 0)

    def as_dict(self) -> dict[str, Any]:
        """Plain dict (JSON-able)."""
        return asdict(self)


def plan_files(plan_dir: str | os.PathLike[str], shard_id: int) -> list[Path]:
    """The plan's Parquet files for one shard, in name order (empty: nothing to do)."""
    return sorted(Path(plan_dir, ACTIONS, f"shard={shard_id}").glob("*.parquet"))


def plan_batches(
    plan_dir: str | os.PathLike[str],
    shard_id: int,
    *,
    chunk_ops: int = DEFAULT_CHUNK_OPS,
    start_chunk: int = 0,
) -> Iterator[WriteBatch]:
    """The plan of one shard as WriteBatches of at most ``chunk_ops`` guarded ops each.

    Each batch ends with an upsert of ``PROGRESS_METRIC`` (see the module docstring), so batches
    are meant to be applied in order. Ship each to the shard's primary (live cluster) or pass it to
    ``ShardStore.apply`` (offline).

    Args:
        plan_dir: a plan written by ``storage.jobs.plan.compute_plan``.
        shard_id: the shard.
        chunk_ops: most guarded ops per batch.
        start_chunk: skip the first chunks (resume after the last committed one).

    Yields:
        WriteBatch, in apply order.

    Raises:
        ValueError: ``chunk_ops`` < 1. FileNotFoundError: no ``_plan.json`` in ``plan_dir``.
    """
    if chunk_ops < 1:
        raise ValueError(f"chunk_ops must be >= 1, got {chunk_ops}")
    plan = read_plan(plan_dir)
    files = plan_files(plan_dir, shard_id)
    prunes = prune_files(plan_dir, shard_id)
    if not files and not prunes:
        return
    chunk: list[Any] = []
    index = 0
    for op_name, selected in _selections(files, prunes, chunk_ops):
        for record_batch in selected:
            if record_batch.num_rows == 0:
                continue
            chunk.extend(_ops(op_name, [record_batch.column(i).to_pylist() for i in range(record_batch.num_columns)],
                              plan.now_ms))
            while len(chunk) >= chunk_ops:
                if index >= start_chunk:
                    yield _batch(chunk[:chunk_ops], plan.plan_id, index + 1, plan.now_ms)
                del chunk[:chunk_ops]
                index += 1
    if chunk and index >= start_chunk:
        yield _batch(chunk, plan.plan_id, index + 1, plan.now_ms)


def apply_plan(
    store: ShardStore,
    plan_dir: str | os.PathLike[str],
    *,
    chunk_ops: int = DEFAULT_CHUNK_OPS,
    resume: bool = True,
    progress: ApplyProgress | None = None,
) -> ApplyInfo:
    """Apply a plan to an open store, batch by batch (offline GC, tests, benchmarks).

    Args:
        store: the shard (its ``shard_id`` selects the plan's part).
        plan_dir: the plan.
        chunk_ops: most ops per batch (one write transaction each).
        resume: skip the chunks this plan already committed (``PROGRESS_METRIC``).
        progress: ``progress(shard, ops_done, ops_total)`` after each batch.

    Returns:
        ``ApplyInfo`` (a shard missing from the plan gives an empty one).

    Raises:
        PlanRefusedError: the store's ``applied_seq`` is below the plan's watermark for the shard.
        StoreError: from ``ShardStore.apply``.
    """
    plan = read_plan(plan_dir)
    mark = plan.watermarks.get(store.shard_id)
    if mark is None:
        return ApplyInfo(store.shard_id, plan.plan_id)
    if store.applied_seq < int(mark["applied_seq"]):
        raise PlanRefusedError(
            f"shard {store.shard_id} is at seq {store.applied_seq}, below the plan's watermark "
            f"{mark['applied_seq']}: the plan was computed from another (newer) state of this shard"
        )
    start = resume_chunk(store, plan.plan_id) if resume else 0
    return apply_batches(lambda b: store.apply(b).counts, plan_dir, store.shard_id, chunk_ops=chunk_ops,
                         start_chunk=start, progress=progress)


def apply_batches(
    apply_fn: Callable[[WriteBatch], Mapping[str, int]],
    plan_dir: str | os.PathLike[str],
    shard_id: int,
    *,
    chunk_ops: int = DEFAULT_CHUNK_OPS,
    start_chunk: int = 0,
    progress: ApplyProgress | None = None,
) -> ApplyInfo:
    """Feed ``plan_batches`` to ``apply_fn`` (a local ``store.apply`` or a remote primary) in order.

    Args:
        apply_fn: applies one batch and returns its counters (``ApplyResult.counts``).
        plan_dir: the plan.
        shard_id: the shard.
        chunk_ops: most ops per batch.
        start_chunk: first chunk to apply.
        progress: ``progress(shard, ops_done, ops_total)`` after each batch.

    Returns:
        ``ApplyInfo`` with the merged counters.
    """
    plan = read_plan(plan_dir)
    total = sum(plan.counts.get(shard_id, {}).values())
    info = ApplyInfo(shard_id, plan.plan_id, resumed_at_chunk=start_chunk)
    started = time.perf_counter()
    done = min(start_chunk * chunk_ops, total)
    for wb in plan_batches(plan_dir, shard_id, chunk_ops=chunk_ops, start_chunk=start_chunk):
        counts = apply_fn(wb)
        n = len(wb) - 1  # the progress marker is not a plan op
        info.batches += 1
        info.ops += n
        for key, value in counts.items():
            if key != "metric_put":
                info.counts[key] = info.counts.get(key, 0) + int(value)
        done += n
        if progress is not None:
            progress(shard_id, done, total)
    info.duration_s = time.perf_counter() - started
    log.info("gc_plan_applied", shard=shard_id, plan_id=plan.plan_id, batches=info.batches, ops=info.ops,
             counts=info.counts, resumed_at_chunk=start_chunk, duration_s=round(info.duration_s, 3))
    return info


def resume_chunk(store: ShardStore, plan_id: str) -> int:
    """First chunk of ``plan_id`` not yet committed to ``store`` (0 if none or another plan)."""
    for metric in store.get_metrics_all():
        if metric["name"] == PROGRESS_METRIC and isinstance(metric["value"], str):
            pid, _, nxt = metric["value"].partition(":")
            if pid == plan_id and nxt.isdigit():
                return int(nxt)
    return 0


_PRUNE = "topic_prune_if"


def _selections(files: list[Path], prunes: list[Path], chunk_ops: int) -> Iterator[tuple[str, Iterator[Any]]]:
    """``(op name, record batches)`` in apply order: the phases of ``actions``, then the topic prunes."""
    if files:
        dataset = ds.dataset([str(f) for f in files], format="parquet")
        for op_name in PHASES:
            phase = pc.field("phase") == PHASES.index(op_name)
            yield op_name, dataset.to_batches(columns=_COLUMNS[op_name], filter=phase, batch_size=chunk_ops,
                                              use_threads=False)
    if prunes:
        yield _PRUNE, ds.dataset([str(f) for f in prunes], format="parquet").to_batches(
            columns=["topic", "partition", "below_offset"], batch_size=chunk_ops, use_threads=False)


def _ops(op_name: str, cols: list[list[Any]], now_ms: int) -> list[tuple[Any, ...]]:
    if op_name == OP_DELETE_IDS:  # past retention or blob gone: settle the reqs row too (its counters move)
        status_of = _SETTLE_STATUS.get
        return [(B.SETTLE_IDS_IF, vin, ts, rid, did, status, now_ms) if (status := status_of(reason)) is not None
                else (B.DELETE_IDS_IF, vin, ts, rid, did) for vin, ts, rid, did, reason in zip(*cols)]
    if op_name == _PRUNE:
        return [(B.TOPIC_PRUNE_IF, topic, int(partition), int(below)) for topic, partition, below in zip(*cols)]
    return list(zip(repeat(_OPCODE[op_name], len(cols[0])), *cols))  # tuples built by zip, in C


def _batch(ops: list[Any], plan_id: str, next_chunk: int, ts_ms: int) -> WriteBatch:
    # Rows come from this store's own export, so they are valid keys: no per-op builder validation.
    return WriteBatch(ops + [(B.PUT_METRIC, PROGRESS_METRIC, f"{plan_id}:{next_chunk}", ts_ms)])
