"""The GC plan: a Spark job over one export that decides, per shard, which rows to delete or repoint.

Strategy: the plan is computed from snapshots (``storage.jobs.export``), never from the live store,
and it is only a list of *guarded* ops: each action carries the value the row had at the shard's
watermark (``data_id`` of an ``ids`` row, ``ts_ms``/``status`` of a ``reqs`` row, ``ts_ms`` of a
blob's meta). ``storage.jobs.apply`` turns them into ``*_if`` ops, which LMDB checks inside the
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

Output (under ``plan_dir``): ``actions/shard=<k>/part-*.parquet`` with ``ACTION_COLUMNS``, each
file sorted by ``phase`` and by LMDB key within a phase (so each apply batch touches a narrow key
range); the apply reads the phases in order -- repoints, ids deletes, reqs deletes, blob deletes
last, so no row is ever left pointing at a deleted blob, even after a crash mid-apply.
``content_dups/shard=<k>/`` reports the groups; ``_plan.json`` (watermarks, cutoff, counts) is
written last: no file, no plan.
"""
from __future__ import annotations

import json
import os
import shutil
import time
import uuid
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import structlog

from storage import tables
from storage.jobs.export import SCHEMAS, read_watermarks, table_dir

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


_CONTENT_DUPS_SCHEMA = (
    "sha1 string, size long, data_id string, ts_ms long, canonical_data_id string, members long, shard int"
)


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
    raw.pop("format", None)
    return PlanInfo(**raw)


def read_export(spark: SparkSession, export_dir: str | os.PathLike[str], table: str, shards: list[int]) -> DataFrame:
    """One exported table of the given shards as a DataFrame with a ``shard`` column.

    Only shards with a watermark are read (a shard without one is an incomplete export).
    """
    from pyspark.sql import types as T

    schema = T.StructType(
        [T.StructField(f.name, T.LongType() if f.type == "int64" else T.StringType()) for f in SCHEMAS[table]]
        + [T.StructField("shard", T.IntegerType())]
    )
    base = Path(export_dir) / table
    paths = [str(table_dir(export_dir, table, k)) for k in shards]
    return spark.read.schema(schema).option("basePath", str(base)).parquet(*paths)


def compute_plan(
    spark: SparkSession,
    export_dir: str | os.PathLike[str],
    plan_dir: str | os.PathLike[str],
    *,
    now_ms: int,
    retention_ms: int,
    dedup_content: bool = False,
) -> PlanInfo:
    """Compute the GC plan of an export and write it (see the module docstring for the rules).

    Args:
        spark: the session to run on.
        export_dir: an export root written by ``export_shard``.
        plan_dir: output directory (replaced).
        now_ms: the GC's notion of now (ms since the epoch).
        retention_ms: ``fanout.data_retention_ms``.
        dedup_content: also repoint rows of identical blobs to one canonical blob.

    Returns:
        ``PlanInfo`` with per-shard counts.

    Raises:
        ValueError: no completely exported shard under ``export_dir``, or a negative retention.
    """
    from pyspark.sql import functions as F

    if retention_ms < 0:
        raise ValueError(f"retention_ms must be >= 0, got {retention_ms}")
    started = time.perf_counter()
    marks = read_watermarks(export_dir)
    if not marks:
        raise ValueError(f"no complete shard export under {export_dir} (no {'_watermark.json'} files)")
    shards = sorted(marks)
    cutoff = now_ms - retention_ms
    out = Path(plan_dir)
    shutil.rmtree(out, ignore_errors=True)

    ids = read_export(spark, export_dir, tables.IDS, shards)
    reqs = read_export(spark, export_dir, tables.REQS, shards)
    meta = read_export(spark, export_dir, tables.META, shards)
    dups = _content_dups(meta)
    dups.write.mode("overwrite").partitionBy("shard").parquet(str(out / CONTENT_DUPS))
    dups = spark.read.schema(_CONTENT_DUPS_SCHEMA).parquet(str(out / CONTENT_DUPS))
    actions = _actions(ids, reqs, meta, dups, cutoff, dedup_content)
    (  # no repartition: each task writes its rows of a shard sorted by (phase, key)
        actions.sortWithinPartitions("shard", "phase", "k1", "k2", "k3")
        .drop("k1", "k2", "k3")
        .write.mode("overwrite")
        .partitionBy("shard")
        .parquet(str(out / ACTIONS))
    )
    counts = {k: _count(out / ACTIONS, k, ("op", "reason")) for k in shards}
    groups = {k: len(_count(out / CONTENT_DUPS, k, ("sha1", "size"))) for k in shards}
    info = PlanInfo(
        plan_id=uuid.uuid4().hex,
        plan_dir=str(out),
        export_dir=str(export_dir),
        now_ms=now_ms,
        cutoff_ms=cutoff,
        retention_ms=retention_ms,
        dedup_content=dedup_content,
        watermarks=marks,
        counts=counts,
        content_dup_groups=groups,
        duration_s=time.perf_counter() - started,
    )
    tmp = out / f".{PLAN_FILE}.tmp"
    tmp.write_text(json.dumps({"format": PLAN_FORMAT, **info.as_dict()}, sort_keys=True), encoding="utf-8")
    os.replace(tmp, out / PLAN_FILE)
    log.info("gc_plan_written", plan_id=info.plan_id, plan_dir=str(out), shards=shards, cutoff_ms=cutoff,
             actions=info.total(), content_dup_groups=sum(groups.values()), duration_s=round(info.duration_s, 3))
    return info


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

    group = Window.partitionBy("shard", "sha1", "size")
    ranked = group.orderBy(F.col("ts_ms").desc(), F.col("data_id").asc())
    return (
        meta.withColumn("members", F.count("*").over(group))
        .filter(F.col("members") > 1)
        .withColumn("canonical_data_id", F.first("data_id").over(ranked.rowsBetween(Window.unboundedPreceding, 0)))
        .select("shard", "sha1", "size", "data_id", "ts_ms", "canonical_data_id", "members")
    )


