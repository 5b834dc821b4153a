# Over 500 lines: the op catalogue, its builders, their validation and the wire form are one format, kept together.
"""WriteBatch: the unit of mutation and of replication.

Strategy: a batch is an ordered list of compact op tuples ``(opcode, *args)`` that
``ShardStore.apply`` executes in ONE LMDB write transaction together with the ``applied_seq`` bump;
replication ships exactly ``to_bytes()`` of the same batch, so a replica replays the same ops.
Everything an op needs is inside it (timestamps, the blob's SHA-1): applying it is deterministic, the
same bytes give the same tables on every replica.

Hot path: an ingest trigger names up to 1,000,000 VINs with one ``(ts_ms, request_id, data_id)``, so
consecutive ``enqueue`` calls with the same triple are coalesced into ONE op carrying the VIN list
(``enqueue_many`` builds it directly). That makes the batch ~18 bytes per VIN on the wire, lets
``to_bytes``/``from_bytes`` run at msgpack's C speed, and lets apply encode the shared parts of the
keys and values once. Builders validate their arguments (``ValueError``); ``from_bytes`` trusts the
primary and only checks the envelope.
"""
from __future__ import annotations

import gc
import hashlib
from collections import Counter
from contextlib import contextmanager
from operator import itemgetter
from typing import Any, Iterable, Iterator

import msgpack

from storage import keys, topics
from storage.errors import BatchFormatError

FORMAT_VERSION = 1

PUT_BLOB = 1  # (op, data_id, blob, ts_ms, sha1_hex)
TOUCH_META = 2  # (op, data_id, ts_ms)
ENQUEUE = 3  # (op, ts_ms, request_id, data_id, [vin, ...])
ACK = 4  # (op, vin, ts_ms, request_id, delivered_ts_ms)
DELETE_IDS = 5  # (op, vin, ts_ms, request_id)
DELETE_IDS_IF = 6  # (op, vin, ts_ms, request_id, expected_data_id)
DELETE_REQS = 7  # (op, request_id, vin)
DELETE_REQS_IF = 8  # (op, request_id, vin, expected_ts_ms, expected_status)
DELETE_BLOB = 9  # (op, data_id)
DELETE_BLOB_IF = 10  # (op, data_id, expected_ts_ms)
PUT_RETAINED = 11  # (op, topic, payload, qos, ts_ms)
DELETE_RETAINED = 12  # (op, topic)
PUT_METRIC = 13  # (op, name, value, ts_ms)
REPOINT_IDS_IF = 14  # (op, vin, ts_ms, request_id, expected_data_id, new_data_id)
DISCARD = 15  # (op, vin, ts_ms, request_id, discarded_ts_ms)
EXPIRE = 16  # (op, vin, ts_ms, request_id, expired_ts_ms)
SETTLE_PENDING = 17  # (op, request_id, status, ts_ms): every pending row of the request -> status (cancel, expiry)
SET_EXPIRY = 18  # (op, request_id, expires_ms)
SETTLE_IDS_IF = 19  # (op, vin, ts_ms, request_id, expected_data_id, status, settled_ts_ms)
SET_REQUEST_PROPS = 20  # (op, request_id, [[name, value], ...]): the trigger's MQTT 5 User Properties
SET_BLOB_PROPS = 21  # (op, data_id, content_type): the MQTT 5 Content Type of the blob's publish
CREATE_TOPIC = 22  # (op, name, filter, partitions, retention_ms, retention_bytes, key_level, ts_ms)
TOPIC_APPEND = 23  # (op, topic, partition, ts_ms, [[mqtt_topic, client_id, qos, payload, properties], ...])
TOPIC_COMMIT = 24  # (op, topic, group, partition, offset, ts_ms): stored = max(stored, offset)
TOPIC_RESET = 25  # (op, topic, group, partition, offset, ts_ms): stored = offset
TOPIC_PRUNE_IF = 26  # (op, topic, partition, below_offset): the GC drops entries with offset < below_offset

