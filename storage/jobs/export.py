"""Snapshot export of one shard to Parquet: ``ids``, ``reqs`` and ``meta`` (not the blobs), and the durable topics'
catalog, logs (not the payloads) and group offsets (``storage.jobs.topic_export``).

Strategy:
- Consistency: every table of a shard is read from ONE LMDB read transaction
  (``ShardStore.snapshot_view``), and that transaction's ``applied_seq`` is written next to the files
  as the shard's watermark. The GC plan computed from the export is therefore a plan "as of seq n";
  applying it later uses guarded ops (delete only if the row still holds the value seen at seq n),
  so anything written after the watermark (a re-queued row, a refreshed blob, an ack) is kept.
- Streaming: a table is read in chunks of ``row_group_rows`` undecoded ``(key, value)`` pairs
  (``SnapshotView.raw_chunks``) and each chunk becomes one Parquet row group; the shard is never
  whole in memory. Keys are decoded column-wise with Arrow kernels (split at the NUL separator,
  8-byte big-endian time), values by unpacking only the distinct msgpack values of the chunk (one
  trigger writes the same value for every VIN), so the export costs ~1 us per row, not a Python
  decode per row.
- Layout: ``<out>/<table>/shard=<k>/part-00000.parquet`` (Hive partitioning, so Spark sees a
  ``shard`` column) and ``<out>/shard=<k>/_watermark.json`` = ``{shard, applied_seq, epoch,
  exported_at_ms, rows}``. A shard's old files and watermark are removed first and the watermark is
  written last, so a shard without a watermark is an incomplete export. Files are written under a
  dot-name and renamed (Spark and pyarrow skip dot-files).
- A map resize kills the open transaction (``SnapshotInvalidatedError``): the shard's export restarts
  from scratch, a bounded number of times.
"""
from __future__ import annotations

import json
import os
import shutil
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Mapping

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import structlog

from storage import keys, tables
from storage.batch import gc_paused
from storage.errors import SnapshotInvalidatedError
from storage.jobs import topic_export
from storage.shard import ShardStore

if TYPE_CHECKING:  # pragma: no cover
    from pyspark.sql import DataFrame, SparkSession

log = structlog.get_logger(__name__)

EXPORT_FORMAT = 1
EXPORT_TABLES: tuple[str, ...] = (tables.IDS, tables.REQS, tables.META, *topic_export.TABLES)
WATERMARK_FILE = "_watermark.json"
PART_FILE = "part-00000.parquet"
DEFAULT_ROW_GROUP_ROWS = 262_144

SCHEMAS: dict[str, pa.Schema] = {
    tables.IDS: pa.schema(
        [("vin", pa.string()), ("ts_ms", pa.int64()), ("request_id", pa.string()), ("data_id", pa.string()),
         ("maybe_dup", pa.bool_())]
    ),
    tables.REQS: pa.schema(
        [
            ("request_id", pa.string()),
            ("vin", pa.string()),
            ("ts_ms", pa.int64()),
            ("data_id", pa.string()),
            ("status", pa.string()),
            ("delivered_ts_ms", pa.int64()),
        ]
    ),
    tables.META: pa.schema(
        [("data_id", pa.string()), ("ts_ms", pa.int64()), ("size", pa.int64()), ("sha1", pa.string())]
    ),
    **topic_export.SCHEMAS,
}
"""Column schema of each exported table (the ``shard`` column comes from the directory name).

``ids.maybe_dup`` is a pre-filter for the plan's duplicate search, computed while the rows stream
by in key order: True when the row's ``(vin, request_id)`` has another row in the same chunk, and
(conservatively) for every row of the first and last VIN of a chunk, whose rows may continue in
the neighbouring chunk. A row with ``maybe_dup`` False has no other row with its ``(vin,
request_id)`` in the shard, so it cannot be a duplicate; the plan groups only the flagged rows."""


@dataclass(frozen=True, slots=True)
class ExportInfo:
    """What ``export_shard`` wrote: the shard's watermark and row counts (JSON-able; ``as_dict``)."""

    shard: int
    applied_seq: int
    epoch: int
    exported_at_ms: int
    rows: dict[str, int] = field(default_factory=dict)
    out_dir: str = ""
    duration_s: float = 0.0
    attempts: int = 1

    @property
    def total_rows(self) -> int:
        """Rows of all exported tables."""
        return sum(self.rows.values())

    def as_dict(self) -> dict[str, Any]:
        """Plain dict (for Ray, JSON and the CLI)."""
        return asdict(self)


def table_dir(out_dir: str | os.PathLike[str], table: str, shard: int) -> Path:
    """Directory holding the Parquet files of one table of one shard."""
    return Path(out_dir) / table / f"shard={shard}"


def watermark_path(out_dir: str | os.PathLike[str], shard: int) -> Path:
    """Path of a shard's ``_watermark.json``."""
    return Path(out_dir) / f"shard={shard}" / WATERMARK_FILE


