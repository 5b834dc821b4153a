# Over 500 lines: the durable topics' stored format (catalog rows, validation, keys, values, the reads and scan rows of those tables) is one format, kept together; the writes are in topic_apply.py.
"""Durable topics in the store: the catalog, the per-partition logs, their counters and the groups' offsets.

Strategy (issue 14; the tables are listed in :mod:`storage.tables`):
- A durable topic is a catalog row (``topics``) plus, per partition, an append-only log (``topic_log``) whose
  offsets come from a counter (``topic_counters``) written in the same transaction as the entries. Offsets are
  assigned when the batch is APPLIED, from the counter stored in the shard: a replica applying the same batch
  bytes assigns the same offsets, so the logs stay byte-identical everywhere. The counter never goes back, also
  not when the GC prunes the oldest entries (``topic_prune_if``): an offset is never reused.
- Consumer groups commit the last offset they processed per partition (``topic_offsets``); a commit never
  moves a group back (``topic_commit`` keeps the max), ``topic_reset`` sets it.
- Partition ``p`` of every topic lives in shard ``p % shards`` (:func:`shard_of_partition`). A topic's partition
  key is the topic level of the filter's first ``+`` (``ecp/+/response`` -> the VIN), else the publishing
  client id; with the default one partition per shard, a vehicle's messages live in the shard of its rows.
- The built-in topic :data:`RECEIPTS` records each (request, VIN) delivery outcome, appended by the op that
  settles the row (:mod:`storage.topic_apply`). Its catalog row is implicit: :func:`read_specs` returns
  :data:`RECEIPTS` when no row is stored, so every store (old or new, primary or replica) has it from open
  without a write at open that replicas would have to agree on; ``create_topic(RECEIPTS-with-other-retention)``
  stores a row that then wins.

Keys (order-preserving, like :mod:`storage.keys`): ``topic_log`` = name + NUL + partition (u32 BE) + offset
(u64 BE), so one partition's entries are contiguous in offset order; ``topic_counters`` = name + NUL +
partition; ``topic_offsets`` = name + NUL + group + NUL + partition; ``topics`` = name. Names and groups never
contain NUL. This module imports only :mod:`storage.keys` and msgpack (:mod:`storage.tables` imports it).
"""
from __future__ import annotations

import re
import struct
import zlib
from dataclasses import dataclass
from typing import Any, Iterable

import lmdb
import msgpack

from storage import keys

SEP = keys.SEP
_U32 = struct.Struct(">I")
_U64 = struct.Struct(">Q")
_HEADERS = msgpack.Packer()  # pack_array_header: a packed page's array header
MAX_PARTITION = (1 << 32) - 1
MAX_PARTITIONS = 4096
MAX_FILTER_BYTES = 480
MAX_GROUP_BYTES = 128
MAX_MQTT_TOPIC_BYTES = 65535
TOPIC_NAME_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,127}")
KEEP_PROPERTIES = ("user_property", "content_type", "payload_format_indicator", "response_topic",
                   "correlation_data")
"""MQTT 5 properties worth keeping in an envelope (the names a caller uses in ``properties`` pairs)."""

RECEIPTS_NAME = "receipts"
RECEIPTS_TOPIC_PREFIX = "$SDV-FANOUT/receipts/"
RECEIPT_FIELDS = ("request_id", "vin", "data_id", "status", "ts_ms")

_packer = msgpack.Packer(use_bin_type=True)
pack = _packer.pack


def unpack(raw: bytes) -> Any:
    """msgpack-decode one stored value."""
    return msgpack.unpackb(raw, raw=False)


@dataclass(slots=True, frozen=True)
class TopicSpec:
    """A durable topic: ``partitions`` 0 = one per store shard; retention None = unbounded; ``key_level`` is the
    topic level holding the partition key (None: the publishing client id)."""

    name: str
    filter: str
    partitions: int = 0
    retention_ms: int | None = None
    retention_bytes: int | None = None
    key_level: int | None = None

    @classmethod
    def build(cls, name: str, filter: str, partitions: int = 0, retention_ms: int | None = None,
              retention_bytes: int | None = None, key_level: int | None | str = "default") -> TopicSpec:
        """A checked spec whose ``key_level`` defaults to the level of the filter's first ``+``.

        Raises:
            ValueError: an invalid field (the message names it).
        """
        if key_level == "default":
            key_level = default_key_level(filter)
        spec = cls(name, filter, partitions, retention_ms, retention_bytes, key_level)  # type: ignore[arg-type]
        check_spec(spec)
        return spec


