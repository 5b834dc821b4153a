"""The GC plan: a Spark job over one export that decides, per shard, which rows to delete or repoint.

Strategy: the plan is computed from snapshots (``storage.jobs.export``), never from the live store,
and it is only a list of *guarded* ops: each action carries the value the row had at the shard's
watermark (``data_id`` of an ``ids`` row, ``ts_ms``/``status`` of a ``reqs`` row, ``ts_ms`` of a
blob's meta). ``storage.jobs.plan_apply`` turns them into ``*_if`` ops, which LMDB checks inside the
write transaction: a row changed, acked or re-queued after the watermark no longer matches and is
kept. So a plan can be late, applied twice, or applied after a crash without harm.

Rules (``cutoff = now_ms - retention_ms``; "older than retention" is ``ts_ms < cutoff``). Each row
gets at most one action; the first rule that matches wins:
1. ``ids`` ``expired``: ``ts_ms < cutoff``.
2. ``ids`` ``orphan``: the row's ``data_id`` has no ``meta`` row in the shard (its blob is gone).
3. ``ids`` ``duplicate``: another live row has the same ``(vin, request_id, data_id)`` and an older
   ``ts_ms``; the oldest live row is kept (it is first in the vehicle's queue). With
   ``dedup_content`` the data id compared is the canonical one of rule 4, so a repoint never creates
   a duplicate that only the next cycle would remove.
4. ``ids`` ``content_duplicate`` (only with ``dedup_content``): the row's blob has the same
   ``(sha1, size)`` as another blob of the shard; it is repointed to the group's canonical data id
   (latest ``meta.ts_ms``, then smallest data id, so the blob that lives longest is kept).
5. ``reqs`` ``expired``: ``ts_ms < cutoff`` (the idempotency record of a request past retention).
6. blob ``expired`` (``meta.ts_ms < cutoff``) or ``content_duplicate`` (non-canonical, with
   ``dedup_content``) -- but never a blob that a row surviving this plan still points at: a young
   pending delivery keeps its blob even when the blob's own ``ts_ms`` is old.
Content-duplicate groups are always reported (``content_dups``), repointed only with
``dedup_content``.
7. durable topics: each partition's log is pruned below the offset its topic's ``retention``/``retention_bytes``
   says (``storage.jobs.topic_plan``); the pruned entries some group had not acknowledged are counted
   (``topic_retention``).

Output (under ``plan_dir``): ``actions/shard=<k>/part-*.parquet`` with ``ACTION_COLUMNS``, one Spark
job per shard (its scans prune to the shard's files). The big scans only go through filters and
broadcast joins, so each file keeps the LMDB key order of the export split it came from (each apply
batch then touches a narrow key range) without sorting millions of rows; the apply reads the
phases in order -- repoints, ids deletes, reqs deletes, blob deletes last, so no row is ever left
pointing at a deleted blob, even after a crash mid-apply. ``content_dups/shard=<k>/`` reports the
groups; ``_plan.json`` (watermarks, cutoff, counts) is written last: no file, no plan.
"""
from __future__ import annotations

import json
import os
import shutil
import time
import uuid
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

import structlog

from storage import tables
from storage.jobs.export import read_export, read_watermarks
from storage.jobs.topic_plan import PRUNE_COUNT_KEY, plan_topic_retention

if TYPE_CHECKING:  # pragma: no cover
    from pyspark.sql import DataFrame, SparkSession

log = structlog.get_logger(__name__)

PLAN_FORMAT = 1
PLAN_FILE = "_plan.json"
ACTIONS = "actions"
CONTENT_DUPS = "content_dups"

OP_REPOINT_IDS = "repoint_ids"
OP_DELETE_IDS = "delete_ids"
OP_DELETE_REQS = "delete_reqs"
OP_DELETE_BLOB = "delete_blob"
PHASES: tuple[str, ...] = (OP_REPOINT_IDS, OP_DELETE_IDS, OP_DELETE_REQS, OP_DELETE_BLOB)
"""Apply order of the ops (``phase`` column = index here)."""

REASON_EXPIRED = "expired"
REASON_ORPHAN = "orphan"
REASON_DUPLICATE = "duplicate"
REASON_CONTENT_DUPLICATE = "content_duplicate"