def read_watermarks(out_dir: str | os.PathLike[str]) -> dict[int, dict[str, Any]]:
    """Watermarks of every completely exported shard under ``out_dir``, by shard id.

    Raises:
        ValueError: a watermark file is not valid JSON.
    """
    out: dict[int, dict[str, Any]] = {}
    for path in sorted(Path(out_dir).glob(f"shard=*/{WATERMARK_FILE}")):
        try:
            mark = json.loads(path.read_text(encoding="utf-8"))
        except json.JSONDecodeError as exc:
            raise ValueError(f"{path}: not a watermark file: {exc}") from exc
        out[int(mark["shard"])] = mark
    return out


def export_shard(
    store: ShardStore,
    out_dir: str | os.PathLike[str],
    *,
    row_group_rows: int = DEFAULT_ROW_GROUP_ROWS,
    max_attempts: int = 3,
    compression: str = "snappy",
) -> ExportInfo:
    """Export ``ids``, ``reqs``, ``meta`` and the topic tables of one shard from one read transaction.

    Args:
        store: the open shard (primary, replica or an offline store).
        out_dir: export root; this shard's previous files there are replaced.
        row_group_rows: rows per chunk read and per Parquet row group (bounds memory).
        max_attempts: restarts allowed when a map resize invalidates the snapshot.
        compression: Parquet codec.

    Returns:
        ``ExportInfo`` with the watermark (``applied_seq``) and rows per table.

    Raises:
        ValueError: ``row_group_rows`` < 1.
        SnapshotInvalidatedError: the map was resized during every attempt.
        StoreClosedError: the store is closed.
    """
    if row_group_rows < 1:
        raise ValueError(f"row_group_rows must be >= 1, got {row_group_rows}")
    out = Path(out_dir)
    for attempt in range(1, max_attempts + 1):
        started = time.perf_counter()
        _remove_shard(out, store.shard_id)
        try:
            info = _export_once(store, out, row_group_rows, compression, attempt, started)
        except SnapshotInvalidatedError:
            _remove_shard(out, store.shard_id)
            log.warning("export_restarted", shard=store.shard_id, attempt=attempt, reason="map_resized")
            if attempt == max_attempts:
                raise
            continue
        except BaseException:
            _remove_shard(out, store.shard_id)
            raise
        log.info("shard_exported", shard=info.shard, applied_seq=info.applied_seq, rows=info.rows,
                 duration_s=round(info.duration_s, 3), out_dir=str(out))
        return info
    raise AssertionError("unreachable")


def export_shards(
    stores: Mapping[int, ShardStore],
    out_dir: str | os.PathLike[str],
    *,
    row_group_rows: int = DEFAULT_ROW_GROUP_ROWS,
    progress: Callable[[ExportInfo], None] | None = None,
) -> dict[int, ExportInfo]:
    """``export_shard`` for several shards (one after the other, each from its own transaction).

    Args:
        stores: shard id -> open store.
        out_dir: export root.
        row_group_rows: as ``export_shard``.
        progress: called with each shard's ``ExportInfo`` when it is done.

    Returns:
        Shard id -> ``ExportInfo``.
    """
    infos: dict[int, ExportInfo] = {}
    for shard_id in sorted(stores):
        infos[shard_id] = export_shard(stores[shard_id], out_dir, row_group_rows=row_group_rows)
        if progress is not None:
            progress(infos[shard_id])
    return infos


def _export_once(
    store: ShardStore, out: Path, row_group_rows: int, compression: str, attempt: int, started: float
) -> ExportInfo:
    rows: dict[str, int] = {}
    with store.snapshot_view() as view, gc_paused():
        exported_at_ms = int(time.time() * 1000)
        for table in EXPORT_TABLES:
            rows[table] = _write_table(view, table, table_dir(out, table, store.shard_id), row_group_rows, compression)
        info = ExportInfo(
            shard=store.shard_id,
            applied_seq=view.applied_seq,
            epoch=view.epoch,
            exported_at_ms=exported_at_ms,
            rows=rows,
            out_dir=str(out),
            duration_s=time.perf_counter() - started,
            attempts=attempt,
        )
    mark = {"format": EXPORT_FORMAT, "shard": info.shard, "applied_seq": info.applied_seq, "epoch": info.epoch,
            "exported_at_ms": info.exported_at_ms, "rows": rows}
    _write_atomic(watermark_path(out, info.shard), json.dumps(mark, sort_keys=True).encode())
    return info


def _write_table(view: Any, table: str, dest: Path, row_group_rows: int, compression: str) -> int:
    dest.mkdir(parents=True, exist_ok=True)
    tmp = dest / f".{PART_FILE}.tmp"
    schema = SCHEMAS[table]
    n = 0
    with pq.ParquetWriter(tmp, schema, compression=compression) as writer:
        if table in topic_export.DECODERS:
            n = topic_export.write_table(view, table, writer, row_group_rows)
        elif table == tables.META:
            for chunk in view.chunks(table, min(row_group_rows, 10_000)):
                writer.write_table(pa.Table.from_pylist(chunk, schema=schema))
                n += len(chunk)
        else:
            decode = _decode_ids if table == tables.IDS else _decode_reqs
            for ks, vs in view.raw_chunks(table, row_group_rows):
                writer.write_table(decode(ks, vs), row_group_size=len(ks))
                n += len(ks)
    os.replace(tmp, dest / PART_FILE)
    return n