RECEIPTS = TopicSpec(RECEIPTS_NAME, RECEIPTS_TOPIC_PREFIX + "+", 0, 7 * 86_400_000, 1 << 30, 2)
"""The built-in receipts topic: one partition per shard (partition = the shard of the row's VIN)."""


@dataclass(slots=True)
class LogEntry:
    """One entry of a topic partition's log, as read back."""

    topic: str
    partition: int
    offset: int
    ts_ms: int
    mqtt_topic: str
    client_id: str
    qos: int
    payload: bytes
    properties: list | None


# -- validation --------------------------------------------------------------------------------------------
def check_topic_name(name: str) -> bytes:
    """Validate a durable topic's name (``[A-Za-z0-9][A-Za-z0-9_.-]{0,127}``) and return its bytes.

    Raises:
        ValueError: not such a name.
    """
    if not isinstance(name, str) or TOPIC_NAME_RE.fullmatch(name) is None:
        raise ValueError(f"topic name must match {TOPIC_NAME_RE.pattern}, got {name!r}")
    return name.encode("ascii")


def check_group(group: str) -> bytes:
    """Validate a consumer group name (non-empty, no NUL, ``/``, ``+`` or ``#`` [MQTT-4.8.2-2], at most
    ``MAX_GROUP_BYTES`` UTF-8) and return its bytes.

    Raises:
        ValueError: not such a name.
    """
    raw = keys._check_text(group, "group", MAX_GROUP_BYTES)  # non-empty str, no NUL, length
    if any(c in group for c in "/+#"):
        raise ValueError(f"group must not contain '/', '+' or '#' [MQTT-4.8.2-2], got {group!r}")
    return raw


def check_partition(partition: int) -> int:
    """Raises ValueError unless ``partition`` is an int in 0..2**32-1."""
    if type(partition) is not int or not 0 <= partition <= MAX_PARTITION:
        raise ValueError(f"partition must be an int in 0..{MAX_PARTITION}, got {partition!r}")
    return partition


def check_offset(offset: int, name: str = "offset") -> int:
    """Raises ValueError unless ``offset`` is an int in 0..2**64-1."""
    if type(offset) is not int or not 0 <= offset <= keys.MAX_TS_MS:
        raise ValueError(f"{name} must be an int in 0..2**64-1, got {offset!r}")
    return offset


def check_filter(topic_filter: str) -> str:
    """Validate a durable topic's MQTT filter: ``+`` and ``#`` only as whole levels, ``#`` last [MQTT-4.7.1-2,
    MQTT-4.7.1-3], no NUL, no ``$share/`` prefix (the filter is what a group shares, not a shared filter).

    Raises:
        ValueError: an invalid filter.
    """
    if not isinstance(topic_filter, str) or not topic_filter or "\x00" in topic_filter:
        raise ValueError(f"filter must be a non-empty str without NUL, got {topic_filter!r}")
    if len(topic_filter.encode("utf-8")) > MAX_FILTER_BYTES:
        raise ValueError(f"filter longer than {MAX_FILTER_BYTES} bytes UTF-8: {topic_filter[:40]!r}...")
    if topic_filter.startswith("$share/"):
        raise ValueError(f"filter must not be a shared subscription: {topic_filter!r}")
    levels = topic_filter.split("/")
    for i, level in enumerate(levels):
        if "#" in level and (level != "#" or i != len(levels) - 1):
            raise ValueError(f"filter {topic_filter!r}: '#' must be the whole last level [MQTT-4.7.1-2]")
        if "+" in level and level != "+":
            raise ValueError(f"filter {topic_filter!r}: '+' must be a whole level [MQTT-4.7.1-3]")
    return topic_filter


def default_key_level(topic_filter: str) -> int | None:
    """The level of the filter's first ``+`` (``ecp/+/response`` -> 1), or None (key by client id)."""
    levels = topic_filter.split("/") if isinstance(topic_filter, str) else []
    return levels.index("+") if "+" in levels else None


def _check_optional_positive(value: Any, name: str) -> None:
    if value is not None and (type(value) is not int or value < 1):
        raise ValueError(f"{name} must be a positive int or None, got {value!r}")