OP_NAMES: dict[int, str] = {
    PUT_BLOB: "put_blob",
    TOUCH_META: "touch_meta",
    ENQUEUE: "enqueue",
    ACK: "ack",
    DELETE_IDS: "delete_ids",
    DELETE_IDS_IF: "delete_ids_if",
    DELETE_REQS: "delete_reqs",
    DELETE_REQS_IF: "delete_reqs_if",
    DELETE_BLOB: "delete_blob",
    DELETE_BLOB_IF: "delete_blob_if",
    PUT_RETAINED: "put_retained",
    DELETE_RETAINED: "delete_retained",
    PUT_METRIC: "put_metric",
    REPOINT_IDS_IF: "repoint_ids_if",
    DISCARD: "discard",
    EXPIRE: "expire",
    SETTLE_PENDING: "settle_pending",
    SET_EXPIRY: "set_expiry",
    SETTLE_IDS_IF: "settle_ids_if",
    SET_REQUEST_PROPS: "set_request_props",
    SET_BLOB_PROPS: "set_blob_props",
    CREATE_TOPIC: "create_topic",
    TOPIC_APPEND: "topic_append",
    TOPIC_COMMIT: "topic_commit",
    TOPIC_RESET: "topic_reset",
    TOPIC_PRUNE_IF: "topic_prune_if",
}
SETTLE_STATUSES = ("cancelled", "expired")  # what settle_pending may set (storage.tables.STATUS_*)
GC_SETTLE_STATUSES = ("expired", "discarded")  # what settle_ids_if may set: past retention, blob gone

# Rough stored bytes per op (key + value + node headers, pages ~2/3 full); used to grow the map
# before a big batch instead of failing it once with MapFullError.
_EST_ENQUEUE_PER_VIN = 200
_EST_SMALL_OP = 160
_EST_TOPIC_ENTRY = 160  # a log entry's key, envelope and node headers besides its topic, client id and payload
_EST_RECEIPT = 220  # the receipts entry an outcome (ack, discard, expire, settle) appends
_FIRST = itemgetter(0)
_OUTCOME_OPS = frozenset((ACK, DISCARD, EXPIRE, SETTLE_IDS_IF))
_SIZED_OPS = frozenset((ENQUEUE, PUT_BLOB, PUT_RETAINED, TOPIC_APPEND))  # ops whose estimate depends on their size


@contextmanager
def gc_paused() -> Iterator[None]:
    """Pause the cyclic GC for a block that allocates millions of containers.

    Decoding or applying a 1M-op batch creates millions of lists/tuples; with the GC on, its
    generational passes re-traverse them over and over (measured: 2.8 s instead of 1.0 s to decode
    1M ack ops). Nothing in these blocks creates reference cycles.
    """
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()


