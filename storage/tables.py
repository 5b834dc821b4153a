"""Table catalogue: named LMDB databases, value encodings and decoded row shapes.

Strategy: values are msgpack arrays (compact: ``reqs`` holds one row per VIN of every request, so
field names would cost ~20 bytes a row), except ``data``, which holds the raw blob bytes. Callers
never see the arrays: read verbs and scans return dicts built here, with field names that carry
their unit (``ts_ms``). ``ROW_FIELDS`` lists the fields of each table's decoded rows in order, which
is the column list an export (Parquet) uses.

| db | key | stored value | decoded row |
|---|---|---|---|
| data | data_id | blob bytes | data_id, blob |
| meta | data_id | [ts_ms, size, sha1 hex] | data_id, ts_ms, size, sha1 |
| ids | vin, ts_ms, request_id | data_id | vin, ts_ms, request_id, data_id |
| reqs | request_id, vin | [ts_ms, data_id, status, delivered_ts_ms (or the discard time) or nil] | request_id, vin, ts_ms, data_id, status, delivered_ts_ms |
| sys | name | any msgpack scalar | name, value |
| retained | topic (or hash) | [topic, payload, qos, ts_ms] | topic, payload, qos, ts_ms |
| metrics | name | [value, ts_ms] | name, value, ts_ms |
| requests | request_id | [pending, delivered, discarded, expired, cancelled, first/last delivery ms, expires_ms, cancelled_ms] | request_id, the same fields (storage.request_stats) |
| reqprops | request_id | [[name, value], ...] | request_id, user_properties |
| blobprops | data_id | [content_type] | data_id, content_type |
| topics | topic name | [filter, partitions, retention_ms, retention_bytes, key_level, created_ms] | name, the same fields |
| topic_log | topic, partition (u32 BE), offset (u64 BE) | [ts_ms, mqtt_topic, client_id, qos, payload, properties or nil] | topic, partition, offset, the same fields |
| topic_counters | topic, partition | next offset to assign | topic, partition, next_offset |
| topic_offsets | topic, group, partition | [last acknowledged offset, updated_ms] | topic, group, partition, offset, updated_ms |

``reqprops`` and ``blobprops`` hold the MQTT 5 properties a fanout delivery carries: the User Properties of
a request's trigger and the Content Type of a blob's publish, one small row per request or blob that has any
(none for the others). They are tables of their own rather than fields of ``requests`` or ``meta``: an old
store simply gets them empty at open, the per-delivery rewrites of the ``requests`` counters stay as small as
they were, and ``meta`` keeps the layout the Spark jobs and exports read.

The four ``topic*`` tables hold the durable topics (issue 14; key encodings and rules in :mod:`storage.topics`).
An old store gets them empty at open; the built-in ``receipts`` topic needs no catalog row (it is implicit).
"""
from __future__ import annotations

from typing import Any

import msgpack

from storage import keys, topics

DATA = "data"
META = "meta"
IDS = "ids"
REQS = "reqs"
SYS = "sys"
RETAINED = "retained"
METRICS = "metrics"
REQUESTS = "requests"  # per-request lifecycle counters (storage.request_stats)
REQPROPS = "reqprops"  # a request's MQTT 5 User Properties, carried to its deliveries
BLOBPROPS = "blobprops"  # a blob's MQTT 5 Content Type, carried to its deliveries
TOPICS = "topics"  # durable topics' catalog (storage.topics)
TOPIC_LOG = "topic_log"  # per-partition append-only logs
TOPIC_COUNTERS = "topic_counters"  # per-partition next offset (never goes back)
TOPIC_OFFSETS = "topic_offsets"  # consumer groups' committed offsets
ALL_DBS: tuple[str, ...] = (DATA, META, IDS, REQS, SYS, RETAINED, METRICS, REQUESTS, REQPROPS, BLOBPROPS,
                            TOPICS, TOPIC_LOG, TOPIC_COUNTERS, TOPIC_OFFSETS)
