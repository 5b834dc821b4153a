"""Export of the durable-topic tables for the Spark jobs: the logs WITHOUT payloads, the groups' offsets, the catalog.

Strategy: retention (``storage.jobs.topic_plan``) needs per entry only where it is (topic, partition, offset), when it
was appended (``ts_ms``) and what it costs (``size``: the stored envelope's bytes, what ``retention_bytes`` bounds);
the payloads stay in the store. The one exception are the receipts (topic ``receipts``), whose small JSON payloads
are exported as columns (``request_id``, ``vin``, ``data_id``, ``status``) for ``fanout report``; they are null for
every other topic. Keys are decoded column-wise with Arrow kernels like the other tables of
:mod:`storage.jobs.export`; the envelope is unpacked per entry (its ``ts_ms`` is its first field). The catalog holds
the implicit built-in ``receipts`` row when the store has none (``storage.topics.read_specs``), so the plan sees
every topic's retention.
"""
from __future__ import annotations

import json
from typing import Any

import msgpack
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

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
    """A chunk of ``topic_log`` rows as :data:`TOPIC_LOG_SCHEMA` (payloads left out, receipts' fields parsed)."""
    name, rest = _split(ks)
    ts: list[int] = []
    fields: list[list[Any]] = [[], [], [], []]
    unpackb = msgpack.unpackb
    for key, raw in zip(ks, vs):
        ts_ms, _topic, _client, _qos, payload, _props = unpackb(raw, raw=False)
        ts.append(ts_ms)
        receipt = json.loads(payload) if key.startswith(b"receipts\x00") else None
        for i, f in enumerate(topics.RECEIPT_FIELDS[:4]):
            fields[i].append(None if receipt is None else receipt.get(f))
    return pa.Table.from_arrays(
        [name.cast(pa.string()), _be(pc.binary_slice(rest, 0, 4), 4), _be(pc.binary_slice(rest, 4, 12), 8),
         pa.array(ts, pa.int64()), pc.binary_length(pa.array(vs, pa.binary())).cast(pa.int64()),
         *[pa.array(col, pa.string()) for col in fields]],
        schema=TOPIC_LOG_SCHEMA,
    )


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