def check_spec(spec: TopicSpec) -> TopicSpec:
    """Validate every field of a spec; the built-in ``receipts`` keeps its filter, partitions and key level.

    Raises:
        ValueError: an invalid field, named.
    """
    check_topic_name(spec.name)
    check_filter(spec.filter)
    if type(spec.partitions) is not int or not 0 <= spec.partitions <= MAX_PARTITIONS:
        raise ValueError(f"partitions must be an int in 0..{MAX_PARTITIONS} (0 = one per shard), "
                         f"got {spec.partitions!r}")
    _check_optional_positive(spec.retention_ms, "retention_ms")
    _check_optional_positive(spec.retention_bytes, "retention_bytes")
    if spec.key_level is not None and (type(spec.key_level) is not int or not
                                       0 <= spec.key_level < len(spec.filter.split("/"))):
        raise ValueError(f"key_level must be None or a level of the filter {spec.filter!r}, got {spec.key_level!r}")
    if spec.name == RECEIPTS_NAME and (spec.filter, spec.partitions, spec.key_level) != (
            RECEIPTS.filter, RECEIPTS.partitions, RECEIPTS.key_level):
        raise ValueError(f"the built-in topic {RECEIPTS_NAME!r} keeps filter {RECEIPTS.filter!r}, partitions 0 "
                         "and key_level 2 (only its retention may change)")
    return spec


def check_create(existing: TopicSpec | None, spec: TopicSpec, shards: int) -> None:
    """What the builder of a ``create_topic`` batch checks against the stored catalog first: a topic's
    partition count never changes (its messages' partitions would move), counted in real partitions.

    Raises:
        ValueError: ``spec`` changes the partition count of ``existing``.
    """
    check_spec(spec)
    if existing is not None and (existing.partitions or shards) != (spec.partitions or shards):
        raise ValueError(f"topic {spec.name!r} has {existing.partitions or shards} partitions; the partition count "
                         f"of a topic never changes (asked for {spec.partitions or shards})")


def check_entries(entries: Iterable[Any]) -> list[list[Any]]:
    """Validate append entries ``(mqtt_topic, client_id, qos, payload, properties)`` and return them as lists.

    Raises:
        ValueError: a malformed entry (its index is named).
    """
    out: list[list[Any]] = []
    for i, entry in enumerate(entries):
        try:
            mqtt_topic, client_id, qos, payload, properties = entry
        except (TypeError, ValueError):
            raise ValueError(f"entry {i}: must be (mqtt_topic, client_id, qos, payload, properties)") from None
        if not isinstance(mqtt_topic, str) or not mqtt_topic or "\x00" in mqtt_topic or len(
                mqtt_topic) > MAX_MQTT_TOPIC_BYTES:
            raise ValueError(f"entry {i}: mqtt_topic must be a non-empty topic name, got {mqtt_topic!r}")
        if not isinstance(client_id, str):
            raise ValueError(f"entry {i}: client_id must be a str, got {type(client_id).__name__}")
        if qos not in (0, 1, 2) or type(qos) is not int:
            raise ValueError(f"entry {i}: qos must be 0, 1 or 2, got {qos!r}")
        if not isinstance(payload, (bytes, bytearray, memoryview)):
            raise ValueError(f"entry {i}: payload must be bytes, got {type(payload).__name__}")
        if properties is not None:
            properties = _check_properties(properties, i)
        out.append([mqtt_topic, client_id, qos, bytes(payload), properties])
    return out


def _check_properties(properties: Any, i: int) -> list[list[Any]]:
    pairs: list[list[Any]] = []
    for pair in properties:
        try:
            name, value = pair
        except (TypeError, ValueError):
            raise ValueError(f"entry {i}: properties must be [name, value] pairs") from None
        if name not in KEEP_PROPERTIES:
            raise ValueError(f"entry {i}: property {name!r} is not kept; kept are {', '.join(KEEP_PROPERTIES)}")
        if isinstance(value, (list, tuple)):  # a user property: [key, value]
            if len(value) != 2 or not all(isinstance(v, str) for v in value):
                raise ValueError(f"entry {i}: {name} must be a (str, str) pair")
            value = list(value)
        elif not isinstance(value, (str, bytes, int)) or isinstance(value, bool):
            raise ValueError(f"entry {i}: property {name} must be str, bytes or int, got {type(value).__name__}")
        pairs.append([name, value])
    return pairs