class WriteBatch:
    """An ordered list of store mutations applied atomically in one transaction.

    Build with the verb methods (each returns ``self`` so calls can chain), then pass to
    ``ShardStore.apply``. ``to_bytes``/``from_bytes`` give the replication wire form.
    """

    __slots__ = ("ops",)

    def __init__(self, ops: list[Any] | None = None) -> None:
        """Args:
        ops: existing op tuples (used by ``from_bytes``); normally omitted.
        """
        self.ops: list[Any] = ops if ops is not None else []

    # -- data -------------------------------------------------------------------------------
    def put_blob(self, data_id: str, blob: bytes, ts_ms: int, content_type: str | None = None) -> WriteBatch:
        """Store a blob and its meta ``{ts_ms, size, sha1}``, and the Content Type of its publish.

        If ``meta`` already holds the same SHA-1, only ``meta.ts_ms`` is refreshed (to the later of
        the two times) and the blob is not rewritten. Either way the blob's content type becomes
        ``content_type`` (None: none), the one of its latest publish.

        Raises:
            ValueError: invalid data id, timestamp, content type, or a blob that is not bytes-like.
        """
        keys.check_data_id(data_id)
        keys.check_ts_ms(ts_ms)
        if not isinstance(blob, (bytes, bytearray, memoryview)):
            raise ValueError(f"blob must be bytes, got {type(blob).__name__}")
        if content_type is not None and not isinstance(content_type, str):
            raise ValueError(f"content_type must be a str, got {type(content_type).__name__}")
        blob = bytes(blob)
        self.ops.append((PUT_BLOB, data_id, blob, ts_ms, hashlib.sha1(blob).hexdigest()))
        if content_type is not None:
            self.ops.append((SET_BLOB_PROPS, data_id, content_type))
        return self

    def set_request_props(self, request_id: str, user_properties: Iterable[tuple[str, str]]) -> WriteBatch:
        """Record the MQTT 5 User Properties (in order) that ``request_id``'s deliveries carry (its trigger's;
        a later trigger of the request carrying some replaces them). Nothing is written for no properties.

        Raises:
            ValueError: invalid request id, or a property that is not a pair of strings.
        """
        keys.check_request_id(request_id)
        pairs = [[name, value] for name, value in user_properties]
        if any(type(name) is not str or type(value) is not str for name, value in pairs):
            raise ValueError("user properties must be (str, str) pairs")
        if pairs:
            self.ops.append((SET_REQUEST_PROPS, request_id, pairs))
        return self

    def touch_meta(self, data_id: str, ts_ms: int) -> WriteBatch:
        """Refresh ``meta.ts_ms`` of an existing blob (no-op if there is no meta).

        Raises:
            ValueError: invalid data id or timestamp.
        """
        keys.check_data_id(data_id)
        self.ops.append((TOUCH_META, data_id, keys.check_ts_ms(ts_ms)))
        return self

    def delete_blob(self, data_id: str) -> WriteBatch:
        """Delete a blob and its meta."""
        keys.check_data_id(data_id)
        self.ops.append((DELETE_BLOB, data_id))
        return self

    def delete_blob_if(self, data_id: str, expected_ts_ms: int) -> WriteBatch:
        """GC: delete a blob and its meta only if ``meta.ts_ms`` still equals ``expected_ts_ms``."""
        keys.check_data_id(data_id)
        self.ops.append((DELETE_BLOB_IF, data_id, keys.check_ts_ms(expected_ts_ms)))
        return self

    # -- queue --------------------------------------------------------------------------------
    def enqueue(self, vin: str, ts_ms: int, request_id: str, data_id: str) -> WriteBatch:
        """Queue ``data_id`` for ``vin`` unless the same (request_id, vin) already has that data_id.

        Consecutive calls with the same ``(ts_ms, request_id, data_id)`` share one op.

        Raises:
            ValueError: invalid VIN, timestamp, request id or data id.
        """
        keys.check_vin(vin)
        last = self.ops[-1] if self.ops else None
        if (
            last is not None
            and last[0] == ENQUEUE
            and last[1] == ts_ms
            and last[2] == request_id
            and last[3] == data_id
        ):
            last[4].append(vin)
            return self
        self._check_enqueue(ts_ms, request_id, data_id)
        self.ops.append((ENQUEUE, ts_ms, request_id, data_id, [vin]))
        return self

    def enqueue_many(self, vins: Iterable[str], ts_ms: int, request_id: str, data_id: str) -> WriteBatch:
        """Queue one data id for many VINs (one trigger's shard); same rules as ``enqueue``.

        Args:
            vins: the VINs (any order; duplicates are counted as duplicates at apply).
            ts_ms: trigger time in ms (orders the vehicle's queue).
            request_id: the trigger's request id.
            data_id: the blob to deliver.

        Raises:
            ValueError: invalid VIN, timestamp, request id or data id.
        """
        self._check_enqueue(ts_ms, request_id, data_id)
        vin_list = list(vins)
        keys.check_vins(vin_list)
        if vin_list:
            self.ops.append((ENQUEUE, ts_ms, request_id, data_id, vin_list))
        return self

    @staticmethod
    def _check_enqueue(ts_ms: int, request_id: str, data_id: str) -> None:
        keys.check_ts_ms(ts_ms)
        keys.check_request_id(request_id)
        keys.check_data_id(data_id)

    def ack(self, vin: str, ts_ms: int, request_id: str, delivered_ts_ms: int) -> WriteBatch:
        """A vehicle acknowledged a row: delete it from ``ids``; mark ``reqs`` delivered.

        Raises:
            ValueError: invalid arguments.
        """
        keys.ids_key(vin, ts_ms, request_id)
        self.ops.append((ACK, vin, ts_ms, request_id, keys.check_ts_ms(delivered_ts_ms, "delivered_ts_ms")))
        return self

    def ack_rows(self, row_keys: Iterable[bytes], delivered_ts_ms: int) -> WriteBatch:
        """``ack`` for rows named by their ``ids`` keys as read from the store (a dispatcher's acks).

        The keys came out of this table, so they are decoded, not re-validated part by part (that cost
        ~5 µs per ack in ``ack``); the ops are the same ``ACK`` tuples, so replication sees no difference.

        Raises:
            ValueError: a key that is not an ``ids`` key, or an invalid ``delivered_ts_ms``.
        """
        return self._finish_rows(ACK, row_keys, keys.check_ts_ms(delivered_ts_ms, "delivered_ts_ms"))

    def discard_rows(self, row_keys: Iterable[bytes], discarded_ts_ms: int) -> WriteBatch:
        """Rows dropped undelivered (their blob is gone): delete them from ``ids``; mark ``reqs`` discarded.

        Raises:
            ValueError: a key that is not an ``ids`` key, or an invalid ``discarded_ts_ms``.
        """
        return self._finish_rows(DISCARD, row_keys, keys.check_ts_ms(discarded_ts_ms, "discarded_ts_ms"))

    def expire_rows(self, row_keys: Iterable[bytes], expired_ts_ms: int) -> WriteBatch:
        """Rows not delivered within their request's ttl: delete them from ``ids``; mark ``reqs`` expired.

        Raises:
            ValueError: a key that is not an ``ids`` key, or an invalid ``expired_ts_ms``.
        """
        return self._finish_rows(EXPIRE, row_keys, keys.check_ts_ms(expired_ts_ms, "expired_ts_ms"))

    def settle_pending(self, request_id: str, status: str, ts_ms: int) -> WriteBatch:
        """Every pending row of ``request_id`` on the shard: ``ids`` row deleted, ``reqs`` row set to
        ``status`` (``"cancelled"`` by a cancel, ``"expired"`` by the GC cycle's expiry sweep). A row in
        flight is one of them: its PUBACK, if it comes, still records it delivered (``ack``).

        Raises:
            ValueError: invalid request id or timestamp, or a status not in :data:`SETTLE_STATUSES`.
        """
        keys.check_request_id(request_id)
        if status not in SETTLE_STATUSES:
            raise ValueError(f"settle_pending status must be one of {SETTLE_STATUSES}, got {status!r}")
        self.ops.append((SETTLE_PENDING, request_id, status, keys.check_ts_ms(ts_ms)))
        return self

    def set_expiry(self, request_id: str, expires_ms: int) -> WriteBatch:
        """Record that ``request_id``'s rows are not delivered after ``expires_ms`` (its trigger's ttl).

        Raises:
            ValueError: invalid request id or time.
        """
        keys.check_request_id(request_id)
        self.ops.append((SET_EXPIRY, request_id, keys.check_ts_ms(expires_ms, "expires_ms")))
        return self

    def _finish_rows(self, opcode: int, row_keys: Iterable[bytes], ts_ms: int) -> WriteBatch:
        append = self.ops.append
        # A tick acknowledges many rows of few (ts_ms, request) pairs: each key's tail is decoded once.
        tails: dict[bytes, tuple[int, str]] = {}
        for key in row_keys:
            cut = key.find(0)
            if cut <= 0 or len(key) <= cut + 9:
                raise ValueError(f"not an ids key: {key!r}")
            tail = key[cut + 1:]
            parts = tails.get(tail)
            if parts is None:
                parts = tails[tail] = (int.from_bytes(tail[:8], "big"), tail[8:].decode())
            append((opcode, key[:cut].decode("ascii"), parts[0], parts[1], ts_ms))
        return self

    def delete_ids(self, vin: str, ts_ms: int, request_id: str) -> WriteBatch:
        """Delete one ``ids`` row unconditionally."""
        keys.ids_key(vin, ts_ms, request_id)
        self.ops.append((DELETE_IDS, vin, ts_ms, request_id))
        return self

    def delete_ids_if(self, vin: str, ts_ms: int, request_id: str, expected_data_id: str) -> WriteBatch:
        """GC: delete one ``ids`` row only if it still points at ``expected_data_id``."""
        keys.ids_key(vin, ts_ms, request_id)
        keys.check_data_id(expected_data_id)
        self.ops.append((DELETE_IDS_IF, vin, ts_ms, request_id, expected_data_id))
        return self

    def settle_ids_if(self, vin: str, ts_ms: int, request_id: str, expected_data_id: str, status: str,
                      settled_ts_ms: int) -> WriteBatch:
        """GC: delete one ``ids`` row only if it still points at ``expected_data_id``, and settle its ``reqs``
        row as ``status`` (``"expired"``: older than the retention; ``"discarded"``: its blob is gone), so the
        request's counters move in the same transaction. The ``reqs`` row is settled only while it is pending
        and still describes this row (same ``ts_ms``; a re-queued VIN's row describes its newer row).

        Raises:
            ValueError: invalid arguments, or a status not in :data:`GC_SETTLE_STATUSES`.
        """
        keys.ids_key(vin, ts_ms, request_id)
        keys.check_data_id(expected_data_id)
        if status not in GC_SETTLE_STATUSES:
            raise ValueError(f"settle_ids_if status must be one of {GC_SETTLE_STATUSES}, got {status!r}")
        self.ops.append((SETTLE_IDS_IF, vin, ts_ms, request_id, expected_data_id, status,
                         keys.check_ts_ms(settled_ts_ms, "settled_ts_ms")))
        return self

    def repoint_ids_if(
        self, vin: str, ts_ms: int, request_id: str, expected_data_id: str, new_data_id: str
    ) -> WriteBatch:
        """GC (content dedup): point one ``ids`` row at ``new_data_id`` only if it still points at
        ``expected_data_id`` (a row acked or changed since the plan's snapshot is left alone, never
        re-created). The ``reqs`` row keeps the data id the platform named (idempotency key).
        """
        keys.ids_key(vin, ts_ms, request_id)
        keys.check_data_id(expected_data_id)
        keys.check_data_id(new_data_id)
        self.ops.append((REPOINT_IDS_IF, vin, ts_ms, request_id, expected_data_id, new_data_id))
        return self

    def delete_reqs(self, request_id: str, vin: str) -> WriteBatch:
        """Delete one ``reqs`` row unconditionally."""
        keys.reqs_key(request_id, vin)
        self.ops.append((DELETE_REQS, request_id, vin))
        return self

    def delete_reqs_if(self, request_id: str, vin: str, expected_ts_ms: int, expected_status: str) -> WriteBatch:
        """GC: delete one ``reqs`` row only if its ``ts_ms`` and ``status`` are still as seen."""
        keys.reqs_key(request_id, vin)
        keys.check_ts_ms(expected_ts_ms)
        self.ops.append((DELETE_REQS_IF, request_id, vin, expected_ts_ms, expected_status))
        return self

    # -- broker state --------------------------------------------------------------------------
    def put_retained(self, topic: str, payload: bytes, qos: int, ts_ms: int) -> WriteBatch:
        """Set the retained message of a topic.

        Raises:
            ValueError: bad topic, QoS not 0..2, payload not bytes-like, bad timestamp.
        """
        keys.retained_key(topic)
        if qos not in (0, 1, 2):
            raise ValueError(f"qos must be 0, 1 or 2, got {qos!r}")
        if not isinstance(payload, (bytes, bytearray, memoryview)):
            raise ValueError(f"payload must be bytes, got {type(payload).__name__}")
        self.ops.append((PUT_RETAINED, topic, bytes(payload), qos, keys.check_ts_ms(ts_ms)))
        return self

    def delete_retained(self, topic: str) -> WriteBatch:
        """Clear the retained message of a topic."""
        keys.retained_key(topic)
        self.ops.append((DELETE_RETAINED, topic))
        return self

    def put_metric(self, name: str, value: int | float | str, ts_ms: int) -> WriteBatch:
        """Upsert one metric (e.g. a ``$SYS`` statistic).

        Raises:
            ValueError: bad name, value not int/float/str, bad timestamp.
        """
        keys.name_key(name)
        if not isinstance(value, (int, float, str)) or isinstance(value, bool):
            raise ValueError(f"metric value must be int, float or str, got {type(value).__name__}")
        self.ops.append((PUT_METRIC, name, value, keys.check_ts_ms(ts_ms)))
        return self

    # -- durable topics (storage.topics validates) ---------------------------------------------
    def create_topic(self, spec: topics.TopicSpec, ts_ms: int) -> WriteBatch:
        """Upsert a topic's catalog row (an existing one keeps its partition count and creation time; the builder
        checks ``topics.check_create`` against the stored catalog first). Raises ValueError: invalid spec or time."""
        topics.check_spec(spec)
        self.ops.append((CREATE_TOPIC, spec.name, spec.filter, spec.partitions, spec.retention_ms,
                         spec.retention_bytes, spec.key_level, keys.check_ts_ms(ts_ms)))
        return self

    def topic_append(self, topic: str, partition: int, ts_ms: int, entries: Iterable[Any]) -> WriteBatch:
        """Append ``entries`` ``(mqtt_topic, client_id, qos, payload, properties)`` to one partition's log; offsets
        are assigned at apply (``ApplyResult.topic_offsets``). No entries: no op. Raises ValueError: invalid args."""
        topics.check_topic_name(topic)
        topics.check_partition(partition)
        keys.check_ts_ms(ts_ms)
        checked = topics.check_entries(entries)
        if checked:
            self.ops.append((TOPIC_APPEND, topic, partition, ts_ms, checked))
        return self

    def topic_commit(self, topic: str, group: str, partition: int, offset: int, ts_ms: int) -> WriteBatch:
        """``group`` processed ``partition`` up to ``offset`` (included); a commit never moves a group back.
        Raises ValueError: invalid arguments."""
        return self._group_offset(TOPIC_COMMIT, topic, group, partition, offset, ts_ms)

    def topic_reset(self, topic: str, group: str, partition: int, offset: int, ts_ms: int) -> WriteBatch:
        """Set ``group``'s committed offset of ``partition`` (it may move back). Raises ValueError: invalid args."""
        return self._group_offset(TOPIC_RESET, topic, group, partition, offset, ts_ms)

    def _group_offset(self, code: int, topic: str, group: str, partition: int, offset: int, ts_ms: int) -> WriteBatch:
        topics.offsets_key(topic, group, partition)
        self.ops.append((code, topic, group, partition, topics.check_offset(offset), keys.check_ts_ms(ts_ms)))
        return self

    def topic_prune_if(self, topic: str, partition: int, below_offset: int) -> WriteBatch:
        """GC: delete ``partition``'s entries with offset < ``below_offset`` (entries are immutable: the bound is
        the guard); the counter stays. Raises ValueError: invalid arguments."""
        topics.partition_prefix(topic, partition)
        self.ops.append((TOPIC_PRUNE_IF, topic, partition, topics.check_offset(below_offset, "below_offset")))
        return self

    # -- wire form and introspection -----------------------------------------------------------
    def to_bytes(self) -> bytes:
        """Serialise for replication (msgpack ``[version, ops]``)."""
        return msgpack.packb([FORMAT_VERSION, self.ops], use_bin_type=True)

    @classmethod
    def from_bytes(cls, raw: bytes) -> WriteBatch:
        """Rebuild a batch from ``to_bytes`` output.

        Raises:
            BatchFormatError: not msgpack, or not ``[FORMAT_VERSION, [op, ...]]``.
        """
        try:
            with gc_paused():
                decoded = msgpack.unpackb(raw, raw=False, use_list=True)
        except Exception as exc:  # msgpack raises several unrelated types
            raise BatchFormatError(f"write batch bytes are not msgpack: {exc}") from exc
        if not (isinstance(decoded, list) and len(decoded) == 2 and isinstance(decoded[1], list)):
            raise BatchFormatError("write batch bytes are not [version, ops]")
        if decoded[0] != FORMAT_VERSION:
            raise BatchFormatError(f"write batch format {decoded[0]!r}, this store reads {FORMAT_VERSION}")
        return cls(decoded[1])

    def counts(self) -> dict[str, int]:
        """Ops per verb (an enqueue op counts its VINs), for logging."""
        out: dict[str, int] = {}
        for op in self.ops:
            name = OP_NAMES.get(op[0], f"op{op[0]}")
            out[name] = out.get(name, 0) + (len(op[4]) if op[0] == ENQUEUE else 1)
        return out

    def space_estimate(self) -> tuple[int, int]:
        """Rough store space the batch needs, for growing the map before applying it.

        Returns:
            ``(new_bytes, touched_pages)``: bytes of rows added, and pages the ops may dirty (an
            update copies its leaf page; the caller caps this by the store's used size, since a
            transaction cannot dirty more pages than exist).
        """
        try:  # the common batch (a tick's acks) has small ops only: counted per opcode in C
            codes = Counter(map(_FIRST, self.ops))
        except (TypeError, IndexError):  # a malformed op: the loop below estimates it, apply reports it
            codes = None
        if codes is not None and _SIZED_OPS.isdisjoint(codes):
            outcomes = sum(n for code, n in codes.items() if code in _OUTCOME_OPS)
            return len(self.ops) * _EST_SMALL_OP + outcomes * _EST_RECEIPT, 2 * len(self.ops)
        new_bytes = pages = 0
        for op in self.ops:
            try:
                code = op[0]
                if code == ENQUEUE:
                    new_bytes += len(op[4]) * (_EST_ENQUEUE_PER_VIN + len(op[2]))
                    pages += 2 * len(op[4])
                elif code in (PUT_BLOB, PUT_RETAINED):
                    new_bytes += 2 * len(op[2]) + 8192
                elif code == TOPIC_APPEND:
                    new_bytes += sum(_EST_TOPIC_ENTRY + 2 * (len(e[0]) + len(e[1]) + len(e[3])) for e in op[4])
                    pages += 2
                else:
                    new_bytes += _EST_SMALL_OP + (_EST_RECEIPT if code in _OUTCOME_OPS else 0)
                    pages += 2
            except (TypeError, IndexError):  # malformed op: apply reports it
                new_bytes += _EST_SMALL_OP
        return new_bytes, pages

    def __len__(self) -> int:
        """Number of row-level ops (VINs of enqueue ops counted one by one)."""
        return sum(len(op[4]) if op[0] == ENQUEUE else 1 for op in self.ops)

    def __bool__(self) -> bool:
        return bool(self.ops)

    def __repr__(self) -> str:
        return f"WriteBatch({self.counts()})"