def _actions(ids: DataFrame, reqs: DataFrame, meta: DataFrame, dups: DataFrame, cutoff: int,
             dedup_content: bool) -> DataFrame:
    """Union of all actions, with sort keys ``k1``/``k2``/``k3`` (LMDB key order within each phase)."""
    from pyspark.sql import functions as F

    col, lit = F.col, F.lit
    null_str = lit(None).cast("string")
    known = meta.select("shard", "data_id", lit(True).alias("has_meta"))
    repoint = dups.filter(col("data_id") != col("canonical_data_id")).select(
        "shard", "data_id", col("canonical_data_id").alias("canonical")
    )
    expired = col("ts_ms") < lit(cutoff)
    orphan = col("has_meta").isNull()
    with_meta = ids.join(known, ["shard", "data_id"], "left")
    if dedup_content:  # rows of a content duplicate count as rows of its canonical blob
        with_meta = with_meta.join(F.broadcast(repoint), ["shard", "data_id"], "left")
    else:
        with_meta = with_meta.withColumn("canonical", null_str)
    with_meta = with_meta.withColumn("content", F.coalesce("canonical", "data_id"))
    # duplicates are rare: find the (vin, request_id, content) groups with more than one live row
    # (one hash aggregate) and broadcast them back, instead of sorting every row in a window
    same_row = ["shard", "vin", "request_id", "content"]
    dup_groups = (
        with_meta.filter(~expired & ~orphan)
        .groupBy(*same_row)
        .agg(F.min("ts_ms").alias("oldest_live"), F.count("*").alias("live_rows"))
        .filter(col("live_rows") > 1)
        .drop("live_rows")
    )
    classified = (
        with_meta.join(F.broadcast(dup_groups), same_row, "left")
        .withColumn(
            "reason",
            F.when(expired, lit(REASON_EXPIRED))
            .when(orphan, lit(REASON_ORPHAN))
            .when(col("ts_ms") > col("oldest_live"), lit(REASON_DUPLICATE)),
        )
    )
    delete_ids = classified.filter(col("reason").isNotNull()).select(
        "shard", lit(PHASES.index(OP_DELETE_IDS)).alias("phase"), lit(OP_DELETE_IDS).alias("op"), "reason",
        "vin", "ts_ms", "request_id", "data_id", null_str.alias("new_data_id"), null_str.alias("status"),
        col("vin").alias("k1"), col("ts_ms").alias("k2"), col("request_id").alias("k3"),
    )
    survivors = classified.filter(col("reason").isNull())
    repoint_ids = survivors.filter(col("canonical").isNotNull()).select(
        "shard", lit(PHASES.index(OP_REPOINT_IDS)).alias("phase"), lit(OP_REPOINT_IDS).alias("op"),
        lit(REASON_CONTENT_DUPLICATE).alias("reason"), "vin", "ts_ms", "request_id", "data_id",
        col("canonical").alias("new_data_id"), null_str.alias("status"),
        col("vin").alias("k1"), col("ts_ms").alias("k2"), col("request_id").alias("k3"),
    )
    referenced = survivors.select("shard", col("content").alias("data_id")).distinct()
    blob_reason = F.when(col("ts_ms") < lit(cutoff), lit(REASON_EXPIRED))
    blobs = meta
    if dedup_content:
        blobs = blobs.join(repoint.select("shard", "data_id", lit(True).alias("non_canonical")), ["shard", "data_id"], "left")
        blob_reason = blob_reason.when(col("non_canonical").isNotNull(), lit(REASON_CONTENT_DUPLICATE))
    delete_blobs = (
        blobs.withColumn("reason", blob_reason)
        .filter(col("reason").isNotNull())
        .join(referenced, ["shard", "data_id"], "left_anti")
        .select(
            "shard", lit(PHASES.index(OP_DELETE_BLOB)).alias("phase"), lit(OP_DELETE_BLOB).alias("op"), "reason",
            null_str.alias("vin"), "ts_ms", null_str.alias("request_id"), "data_id", null_str.alias("new_data_id"),
            null_str.alias("status"), col("data_id").alias("k1"), lit(None).cast("long").alias("k2"),
            null_str.alias("k3"),
        )
    )
    delete_reqs = reqs.filter(expired).select(
        "shard", lit(PHASES.index(OP_DELETE_REQS)).alias("phase"), lit(OP_DELETE_REQS).alias("op"),
        lit(REASON_EXPIRED).alias("reason"), "vin", "ts_ms", "request_id", "data_id",
        null_str.alias("new_data_id"), "status", col("request_id").alias("k1"), lit(None).cast("long").alias("k2"),
        col("vin").alias("k3"),
    )
    return repoint_ids.unionByName(delete_ids).unionByName(delete_reqs).unionByName(delete_blobs)