USER_DBS: tuple[str, ...] = (DATA, META, IDS, REQS, RETAINED, METRICS, REQUESTS, REQPROPS, BLOBPROPS,
                             TOPICS, TOPIC_LOG, TOPIC_COUNTERS, TOPIC_OFFSETS)
"""Tables whose content replication keeps identical on every replica (``sys`` is per store)."""

STATUS_PENDING = "pending"
STATUS_DELIVERED = "delivered"
STATUS_DISCARDED = "discarded"  # dropped undelivered: its blob was gone (garbage-collected) when it was due
STATUS_EXPIRED = "expired"  # not delivered within the trigger's ttl
STATUS_CANCELLED = "cancelled"  # removed undelivered by a cancel of its request

SYS_APPLIED_SEQ = b"applied_seq"
SYS_EPOCH = b"epoch"
SYS_SHARD_ID = b"shard_id"
SYS_REQUESTS_BUILT = b"requests_built"  # the requests counters were built from the reqs rows (storage.request_stats)

ROW_FIELDS: dict[str, tuple[str, ...]] = {
    DATA: ("data_id", "blob"),
    META: ("data_id", "ts_ms", "size", "sha1"),
    IDS: ("vin", "ts_ms", "request_id", "data_id"),
    REQS: ("request_id", "vin", "ts_ms", "data_id", "status", "delivered_ts_ms"),
    SYS: ("name", "value"),
    RETAINED: ("topic", "payload", "qos", "ts_ms"),
    METRICS: ("name", "value", "ts_ms"),
    REQUESTS: ("request_id", "pending", "delivered", "discarded", "expired", "cancelled", "first_delivery_ms",
               "last_delivery_ms", "expires_ms", "cancelled_ms"),
    REQPROPS: ("request_id", "user_properties"),
    BLOBPROPS: ("data_id", "content_type"),
    TOPICS: ("name", "filter", "partitions", "retention_ms", "retention_bytes", "key_level", "created_ms"),
    TOPIC_LOG: ("topic", "partition", "offset", "ts_ms", "mqtt_topic", "client_id", "qos", "payload", "properties"),
    TOPIC_COUNTERS: ("topic", "partition", "next_offset"),
    TOPIC_OFFSETS: ("topic", "group", "partition", "offset", "updated_ms"),
}

_packer = msgpack.Packer(use_bin_type=True)


def pack(value: Any) -> bytes:
    """msgpack-encode one value (bin type for bytes).

    One shared ``Packer``: ``msgpack.packb`` builds a new one per call, which costs more than the
    packing of these small values. ``Packer.pack`` runs in C holding the GIL, so sharing is safe.
    """
    return _packer.pack(value)


def unpack(raw: bytes) -> Any:
    """msgpack-decode one value (str for str, bytes for bin)."""
    return msgpack.unpackb(raw, raw=False)


def encode_meta(ts_ms: int, size: int, sha1: str) -> bytes:
    """Encode a ``meta`` value."""
    return pack([ts_ms, size, sha1])


def decode_meta(raw: bytes, data_id: str) -> dict[str, Any]:
    """Decode a ``meta`` value into ``{data_id, ts_ms, size, sha1}``."""
    ts_ms, size, sha1 = unpack(raw)
    return {"data_id": data_id, "ts_ms": ts_ms, "size": size, "sha1": sha1}


def encode_req(ts_ms: int, data_id: str, status: str, delivered_ts_ms: int | None = None) -> bytes:
    """Encode a ``reqs`` value."""
    return pack([ts_ms, data_id, status, delivered_ts_ms])


def decode_req(raw: bytes, request_id: str, vin: str) -> dict[str, Any]:
    """Decode a ``reqs`` value into ``{request_id, vin, ts_ms, data_id, status, delivered_ts_ms}``."""
    ts_ms, data_id, status, delivered = unpack(raw)
    return {
        "request_id": request_id,
        "vin": vin,
        "ts_ms": ts_ms,
        "data_id": data_id,
        "status": status,
        "delivered_ts_ms": delivered,
    }