def envelope_properties(props: Any) -> list[list[Any]] | None:
    """The ``properties`` of an entry from an MQTT 5 PUBLISH's properties object (any object with the attributes
    of ``fanout.mqtt.properties.Properties``: ``user_properties``, ``content_type``, ``payload_format_indicator``,
    ``response_topic``, ``correlation_data``); None for None (MQTT 3.1.1) or when none of them is set."""
    if props is None:
        return None
    out: list[list[Any]] = [["user_property", [k, v]] for k, v in getattr(props, "user_properties", ()) or ()]
    for name in KEEP_PROPERTIES[1:]:
        value = getattr(props, name, None)
        if value is not None:
            out.append([name, value])
    return out or None


# -- partitioning ----------------------------------------------------------------------------------------
def partition_for(spec: TopicSpec, mqtt_topic: str, client_id: str, shards: int) -> int:
    """The partition of one publish: ``crc32(key) % n``, ``n = spec.partitions or shards``, the key being the
    topic's level ``spec.key_level`` (the VIN of ``ecp/<VIN>/response``), else (no such level) the client id.

    Raises:
        ValueError: ``shards`` < 1.
    """
    if shards < 1:
        raise ValueError(f"shards must be >= 1, got {shards}")
    key = client_id
    if spec.key_level is not None:
        levels = mqtt_topic.split("/")
        if spec.key_level < len(levels):
            key = levels[spec.key_level]
    return zlib.crc32(key.encode()) % (spec.partitions or shards)


def shard_of_partition(partition: int, shards: int) -> int:
    """The shard holding partition ``partition`` of every topic: ``partition % shards``."""
    return partition % shards


def partition_count(spec: TopicSpec, shards: int) -> int:
    """The real number of partitions of a topic in a store of ``shards`` shards."""
    return spec.partitions or shards


# -- keys and values -------------------------------------------------------------------------------------
def partition_prefix(topic: str, partition: int) -> bytes:
    """``topic_log`` prefix of one partition (also the ``topic_counters`` key)."""
    return check_topic_name(topic) + SEP + _U32.pack(check_partition(partition))


counter_key = partition_prefix


def log_key(topic: str, partition: int, offset: int) -> bytes:
    """``topic_log`` key of one entry."""
    return partition_prefix(topic, partition) + _U64.pack(check_offset(offset))


def decode_log_key(key: bytes) -> tuple[str, int, int]:
    """``(topic, partition, offset)`` of a ``topic_log`` key."""
    key = bytes(key)
    cut = key.find(SEP)
    if cut <= 0 or len(key) != cut + 13:
        raise ValueError(f"not a topic_log key: {key!r}")
    return key[:cut].decode("ascii"), _U32.unpack_from(key, cut + 1)[0], _U64.unpack_from(key, cut + 5)[0]


def decode_counter_key(key: bytes) -> tuple[str, int]:
    """``(topic, partition)`` of a ``topic_counters`` key."""
    key = bytes(key)
    cut = key.find(SEP)
    if cut <= 0 or len(key) != cut + 5:
        raise ValueError(f"not a topic_counters key: {key!r}")
    return key[:cut].decode("ascii"), _U32.unpack_from(key, cut + 1)[0]


def group_prefix(topic: str, group: str | None = None) -> bytes:
    """``topic_offsets`` prefix of a topic's groups (or of one group)."""
    out = check_topic_name(topic) + SEP
    return out if group is None else out + check_group(group) + SEP


def offsets_key(topic: str, group: str, partition: int) -> bytes:
    """``topic_offsets`` key of one group's partition."""
    return group_prefix(topic, group) + _U32.pack(check_partition(partition))


def decode_offsets_key(key: bytes) -> tuple[str, str, int]:
    """``(topic, group, partition)`` of a ``topic_offsets`` key."""
    key = bytes(key)
    cut = key.find(SEP)
    cut2 = key.find(SEP, cut + 1)
    if cut <= 0 or cut2 <= cut + 1 or len(key) != cut2 + 5:
        raise ValueError(f"not a topic_offsets key: {key!r}")
    return key[:cut].decode("ascii"), key[cut + 1:cut2].decode("utf-8"), _U32.unpack_from(key, cut2 + 1)[0]