ACTION_COLUMNS: tuple[str, ...] = (
    "phase", "op", "reason", "vin", "ts_ms", "request_id", "data_id", "new_data_id", "status",
)
"""Columns of ``actions`` (plus the ``shard`` partition column). ``data_id``/``ts_ms``/``status``
hold the values seen at the watermark (the guards); ``new_data_id`` only for repoints."""


_CONTENT_DUPS_SCHEMA = "sha1 string, size long, data_id string, ts_ms long, canonical_data_id string, members long"


@dataclass(frozen=True, slots=True)
class PlanInfo:
    """Summary of a written plan (the content of ``_plan.json``)."""

    plan_id: str
    plan_dir: str
    export_dir: str
    now_ms: int
    cutoff_ms: int
    retention_ms: int
    dedup_content: bool
    watermarks: dict[int, dict[str, Any]] = field(default_factory=dict)
    counts: dict[int, dict[str, int]] = field(default_factory=dict)
    """shard -> ``"<op>/<reason>"`` -> number of actions."""
    content_dup_groups: dict[int, int] = field(default_factory=dict)
    duration_s: float = 0.0
    topic_retention: dict[int, dict[str, int]] = field(default_factory=dict)
    """shard -> durable topics' prunes: ``partitions``, ``entries``, ``bytes``, ``dropped_unconsumed`` (entries
    some consumer group had not acknowledged)."""

    def total(self, op: str | None = None) -> int:
        """Actions in the plan (of one op, e.g. ``"delete_ids"``, or all)."""
        return sum(n for c in self.counts.values() for k, n in c.items() if op is None or k.split("/")[0] == op)

    def as_dict(self) -> dict[str, Any]:
        """Plain dict (JSON-able)."""
        return asdict(self)


def read_plan(plan_dir: str | os.PathLike[str]) -> PlanInfo:
    """Load ``_plan.json`` of a written plan.

    Raises:
        FileNotFoundError: no complete plan there.
    """
    raw = json.loads((Path(plan_dir) / PLAN_FILE).read_text(encoding="utf-8"))
    raw["watermarks"] = {int(k): v for k, v in raw["watermarks"].items()}
    raw["counts"] = {int(k): v for k, v in raw["counts"].items()}
    raw["content_dup_groups"] = {int(k): v for k, v in raw["content_dup_groups"].items()}
    raw["topic_retention"] = {int(k): v for k, v in raw.get("topic_retention", {}).items()}
    raw.pop("format", None)
    return PlanInfo(**raw)


