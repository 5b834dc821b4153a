"""Delivery report per request_id, computed on Spark from an export's ``reqs`` table.

Strategy: ``reqs`` holds one row per (request_id, VIN) with the enqueue time, the status and, once
acked, the delivery time, so one export answers "how far is request X" for every request without
touching the live store. Per request_id:

- ``queued``: VINs with a ``reqs`` row (rows already removed by GC are no longer counted);
- ``delivered``: status ``delivered``;
- ``pending``: status ``pending`` and enqueued within the retention (``ts_ms >= now - retention``);
- ``expired``: status ``expired`` (not delivered within its trigger's ttl, or removed by GC past the
  retention), or status ``pending`` and older than the retention (GC will drop them);
- ``discarded``: status ``discarded`` (dropped undelivered: its blob was gone when it was due, or GC removed
  it for that reason);
- ``cancelled``: status ``cancelled`` (removed undelivered by a cancel of the request);
- ``p50_ms``/``p95_ms``/``p99_ms``: exact percentiles (linear interpolation, Spark ``percentile``,
  rounded to 1 us) of ``delivered_ts_ms - ts_ms`` over the delivered VINs, None when nothing was
  delivered;
- ``first_ts_ms``/``last_delivered_ts_ms``: when the request was first queued, last delivered;
- ``receipts_delivered``/``receipts_expired``/``receipts_discarded``/``receipts_cancelled``: the delivery receipts
  of the request in the built-in ``receipts`` topic (one per (request, VIN) outcome, written with the outcome; the
  export carries their fields, ``storage.jobs.topic_export``), 0 when none; receipts outlive the ``reqs`` rows GC
  removes until the topic's own retention prunes them, and they are what a platform consumer of the topic saw.

The report is written as one Parquet file (``<out>/report/``) and returned as a list of dicts
sorted by request_id for printing (``fanout report``).
"""
from __future__ import annotations

import os
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import structlog

from storage import tables, topics
from storage.jobs.export import read_export, read_watermarks, table_dir

if TYPE_CHECKING:  # pragma: no cover
    from pyspark.sql import SparkSession

log = structlog.get_logger(__name__)

REPORT_SUBDIR = "report"
REPORT_COLUMNS: tuple[str, ...] = (
    "request_id", "queued", "delivered", "pending", "expired", "discarded", "cancelled", "p50_ms", "p95_ms", "p99_ms",
    "first_ts_ms", "last_delivered_ts_ms", "receipts_delivered", "receipts_expired", "receipts_discarded",
    "receipts_cancelled",
)
RECEIPT_STATUSES: tuple[str, ...] = (tables.STATUS_DELIVERED, tables.STATUS_EXPIRED, tables.STATUS_DISCARDED,
                                     tables.STATUS_CANCELLED)
PERCENTILES: tuple[float, ...] = (0.5, 0.95, 0.99)


def compute_report(
    spark: SparkSession,
    export_dir: str | os.PathLike[str],
    *,
    now_ms: int,
    retention_ms: int,
    request_id: str | None = None,
    out_dir: str | os.PathLike[str] | None = None,
) -> list[dict[str, Any]]:
    """Per-request delivery report of an export.

    Args:
        spark: the session to run on.
        export_dir: an export root (``storage.jobs.export``).
        now_ms: "now" for the pending/expired split.
        retention_ms: ``fanout.data_retention_ms``.
        request_id: only this request (default: all).
        out_dir: also write the report as Parquet under ``<out_dir>/report/`` (replaced).

    Returns:
        One dict per request_id (keys ``REPORT_COLUMNS``), sorted by request_id.

    Raises:
        ValueError: no completely exported shard under ``export_dir``.
    """
    from pyspark.sql import functions as F

    started = time.perf_counter()
    shards = sorted(read_watermarks(export_dir))
    if not shards:
        raise ValueError(f"no complete shard export under {export_dir}")
    reqs = read_export(spark, export_dir, tables.REQS, shards)
    if request_id is not None:
        reqs = reqs.filter(F.col("request_id") == request_id)
    cutoff = now_ms - retention_ms
    col = F.col
    delivered = col("status") == tables.STATUS_DELIVERED
    pending = col("status") == tables.STATUS_PENDING
    latency = F.when(delivered, col("delivered_ts_ms") - col("ts_ms"))
    report = (
        reqs.groupBy("request_id")
        .agg(
            F.count("*").alias("queued"),
            F.count(F.when(delivered, 1)).alias("delivered"),
            F.count(F.when(pending & (col("ts_ms") >= cutoff), 1)).alias("pending"),
            F.count(F.when((pending & (col("ts_ms") < cutoff)) | (col("status") == tables.STATUS_EXPIRED), 1))
            .alias("expired"),
            F.count(F.when(col("status") == tables.STATUS_DISCARDED, 1)).alias("discarded"),
            F.count(F.when(col("status") == tables.STATUS_CANCELLED, 1)).alias("cancelled"),
            F.percentile(latency, list(PERCENTILES)).alias("pct"),
            F.min("ts_ms").alias("first_ts_ms"),
            F.max(F.when(delivered, col("delivered_ts_ms"))).alias("last_delivered_ts_ms"),
        )
        .select(
            "request_id", "queued", "delivered", "pending", "expired", "discarded", "cancelled",
            *[F.round(col("pct")[i], 3).alias(name) for i, name in enumerate(("p50_ms", "p95_ms", "p99_ms"))],
            "first_ts_ms", "last_delivered_ts_ms",
        )
    )
    report = _with_receipts(spark, export_dir, shards, report, request_id).orderBy("request_id")
    if out_dir is not None:
        dest = Path(out_dir) / REPORT_SUBDIR
        report.coalesce(1).write.mode("overwrite").parquet(str(dest))
        report = spark.read.parquet(str(dest)).orderBy("request_id")
    rows = [_clean(row.asDict()) for row in report.collect()]
    log.info("delivery_report", requests=len(rows), shards=shards, request_id=request_id,
             duration_s=round(time.perf_counter() - started, 3))
    return rows


def _with_receipts(spark: SparkSession, export_dir: str | os.PathLike[str], shards: list[int], report: Any,
                   request_id: str | None) -> Any:
    """``report`` plus the receipt counts per status of each request (0 without receipts or topic export)."""
    from pyspark.sql import functions as F

    col = F.col
    names = [f"receipts_{status}" for status in RECEIPT_STATUSES]
    exported = [k for k in shards if table_dir(export_dir, tables.TOPIC_LOG, k).exists()]
    if not exported:
        return report.select("*", *[F.lit(0).cast("long").alias(n) for n in names])
    receipts = read_export(spark, export_dir, tables.TOPIC_LOG, exported).filter(
        col("topic") == topics.RECEIPTS_NAME)
    if request_id is not None:
        receipts = receipts.filter(col("request_id") == request_id)
    counts = receipts.groupBy("request_id").agg(
        *[F.count(F.when(col("status") == status, 1)).alias(n) for status, n in zip(RECEIPT_STATUSES, names)])
    return report.join(counts, "request_id", "left").fillna(0, subset=names)


def _clean(row: dict[str, Any]) -> dict[str, Any]:
    """Percentiles of a request with no delivery come back as nulls: keep them None."""
    return {name: row.get(name) for name in REPORT_COLUMNS}