def encode_spec(spec: TopicSpec, created_ms: int) -> bytes:
    """A ``topics`` catalog value: ``[filter, partitions, retention_ms, retention_bytes, key_level, created_ms]``."""
    return pack([spec.filter, spec.partitions, spec.retention_ms, spec.retention_bytes, spec.key_level, created_ms])


def decode_spec(name: str, raw: bytes) -> tuple[TopicSpec, int]:
    """``(spec, created_ms)`` of a catalog value."""
    topic_filter, partitions, retention_ms, retention_bytes, key_level, created_ms = unpack(raw)
    return TopicSpec(name, topic_filter, partitions, retention_ms, retention_bytes, key_level), created_ms


def decode_entry(topic: str, partition: int, offset: int, raw: bytes) -> LogEntry:
    """A ``topic_log`` value ``[ts_ms, mqtt_topic, client_id, qos, payload, properties]`` as a :class:`LogEntry`."""
    ts_ms, mqtt_topic, client_id, qos, payload, properties = unpack(raw)
    return LogEntry(topic, partition, offset, ts_ms, mqtt_topic, client_id, qos, payload, properties)


# -- reads (inside a caller's read transaction; ShardReader wraps them) -------------------------------------
def read_specs(txn: lmdb.Transaction, db: Any) -> dict[str, TopicSpec]:
    """Every catalog row, plus the implicit :data:`RECEIPTS` when no row of it is stored."""
    out = {RECEIPTS_NAME: RECEIPTS}
    for key, raw in txn.cursor(db):
        name = bytes(key).decode("ascii")
        out[name] = decode_spec(name, raw)[0]
    return out


def read_counter(txn: lmdb.Transaction, db: Any, ckey: bytes) -> int:
    """The next offset to assign of a partition (0 when nothing was ever appended)."""
    raw = txn.get(ckey, db=db)
    return 0 if raw is None else unpack(raw)


def read_log(txn: lmdb.Transaction, db: Any, topic: str, partition: int, from_offset: int, limit: int,
             max_bytes: int | None) -> list[LogEntry]:
    """Up to ``limit`` entries from ``from_offset`` on, in offset order (pruned ones skipped); with ``max_bytes``,
    stop before the payloads pass it (at least one entry is returned)."""
    prefix = partition_prefix(topic, partition)
    out: list[LogEntry] = []
    if limit < 1:
        return out
    cur = txn.cursor(db)
    if not cur.set_range(prefix + _U64.pack(check_offset(from_offset, "from_offset"))):
        return out
    size = 0
    plen = len(prefix)
    for key, raw in cur:
        if not key.startswith(prefix):
            break
        entry = decode_entry(topic, partition, _U64.unpack_from(key, plen)[0], raw)
        size += len(entry.payload)
        if max_bytes is not None and out and size > max_bytes:
            break
        out.append(entry)
        if len(out) >= limit:
            break
    return out


def read_log_packed(txn: lmdb.Transaction, db: Any, topic: str, partition: int, from_offset: int, limit: int,
                    max_bytes: int | None) -> tuple[bytes, int]:
    """:func:`read_log`'s entries as ONE msgpack array of ``[offset, stored value]`` pairs, and how many.

    Why: a consumer's page crossed Ray as thousands of decoded tuples; decoding each stored value, building its
    tuple and pickling it was ~13 µs per entry on the dispatcher's event loop, most of a page's cost (py-spy of
    ``topics_bench``'s consumption). Here each pair is spliced from bytes the store already holds: the offset as
    a msgpack uint64 (``0xcf`` + the key's big-endian offset) and the stored value, itself a msgpack array; the
    consumer decodes the page in one ``msgpack.unpackb`` (:func:`fanout.topics.records.page_entries`).
    ``max_bytes`` bounds the stored bytes (payload and envelope), at least one entry.
    """
    prefix = partition_prefix(topic, partition)
    if limit < 1:
        return _HEADERS.pack_array_header(0), 0
    cur = txn.cursor(db)
    if not cur.set_range(prefix + _U64.pack(check_offset(from_offset, "from_offset"))):
        return _HEADERS.pack_array_header(0), 0
    parts: list[bytes] = []
    size = 0
    plen = len(prefix)
    end = plen + 8
    for key, raw in cur:
        if not key.startswith(prefix):
            break
        size += len(raw)
        if max_bytes is not None and parts and size > max_bytes:
            break
        parts.append(b"\x92\xcf" + key[plen:end] + raw)
        if len(parts) >= limit:
            break
    return _HEADERS.pack_array_header(len(parts)) + b"".join(parts), len(parts)


