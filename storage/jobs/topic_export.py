"""Export of the durable-topic tables for the Spark jobs: the logs WITHOUT payloads, the groups' offsets, the catalog.

Strategy: retention (``storage.jobs.topic_plan``) needs per entry only where it is (topic, partition, offset), when it
was appended (``ts_ms``) and what it costs (``size``: the stored envelope's bytes, what ``retention_bytes`` bounds);
the payloads stay in the store. The one exception are the receipts (topic ``receipts``), whose small JSON payloads
are exported as columns (``request_id``, ``vin``, ``data_id``, ``status``) for ``fanout report``; they are null for
every other topic. Keys are decoded column-wise with Arrow kernels like the other tables of
:mod:`storage.jobs.export`; the envelope is unpacked per entry (its ``ts_ms`` is its first field). The catalog holds
the implicit built-in ``receipts`` row when the store has none (``storage.topics.read_specs``), so the plan sees
every topic's retention. Receipts' JSON is parsed by Arrow's JSON reader per chunk, not ``json.loads`` per row.
"""
from __future__ import annotations

import io
from typing import Any

import msgpack
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.json as pa_json

from storage import keys, tables, topics

TOPIC_LOG_SCHEMA = pa.schema([
    ("topic", pa.string()), ("partition", pa.int64()), ("offset", pa.int64()), ("ts_ms", pa.int64()),
    ("size", pa.int64()), ("request_id", pa.string()), ("vin", pa.string()), ("data_id", pa.string()),
    ("status", pa.string()),
])
TOPIC_OFFSETS_SCHEMA = pa.schema([
    ("topic", pa.string()), ("group", pa.string()), ("partition", pa.int64()), ("offset", pa.int64()),
    ("updated_ms", pa.int64()),
])
TOPICS_SCHEMA = pa.schema([
    ("name", pa.string()), ("filter", pa.string()), ("partitions", pa.int64()), ("retention_ms", pa.int64()),
    ("retention_bytes", pa.int64()), ("key_level", pa.int64()), ("created_ms", pa.int64()),
])
SCHEMAS: dict[str, pa.Schema] = {tables.TOPIC_LOG: TOPIC_LOG_SCHEMA, tables.TOPIC_OFFSETS: TOPIC_OFFSETS_SCHEMA,
                                 tables.TOPICS: TOPICS_SCHEMA}
TABLES: tuple[str, ...] = (tables.TOPICS, tables.TOPIC_LOG, tables.TOPIC_OFFSETS)
_RECEIPTS = topics.RECEIPTS_NAME


def _be(col: pa.Array, width: int) -> pa.Array:
    """Fixed-width big-endian unsigned values as int64."""
    fixed = col.cast(pa.binary(width))
    dtype = ">u4" if width == 4 else ">u8"
    raw = np.frombuffer(fixed.buffers()[1], dtype=dtype, count=len(fixed) + fixed.offset)[fixed.offset:]
    return pa.array(raw.astype(np.int64))


def _split(ks: list[bytes]) -> tuple[pa.Array, pa.Array]:
    parts = pc.split_pattern(pa.array(ks, pa.binary()), pattern=keys.SEP, max_splits=1)
    return pc.list_element(parts, 0), pc.list_element(parts, 1)


def decode_log(ks: list[bytes], vs: list[bytes]) -> pa.Table:
    """A chunk of ``topic_log`` rows as :data:`TOPIC_LOG_SCHEMA` (payloads left out, receipts' fields parsed).

    The envelope is not unpacked for its time: it is a msgpack array whose first item is ``ts_ms``, which for any
    real clock is a uint64 (type byte 0xcf, then 8 bytes big-endian); other encodings (small test times) are
    unpacked. Only the receipts' envelopes are unpacked whole, for their JSON payload.
    """
    name, rest = _split(ks)
    unpackb = msgpack.unpackb
    ts = [int.from_bytes(raw[2:10], "big") if raw[1] == 0xCF else unpackb(raw, raw=False)[0] for raw in vs]
    return pa.Table.from_arrays(
        [name.cast(pa.string()), _be(pc.binary_slice(rest, 0, 4), 4), _be(pc.binary_slice(rest, 4, 12), 8),
         pa.array(ts, pa.int64()), pa.array(list(map(len, vs)), pa.int64()),
         *_receipt_columns(ks, vs)],
        schema=TOPIC_LOG_SCHEMA,
    )


def _receipt_columns(ks: list[bytes], vs: list[bytes]) -> list[pa.Array]:
    """``request_id``, ``vin``, ``data_id``, ``status`` of the chunk's receipts (null for other topics). Keys sort by
    topic, so the receipts are one run of the chunk; their JSON payloads are parsed by Arrow's reader in one go."""
    prefix = _RECEIPTS.encode() + keys.SEP
    run = [i for i, key in enumerate(ks) if key.startswith(prefix)]
    n = len(ks)
    if not run:
        return [pa.nulls(n, pa.string()) for _ in range(4)]
    first, last = run[0], run[-1] + 1
    unpackb = msgpack.unpackb
    lines = b"\n".join(unpackb(raw, raw=False)[4] for raw in vs[first:last])
    parsed = pa_json.read_json(io.BytesIO(lines), parse_options=pa_json.ParseOptions(explicit_schema=_RECEIPT_SCHEMA))
    pad_head, pad_tail = pa.nulls(first, pa.string()), pa.nulls(n - last, pa.string())
    return [pa.concat_arrays([pad_head, *parsed.column(f).chunks, pad_tail]) for f in _RECEIPT_SCHEMA.names]


_RECEIPT_SCHEMA = pa.schema([(f, pa.string()) for f in topics.RECEIPT_FIELDS[:4]])


def decode_offsets(ks: list[bytes], vs: list[bytes]) -> pa.Table:
    """A chunk of ``topic_offsets`` rows as :data:`TOPIC_OFFSETS_SCHEMA`."""
    rows = [topics.offsets_row(k, v) for k, v in zip(ks, vs)]
    return pa.Table.from_pylist(rows, schema=TOPIC_OFFSETS_SCHEMA)


def decode_catalog(ks: list[bytes], vs: list[bytes]) -> pa.Table:
    """A chunk of ``topics`` rows as :data:`TOPICS_SCHEMA`."""
    return pa.Table.from_pylist([topics.catalog_row(k, v) for k, v in zip(ks, vs)], schema=TOPICS_SCHEMA)


DECODERS = {tables.TOPIC_LOG: decode_log, tables.TOPIC_OFFSETS: decode_offsets, tables.TOPICS: decode_catalog}


def write_table(view: Any, table: str, writer: Any, row_group_rows: int) -> int:
    """Stream one topic table of a ``SnapshotView`` into a ``ParquetWriter``; returns the rows written."""
    n = 0
    seen_receipts = False
    for ks, vs in view.raw_chunks(table, row_group_rows):
        writer.write_table(DECODERS[table](ks, vs), row_group_size=len(ks))
        n += len(ks)
        seen_receipts = seen_receipts or (table == tables.TOPICS and _RECEIPTS.encode() in ks)
    if table == tables.TOPICS and not seen_receipts:
        spec = topics.RECEIPTS
        writer.write_table(pa.Table.from_pylist([
            {"name": spec.name, "filter": spec.filter, "partitions": spec.partitions,
             "retention_ms": spec.retention_ms, "retention_bytes": spec.retention_bytes, "key_level": spec.key_level,
             "created_ms": None}], schema=TOPICS_SCHEMA))
        n += 1
    return n