def encode_user_properties(pairs: Any) -> bytes:
    """Encode a ``reqprops`` value: the (name, value) pairs in order."""
    return pack([[name, value] for name, value in pairs])


def decode_user_properties(raw: bytes) -> tuple[tuple[str, str], ...]:
    """Decode a ``reqprops`` value into ``((name, value), ...)``."""
    return tuple((name, value) for name, value in unpack(raw))


def encode_blob_props(content_type: str) -> bytes:
    """Encode a ``blobprops`` value."""
    return pack([content_type])


def decode_blob_props(raw: bytes) -> str:
    """Decode a ``blobprops`` value: the content type."""
    return unpack(raw)[0]


def encode_retained(topic: str, payload: bytes, qos: int, ts_ms: int) -> bytes:
    """Encode a ``retained`` value (the topic is kept: long topics are keyed by hash)."""
    return pack([topic, bytes(payload), qos, ts_ms])


def decode_retained(raw: bytes) -> dict[str, Any]:
    """Decode a ``retained`` value into ``{topic, payload, qos, ts_ms}``."""
    topic, payload, qos, ts_ms = unpack(raw)
    return {"topic": topic, "payload": payload, "qos": qos, "ts_ms": ts_ms}


def encode_metric(value: int | float | str, ts_ms: int) -> bytes:
    """Encode a ``metrics`` value."""
    return pack([value, ts_ms])


def decode_metric(raw: bytes, name: str) -> dict[str, Any]:
    """Decode a ``metrics`` value into ``{name, value, ts_ms}``."""
    value, ts_ms = unpack(raw)
    return {"name": name, "value": value, "ts_ms": ts_ms}


def decode_row(db: str, key: bytes, raw: bytes) -> dict[str, Any]:
    """Decode one stored ``(key, value)`` of table ``db`` into its row dict (fields ``ROW_FIELDS[db]``).

    Raises:
        ValueError: unknown table name.
    """
    if db == IDS:
        vin, ts_ms, request_id = keys.decode_ids_key(key)
        return {"vin": vin, "ts_ms": ts_ms, "request_id": request_id, "data_id": unpack(raw)}
    if db == REQS:
        request_id, vin = keys.decode_reqs_key(key)
        return decode_req(raw, request_id, vin)
    if db == META:
        return decode_meta(raw, bytes(key).decode("utf-8"))
    if db == DATA:
        return {"data_id": bytes(key).decode("utf-8"), "blob": bytes(raw)}
    if db == RETAINED:
        return decode_retained(raw)
    if db == METRICS:
        return decode_metric(raw, bytes(key).decode("utf-8"))
    if db == SYS:
        return {"name": bytes(key).decode("utf-8"), "value": unpack(raw)}
    if db == REQPROPS:
        return {"request_id": bytes(key).decode("utf-8"), "user_properties": decode_user_properties(raw)}
    if db == BLOBPROPS:
        return {"data_id": bytes(key).decode("utf-8"), "content_type": decode_blob_props(raw)}
    if db in _TOPIC_ROWS:
        return _TOPIC_ROWS[db](key, raw)
    if db == REQUESTS:
        request_id = bytes(key).decode("utf-8")
        return {"request_id": request_id, **dict(zip(ROW_FIELDS[REQUESTS][1:], unpack(raw)))}
    raise ValueError(f"unknown table {db!r}; tables are {', '.join(ALL_DBS)}")


_TOPIC_ROWS = {TOPICS: topics.catalog_row, TOPIC_LOG: topics.log_row, TOPIC_COUNTERS: topics.counter_row,
               TOPIC_OFFSETS: topics.offsets_row}


def check_db(db: str) -> str:
    """Return ``db`` if it names a table.

    Raises:
        ValueError: unknown table name.
    """
    if db not in ALL_DBS:
        raise ValueError(f"unknown table {db!r}; tables are {', '.join(ALL_DBS)}")
    return db