def read_bounds(txn: lmdb.Transaction, log_db: Any, counters_db: Any, topic: str, partition: int) -> tuple[int, int]:
    """``(low, next)``: the first retained offset (``next`` when the log is empty) and the next to assign."""
    prefix = partition_prefix(topic, partition)
    nxt = read_counter(txn, counters_db, prefix)
    cur = txn.cursor(log_db)
    if cur.set_range(prefix) and cur.key().startswith(prefix):
        return _U64.unpack_from(cur.key(), len(prefix))[0], nxt
    return nxt, nxt


def read_partitions(txn: lmdb.Transaction, log_db: Any, counters_db: Any, topic: str) -> dict[int, tuple[int, int]]:
    """``{partition: (low, next)}`` of every partition of ``topic`` this store ever appended to."""
    prefix = check_topic_name(topic) + SEP
    found: list[int] = []
    cur = txn.cursor(counters_db)
    if cur.set_range(prefix):
        for key in cur.iternext(values=False):
            if not key.startswith(prefix):
                break
            found.append(_U32.unpack_from(key, len(prefix))[0])
    return {p: read_bounds(txn, log_db, counters_db, topic, p) for p in found}


def read_committed(txn: lmdb.Transaction, db: Any, topic: str, group: str, partition: int) -> int | None:
    """The last offset ``group`` acknowledged in a partition, or None."""
    raw = txn.get(offsets_key(topic, group, partition), db=db)
    return None if raw is None else unpack(raw)[0]


def read_groups(txn: lmdb.Transaction, db: Any, topic: str) -> dict[str, dict[int, tuple[int, int]]]:
    """``{group: {partition: (offset, updated_ms)}}`` of a topic."""
    prefix = group_prefix(topic)
    out: dict[str, dict[int, tuple[int, int]]] = {}
    cur = txn.cursor(db)
    if cur.set_range(prefix):
        for key, raw in cur:
            if not key.startswith(prefix):
                break
            _, group, partition = decode_offsets_key(key)
            offset, updated_ms = unpack(raw)
            out.setdefault(group, {})[partition] = (offset, updated_ms)
    return out


# -- rows for scans and exports (storage.tables.decode_row) --------------------------------------------------
def catalog_row(key: bytes, raw: bytes) -> dict[str, Any]:
    """A ``topics`` row ``{name, filter, partitions, retention_ms, retention_bytes, key_level, created_ms}``."""
    name = bytes(key).decode("ascii")
    spec, created_ms = decode_spec(name, raw)
    return {"name": name, "filter": spec.filter, "partitions": spec.partitions, "retention_ms": spec.retention_ms,
            "retention_bytes": spec.retention_bytes, "key_level": spec.key_level, "created_ms": created_ms}


def log_row(key: bytes, raw: bytes) -> dict[str, Any]:
    """A ``topic_log`` row (the envelope's fields after ``topic, partition, offset``)."""
    topic, partition, offset = decode_log_key(key)
    ts_ms, mqtt_topic, client_id, qos, payload, properties = unpack(raw)
    return {"topic": topic, "partition": partition, "offset": offset, "ts_ms": ts_ms, "mqtt_topic": mqtt_topic,
            "client_id": client_id, "qos": qos, "payload": payload, "properties": properties}


def counter_row(key: bytes, raw: bytes) -> dict[str, Any]:
    """A ``topic_counters`` row ``{topic, partition, next_offset}``."""
    topic, partition = decode_counter_key(key)
    return {"topic": topic, "partition": partition, "next_offset": unpack(raw)}


def offsets_row(key: bytes, raw: bytes) -> dict[str, Any]:
    """A ``topic_offsets`` row ``{topic, group, partition, offset, updated_ms}``."""
    topic, group, partition = decode_offsets_key(key)
    offset, updated_ms = unpack(raw)
    return {"topic": topic, "group": group, "partition": partition, "offset": offset, "updated_ms": updated_ms}