def compute_plan(
    spark: SparkSession,
    export_dir: str | os.PathLike[str],
    plan_dir: str | os.PathLike[str],
    *,
    now_ms: int,
    retention_ms: int,
    dedup_content: bool = False,
    shards: list[int] | None = None,
    plan_id: str | None = None,
) -> PlanInfo:
    """Compute the GC plan of an export and write it (see the module docstring for the rules).

    Every shard is planned on its own (content duplicates are per shard too, as blobs are), so a
    caller may plan shard by shard as their exports finish: pass ``shards`` and, from the second
    call on, the ``plan_id`` returned by the first; ``_plan.json`` then accumulates the shards.

    Args:
        spark: the session to run on.
        export_dir: an export root written by ``export_shard``.
        plan_dir: output directory (replaced unless ``plan_id`` names the plan already in it).
        now_ms: the GC's notion of now (ms since the epoch).
        retention_ms: ``fanout.data_retention_ms``.
        dedup_content: also repoint rows of identical blobs to one canonical blob.
        shards: the shards to plan (default: every completely exported shard).
        plan_id: add these shards to this existing plan.

    Returns:
        ``PlanInfo`` of the whole plan so far, with per-shard counts.

    Raises:
        ValueError: a requested shard (or, by default, every shard) has no complete export, a
            negative retention, or ``plan_id`` does not match the plan in ``plan_dir``.
    """
    if retention_ms < 0:
        raise ValueError(f"retention_ms must be >= 0, got {retention_ms}")
    started = time.perf_counter()
    marks = read_watermarks(export_dir)
    todo = sorted(marks) if shards is None else sorted(shards)
    missing = [k for k in todo if k not in marks]
    if not todo or missing:
        raise ValueError(f"no complete export of shard(s) {missing or 'any'} under {export_dir} (no _watermark.json)")
    cutoff = now_ms - retention_ms
    out = Path(plan_dir)
    if plan_id is None:
        shutil.rmtree(out, ignore_errors=True)
        info = PlanInfo(plan_id=uuid.uuid4().hex, plan_dir=str(out), export_dir=str(export_dir), now_ms=now_ms,
                        cutoff_ms=cutoff, retention_ms=retention_ms, dedup_content=dedup_content)
    else:
        info = read_plan(out)
        if (info.plan_id, info.now_ms, info.retention_ms, info.dedup_content) != (plan_id, now_ms, retention_ms,
                                                                                 dedup_content):
            raise ValueError(f"{out} holds plan {info.plan_id} with other parameters, not plan {plan_id}")
    for k in todo:
        _plan_shard(spark, export_dir, out, k, cutoff, dedup_content)
        info.watermarks[k] = marks[k]
        info.counts[k] = _count(out / ACTIONS, k, ("op", "reason"))
        info.content_dup_groups[k] = len(_count(out / CONTENT_DUPS, k, ("sha1", "size")))
        info.topic_retention[k] = plan_topic_retention(spark, export_dir, out, k, now_ms)
        if info.topic_retention[k]["partitions"]:
            info.counts[k][PRUNE_COUNT_KEY] = info.topic_retention[k]["partitions"]
    info = replace(info, duration_s=info.duration_s + time.perf_counter() - started)
    tmp = out / f".{PLAN_FILE}.tmp"
    tmp.write_text(json.dumps({"format": PLAN_FORMAT, **info.as_dict()}, sort_keys=True), encoding="utf-8")
    os.replace(tmp, out / PLAN_FILE)
    log.info("gc_plan_written", plan_id=info.plan_id, plan_dir=str(out), shards=todo, cutoff_ms=cutoff,
             actions=sum(sum(info.counts[k].values()) for k in todo),
             content_dup_groups=sum(info.content_dup_groups[k] for k in todo),
             topic_entries_pruned=sum(info.topic_retention[k]["entries"] for k in todo),
             topic_dropped_unconsumed=sum(info.topic_retention[k]["dropped_unconsumed"] for k in todo),
             duration_s=round(time.perf_counter() - started, 3))
    return info


def _plan_shard(spark: SparkSession, export_dir: str | os.PathLike[str], out: Path, shard: int, cutoff: int,
                dedup_content: bool) -> None:
    """Write ``content_dups/shard=<k>`` and ``actions/shard=<k>`` (one shard: the scans prune to its files)."""
    ids, reqs, meta = (read_export(spark, export_dir, t, [shard]).drop("shard")
                       for t in (tables.IDS, tables.REQS, tables.META))
    dups_dir = str(out / CONTENT_DUPS / f"shard={shard}")
    _content_dups(meta).write.mode("overwrite").parquet(dups_dir)
    dups = spark.read.schema(_CONTENT_DUPS_SCHEMA).parquet(dups_dir)
    _actions(ids, reqs, meta, dups, cutoff, dedup_content).write.mode("overwrite").parquet(
        str(out / ACTIONS / f"shard={shard}"))


def _count(root: Path, shard: int, columns: tuple[str, ...]) -> dict[str, int]:
    """Rows per distinct ``columns`` value in one shard's Parquet output (read back with pyarrow)."""
    import pyarrow.dataset as ds

    files = sorted(str(f) for f in (root / f"shard={shard}").glob("*.parquet"))
    if not files:
        return {}
    table = ds.dataset(files, format="parquet").to_table(columns=list(columns))
    grouped = table.group_by(list(columns)).aggregate([([], "count_all")]).to_pylist()
    return {"/".join(str(row[c]) for c in columns): int(row["count_all"]) for row in grouped}


def _content_dups(meta: DataFrame) -> DataFrame:
    """Blobs of one shard with identical ``(sha1, size)``: every member and its group's canonical id."""
    from pyspark.sql import Window
    from pyspark.sql import functions as F

    group = Window.partitionBy("sha1", "size")
    ranked = group.orderBy(F.col("ts_ms").desc(), F.col("data_id").asc())
    return (
        meta.withColumn("members", F.count("*").over(group))
        .filter(F.col("members") > 1)
        .withColumn("canonical_data_id", F.first("data_id").over(ranked.rowsBetween(Window.unboundedPreceding, 0)))
        .select("sha1", "size", "data_id", "ts_ms", "canonical_data_id", "members")
    )