def _split_key(ks: list[bytes]) -> tuple[pa.Array, pa.Array]:
    """Split composite keys at their first NUL (identifiers never contain NUL, see ``storage.keys``)."""
    parts = pc.split_pattern(pa.array(ks, pa.binary()), pattern=keys.SEP, max_splits=1)
    return pc.list_element(parts, 0), pc.list_element(parts, 1)


def _be_u64(col: pa.Array) -> pa.Array:
    """8-byte big-endian unsigned values as int64."""
    fixed = col.cast(pa.binary(8))
    raw = np.frombuffer(fixed.buffers()[1], dtype=">u8", count=len(fixed) + fixed.offset)[fixed.offset:]
    return pa.array(raw.astype(np.int64))


def _distinct_values(vs: list[bytes]) -> tuple[list[Any], pa.Array]:
    """Unpack only the distinct msgpack values; returns ``(decoded uniques, index per row)``."""
    encoded = pa.array(vs, pa.binary()).dictionary_encode()
    return [tables.unpack(raw) for raw in encoded.dictionary.to_pylist()], encoded.indices


def _decode_ids(ks: list[bytes], vs: list[bytes]) -> pa.Table:
    vin, rest = _split_key(ks)
    uniques, idx = _distinct_values(vs)
    request_id = pc.binary_slice(rest, 8, 8 + keys.MAX_REQUEST_ID_BYTES)
    return pa.Table.from_arrays(
        [
            vin.cast(pa.string()),
            _be_u64(pc.binary_slice(rest, 0, 8)),
            request_id.cast(pa.string()),
            pc.take(pa.array(uniques, pa.string()), idx),
            _maybe_dup(vin, request_id),
        ],
        schema=SCHEMAS[tables.IDS],
    )


def _maybe_dup(vin: pa.Array, request_id: pa.Array) -> pa.Array:
    """``ids.maybe_dup`` of one chunk (see ``SCHEMAS``): rows are in key order, so a VIN is one run."""
    n = len(vin)
    if n == 0:
        return pa.array([], pa.bool_())
    run = np.zeros(n, np.int64)  # index of the row's VIN run in the chunk
    np.cumsum(pc.not_equal(vin.slice(1), vin.slice(0, n - 1)).to_numpy(zero_copy_only=False), out=run[1:])
    encoded = request_id.dictionary_encode()
    pair = run * len(encoded.dictionary) + encoded.indices.to_numpy(zero_copy_only=False)
    _, inverse, counts = np.unique(pair, return_inverse=True, return_counts=True)
    flag = counts[inverse] > 1
    flag |= (run == 0) | (run == run[-1])
    return pa.array(flag)


def _decode_reqs(ks: list[bytes], vs: list[bytes]) -> pa.Table:
    request_id, vin = _split_key(ks)
    uniques, idx = _distinct_values(vs)
    ts, data_id, status, delivered = zip(*uniques) if uniques else ((), (), (), ())
    return pa.Table.from_arrays(
        [
            request_id.cast(pa.string()),
            vin.cast(pa.string()),
            pc.take(pa.array(ts, pa.int64()), idx),
            pc.take(pa.array(data_id, pa.string()), idx),
            pc.take(pa.array(status, pa.string()), idx),
            pc.take(pa.array(delivered, pa.int64()), idx),
        ],
        schema=SCHEMAS[tables.REQS],
    )


def _remove_shard(out: Path, shard: int) -> None:
    watermark_path(out, shard).unlink(missing_ok=True)
    for table in EXPORT_TABLES:
        shutil.rmtree(table_dir(out, table, shard), ignore_errors=True)


def _write_atomic(path: Path, data: bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_bytes(data)
    os.replace(tmp, path)


def read_export(spark: SparkSession, export_dir: str | os.PathLike[str], table: str, shards: list[int]) -> DataFrame:
    """One exported table of the given shards as a DataFrame with a ``shard`` column.

    Only shards with a watermark are read (a shard without one is an incomplete export).
    """
    from pyspark.sql import types as T

    types = {"int64": T.LongType(), "bool": T.BooleanType(), "string": T.StringType()}
    schema = T.StructType(
        [T.StructField(f.name, types[str(f.type)]) for f in SCHEMAS[table]] + [T.StructField("shard", T.IntegerType())]
    )
    base = Path(export_dir) / table
    paths = [str(table_dir(export_dir, table, k)) for k in shards]
    return spark.read.schema(schema).option("basePath", str(base)).parquet(*paths)
