"""Retention of the durable topics in the GC plan: per partition, the offset below which the log is pruned.

Strategy (Spark, over one shard's export; ``storage.jobs.topic_export`` wrote the logs without payloads):
- An entry is past retention when it is older than its topic's ``retention_ms`` (``ts_ms < now_ms - retention_ms``)
  or when the entries newer than it, itself included, hold more than ``retention_bytes`` (``size`` summed newest
  first per partition). A log is pruned from its start, so the partition's bound is ``below_offset`` = 1 + the
  highest offset past retention; ``topic_prune_if(topic, partition, below_offset)`` applies it. Entries are
  immutable and offsets never reused, so the bound is its own guard: anything appended after the snapshot has a
  higher offset and stays (``storage.jobs.plan_apply``).
- Retention wins over the consumer groups (a group down for longer than the retention loses messages), but the plan
  says how many it drops: ``dropped_unconsumed`` counts the pruned entries above the committed offset of the slowest
  group that committed in the partition (some group had not acknowledged them).
- Output: ``topic_prunes/shard=<k>/`` with :data:`PRUNE_COLUMNS`, one row per partition to prune.
"""
from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING

from storage import tables
from storage.jobs.export import read_export, table_dir

if TYPE_CHECKING:  # pragma: no cover
    from pyspark.sql import SparkSession

TOPIC_PRUNES = "topic_prunes"
PRUNE_COLUMNS: tuple[str, ...] = ("topic", "partition", "below_offset", "entries", "bytes", "dropped_unconsumed")
PRUNE_COUNT_KEY = "topic_prune_if/retention"
"""The plan's ``counts`` key of the prune ops (one per partition)."""
STATS: tuple[str, ...] = ("partitions", "entries", "bytes", "dropped_unconsumed")


def plan_topic_retention(spark: SparkSession, export_dir: str | os.PathLike[str], out: Path, shard: int,
                         now_ms: int) -> dict[str, int]:
    """Write ``topic_prunes/shard=<k>`` of one shard and return its totals (:data:`STATS`).

    An export without topic tables (written before they existed) plans nothing.
    """
    from pyspark.sql import Window
    from pyspark.sql import functions as F

    if not table_dir(export_dir, tables.TOPIC_LOG, shard).exists():
        return dict.fromkeys(STATS, 0)
    col, lit = F.col, F.lit
    part = ["topic", "partition"]
    log = read_export(spark, export_dir, tables.TOPIC_LOG, [shard]).select("topic", "partition", "offset", "ts_ms",
                                                                            "size")
    catalog = read_export(spark, export_dir, tables.TOPICS, [shard]).select(
        col("name").alias("topic"), "retention_ms", "retention_bytes")
    slowest = (read_export(spark, export_dir, tables.TOPIC_OFFSETS, [shard])
               .groupBy(*part).agg(F.min("offset").alias("slowest")))
    newest_first = Window.partitionBy(*part).orderBy(col("offset").desc()).rowsBetween(Window.unboundedPreceding, 0)
    entries = log.join(F.broadcast(catalog), "topic").withColumn("newer_bytes", F.sum("size").over(newest_first))
    past = ((col("retention_ms").isNotNull() & (col("ts_ms") < lit(now_ms) - col("retention_ms")))
            | (col("retention_bytes").isNotNull() & (col("newer_bytes") > col("retention_bytes"))))
    bounds = entries.filter(past).groupBy(*part).agg((F.max("offset") + 1).alias("below_offset"))
    prunes = (
        log.join(F.broadcast(bounds), part)
        .filter(col("offset") < col("below_offset"))
        .join(F.broadcast(slowest), part, "left")
        .groupBy("topic", "partition", "below_offset")
        .agg(F.count("*").alias("entries"), F.sum("size").alias("bytes"),
             F.count(F.when(col("slowest").isNotNull() & (col("offset") > col("slowest")), 1))
             .alias("dropped_unconsumed"))
        .orderBy(*part)
        .select(*PRUNE_COLUMNS)
    )
    dest = out / TOPIC_PRUNES / f"shard={shard}"
    prunes.coalesce(1).write.mode("overwrite").parquet(str(dest))
    return prune_stats(out, shard)


def prune_files(plan_dir: str | os.PathLike[str], shard: int) -> list[Path]:
    """The plan's topic prune files of one shard, in name order."""
    return sorted(Path(plan_dir, TOPIC_PRUNES, f"shard={shard}").glob("*.parquet"))


def prune_stats(plan_dir: str | os.PathLike[str], shard: int) -> dict[str, int]:
    """Totals of one shard's prunes: partitions, entries, bytes, dropped_unconsumed."""
    import pyarrow.dataset as ds

    out = dict.fromkeys(STATS, 0)
    files = prune_files(plan_dir, shard)
    if files:
        rows = ds.dataset([str(f) for f in files], format="parquet").to_table(columns=list(PRUNE_COLUMNS[3:]))
        out["partitions"] = rows.num_rows
        for name in PRUNE_COLUMNS[3:]:
            out[name] = int(sum(v for v in rows.column(name).to_pylist() if v is not None))
    return out