def _actions(ids: DataFrame, reqs: DataFrame, meta: DataFrame, dups: DataFrame, cutoff: int,
             dedup_content: bool) -> DataFrame:
    """All actions of one shard (tables without the ``shard`` column).

    Only narrow operations (filters, projections, broadcast joins against small tables) touch the
    big scans, so each output file keeps the key order of the export split it was read from:
    no sort and no shuffle of ``ids``/``reqs`` rows (the duplicate search only groups the rows the
    export flagged ``maybe_dup``).
    """
    from pyspark.sql import functions as F

    col, lit = F.col, F.lit
    null_str = lit(None).cast("string")
    known = meta.select("data_id", lit(True).alias("has_meta"))
    repoint = dups.filter(col("data_id") != col("canonical_data_id")).select(
        "data_id", col("canonical_data_id").alias("canonical"))
    expired = col("ts_ms") < lit(cutoff)
    live = ~expired & col("has_meta").isNotNull()
    rows = ids.join(F.broadcast(known), "data_id", "left")
    if dedup_content:  # rows of a content duplicate count as rows of its canonical blob
        rows = rows.join(F.broadcast(repoint), "data_id", "left")
    else:
        rows = rows.withColumn("canonical", null_str)
    rows = rows.withColumn("content", F.coalesce("canonical", "data_id"))
    same_row = ["vin", "request_id", "content"]
    # duplicates are rare: group only the rows the export flagged (``maybe_dup``: their (vin,
    # request_id) has other rows); Parquet statistics skip the row groups without any flag
    oldest = (rows.filter(col("maybe_dup") & live)
              .groupBy(*same_row).agg(F.min("ts_ms").alias("oldest_live"), F.count("*").alias("n"))
              .filter(col("n") > 1).drop("n"))
    reason = (F.when(expired, lit(REASON_EXPIRED))
              .when(col("has_meta").isNull(), lit(REASON_ORPHAN))
              .when(col("ts_ms") > col("oldest_live"), lit(REASON_DUPLICATE)))
    op = F.when(col("reason").isNotNull(), lit(OP_DELETE_IDS)).when(col("canonical").isNotNull(), lit(OP_REPOINT_IDS))
    ids_actions = (
        rows.join(F.broadcast(oldest), same_row, "left")
        .withColumn("reason", reason)
        .withColumn("op", op)
        .filter(col("op").isNotNull())
        .select(
            F.when(col("op") == OP_DELETE_IDS, lit(PHASES.index(OP_DELETE_IDS)))
            .otherwise(lit(PHASES.index(OP_REPOINT_IDS))).alias("phase"),
            "op", F.coalesce("reason", lit(REASON_CONTENT_DUPLICATE)).alias("reason"),
            "vin", "ts_ms", "request_id", "data_id",
            F.when(col("op") == OP_REPOINT_IDS, col("canonical")).alias("new_data_id"), null_str.alias("status"),
        )
    )
    # a blob stays while a surviving row points at it: the content of every live row (a duplicate
    # never holds the last reference: the oldest row of its group survives)
    referenced = rows.filter(live).select(col("content").alias("data_id")).distinct()
    blob_reason = F.when(col("ts_ms") < lit(cutoff), lit(REASON_EXPIRED))
    blobs = meta
    if dedup_content:
        blobs = blobs.join(F.broadcast(repoint.select("data_id", lit(True).alias("non_canonical"))), "data_id", "left")
        blob_reason = blob_reason.when(col("non_canonical").isNotNull(), lit(REASON_CONTENT_DUPLICATE))
    delete_blobs = (
        blobs.withColumn("reason", blob_reason)
        .filter(col("reason").isNotNull())
        .join(referenced, "data_id", "left_anti")
        .select(
            lit(PHASES.index(OP_DELETE_BLOB)).alias("phase"), lit(OP_DELETE_BLOB).alias("op"), "reason",
            null_str.alias("vin"), "ts_ms", null_str.alias("request_id"), "data_id", null_str.alias("new_data_id"),
            null_str.alias("status"),
        )
    )
    delete_reqs = reqs.filter(expired).select(
        lit(PHASES.index(OP_DELETE_REQS)).alias("phase"), lit(OP_DELETE_REQS).alias("op"),
        lit(REASON_EXPIRED).alias("reason"), "vin", "ts_ms", "request_id", "data_id",
        null_str.alias("new_data_id"), "status",
    )
    return ids_actions.unionByName(delete_reqs).unionByName(delete_blobs)
