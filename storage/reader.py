"""Read verbs of a shard store: short read transactions, a missing key is ``None``.

Strategy: every verb runs in one short read transaction taken by ``_read`` under the store's
shared ``ResizeGuard`` (a map resize kills open transactions, see ``storage.guard``); when another
process grew the map (``MapResizedError``, e.g. a read-only inspector next to the live store) the
new size is adopted and the read retried once. Queue reads are cursor range scans over one VIN's
key prefix (``storage.keys``), so they return rows oldest first and never cross into another VIN.
Whole-table reads are incremental: ``scan`` does one bounded step per transaction and returns the
cursor to resume from.
"""
from __future__ import annotations

import threading
from typing import Any, Callable, Iterable, NamedTuple, TypeVar

import lmdb

from storage import keys, request_stats, tables, topics
from storage.guard import ResizeGuard

_T = TypeVar("_T")


class QueueRow(NamedTuple):
    """One pending ``ids`` row; ``key`` is the cursor to pass as ``after_key`` for the next row."""

    key: bytes
    vin: str
    ts_ms: int
    request_id: str
    data_id: str


class ShardReader:
    """Read verbs; mixed into ``ShardStore``, which provides the environment and handles."""

    _guard: ResizeGuard
    _write_lock: threading.RLock
    _handles: dict[str, Any]
    _dbs: Any
    shard_id: int
    path: Any

    def _live_env(self) -> lmdb.Environment:
        raise NotImplementedError

    def _resize(self, new_size: int, reason: str = "adopt") -> None:
        raise NotImplementedError

    def _map_sizes(self) -> tuple[int, int]:
        raise NotImplementedError

    _max_map: int

    def _read(self, fn: Callable[[lmdb.Transaction], _T]) -> _T:
        """Run ``fn`` in a short read transaction under the shared resize guard."""
        for attempt in (0, 1):
            env = self._live_env()
            guard = self._guard
            guard.acquire_shared()
            try:
                with env.begin() as txn:
                    return fn(txn)
            except lmdb.MapResizedError:
                if attempt:
                    raise
            finally:
                guard.release_shared()
            with self._write_lock:  # another process grew the map: adopt its size, then retry
                self._resize(0)
        raise AssertionError("unreachable")

    def get_blob(self, data_id: str) -> bytes | None:
        """The blob of ``data_id``, or None."""
        key = keys.data_key(data_id)
        return self._read(lambda txn: txn.get(key, db=self._dbs.data))

    def get_content_type(self, data_id: str) -> str | None:
        """The MQTT 5 Content Type of the blob's latest publish, or None."""
        key = keys.data_key(data_id)
        raw = self._read(lambda txn: txn.get(key, db=self._dbs.blobprops))
        return None if raw is None else tables.decode_blob_props(raw)

    def get_user_properties(self, request_id: str) -> tuple[tuple[str, str], ...]:
        """The MQTT 5 User Properties ``request_id``'s deliveries carry (empty: none)."""
        key = request_id.encode()
        raw = self._read(lambda txn: txn.get(key, db=self._dbs.reqprops))
        return () if raw is None else tables.decode_user_properties(raw)

    def user_properties_all(self) -> dict[str, tuple[tuple[str, str], ...]]:
        """``{request_id: user properties}`` of every request that has some."""
        decode = tables.decode_user_properties
        return self._read(lambda txn: {bytes(k).decode("utf-8"): decode(v) for k, v in txn.cursor(self._dbs.reqprops)})

    def get_meta(self, data_id: str) -> dict[str, Any] | None:
        """``{data_id, ts_ms, size, sha1}`` of a blob, or None."""
        key = keys.data_key(data_id)
        raw = self._read(lambda txn: txn.get(key, db=self._dbs.meta))
        return None if raw is None else tables.decode_meta(raw, data_id)

    def next_rows(self, vin: str, limit: int = 1, after_key: bytes | None = None) -> list[QueueRow]:
        """Oldest pending rows of one VIN, by ``(ts_ms, request_id)``.

        Args:
            vin: the vehicle.
            limit: at most this many rows.
            after_key: resume strictly after this row key (a previous ``QueueRow.key``).

        Returns:
            Up to ``limit`` rows, oldest first; ``[]`` when the queue is empty.

        Raises:
            ValueError: invalid VIN, or ``after_key`` not of this VIN.
        """
        prefix = keys.vin_prefix(vin)
        if after_key is not None and not after_key.startswith(prefix):
            raise ValueError(f"after_key {after_key!r} is not a row of vin {vin!r}")
        return self._read(lambda txn: _rows_of(txn.cursor(self._dbs.ids), prefix, vin, limit, after_key))

    def next_rows_many(self, vins: Iterable[str], limit: int = 1) -> dict[str, list[QueueRow]]:
        """``next_rows`` for many VINs in one read transaction (VINs with no rows are left out)."""
        prefixes = [(vin, keys.vin_prefix(vin)) for vin in vins]

        def read(txn: lmdb.Transaction) -> dict[str, list[QueueRow]]:
            cur = txn.cursor(self._dbs.ids)
            out = {}
            for vin, prefix in prefixes:
                rows = _rows_of(cur, prefix, vin, limit, None)
                if rows:
                    out[vin] = rows
            return out

        return self._read(read)

    def pending_count(self, vin: str | None = None) -> int:
        """Pending ``ids`` rows of one VIN, or of the whole shard when ``vin`` is None."""
        if vin is None:
            return self._read(lambda txn: int(txn.stat(self._dbs.ids)["entries"]))
        prefix = keys.vin_prefix(vin)

        def count(txn: lmdb.Transaction) -> int:
            cur = txn.cursor(self._dbs.ids)
            n = 0
            if cur.set_range(prefix):
                for key in cur.iternext(keys=True, values=False):
                    if not key.startswith(prefix):
                        break
                    n += 1
            return n

        return self._read(count)

    def get_req(self, request_id: str, vin: str) -> dict[str, Any] | None:
        """The ``reqs`` row of ``(request_id, vin)`` or None."""
        key = keys.reqs_key(request_id, vin)
        raw = self._read(lambda txn: txn.get(key, db=self._dbs.reqs))
        return None if raw is None else tables.decode_req(raw, request_id, vin)

    def request_rows(self, request_id: str, limit: int | None = None) -> list[dict[str, Any]]:
        """All ``reqs`` rows of one request on this shard, by VIN (at most ``limit``)."""
        prefix = keys.request_prefix(request_id)

        def read(txn: lmdb.Transaction) -> list[dict[str, Any]]:
            cur = txn.cursor(self._dbs.reqs)
            rows: list[dict[str, Any]] = []
            if cur.set_range(prefix):
                for key, raw in cur:
                    if not key.startswith(prefix) or (limit is not None and len(rows) >= limit):
                        break
                    rows.append(tables.decode_req(raw, request_id, key[len(prefix):].decode("ascii")))
            return rows

        return self._read(read)

    def request_conflict(self, request_id: str, data_id: str, vins: list[str]) -> tuple[str, str] | None:
        """The first of ``vins`` whose ``reqs`` row of ``request_id`` names another data id.

        Returns:
            ``(vin, other_data_id)``, or None when every existing row names ``data_id`` (or none exists).
        """
        prefix = keys.request_prefix(request_id)
        rkeys = [prefix + vin.encode() for vin in vins]

        def read(txn: lmdb.Transaction) -> tuple[str, str] | None:
            for key, raw in txn.cursor(self._dbs.reqs).getmulti(rkeys):
                other = tables.unpack(raw)[1]
                if other != data_id:
                    return key[len(prefix):].decode("ascii"), other
            return None

        return self._read(read)

    def request_counters(self, request_id: str) -> dict[str, Any] | None:
        """The lifecycle counters of one request on this shard (``storage.request_stats``), or None."""
        keys.check_request_id(request_id)
        return self._read(lambda txn: request_stats.read_one(txn, self._dbs.requests, request_id))

    def request_counters_all(self, limit: int | None = None) -> list[dict[str, Any]]:
        """The counters of every request known to this shard, by request id (at most ``limit``)."""
        return self._read(lambda txn: list(request_stats.iter_all(txn, self._dbs.requests, limit)))

    def request_states(self, limit: int | None = None) -> list[tuple[str, int, int, int]]:
        """``(request_id, pending, cancelled, expired)`` of every request known to this shard (at most ``limit``)."""
        return self._read(lambda txn: list(request_stats.iter_states(txn, self._dbs.requests, limit)))

    def get_retained_all(self) -> list[dict[str, Any]]:
        """Every retained message ``{topic, payload, qos, ts_ms}``."""
        return self._read(lambda txn: [tables.decode_retained(v) for _, v in txn.cursor(self._dbs.retained)])

    def get_metrics_all(self) -> list[dict[str, Any]]:
        """Every stored metric ``{name, value, ts_ms}``."""
        return self._read(
            lambda txn: [tables.decode_metric(v, bytes(k).decode()) for k, v in txn.cursor(self._dbs.metrics)]
        )

    # -- durable topics (storage.topics) ----------------------------------------------------------
    def topic_specs(self) -> dict[str, topics.TopicSpec]:
        """Every durable topic by name, the built-in ``receipts`` included."""
        return self._read(lambda txn: topics.read_specs(txn, self._dbs.topics))

    def topic_read(self, topic: str, partition: int, from_offset: int, limit: int,
                   max_bytes: int | None = None) -> list[topics.LogEntry]:
        """Up to ``limit`` entries of a partition from ``from_offset`` on, in offset order (pruned ones skipped);
        with ``max_bytes``, no more payload bytes than that (but at least one entry).

        Raises:
            ValueError: an invalid topic name, partition or offset.
        """
        return self._read(lambda txn: topics.read_log(txn, self._dbs.topic_log, topic, partition, from_offset,
                                                      limit, max_bytes))

    def topic_read_packed(self, topic: str, partition: int, from_offset: int, limit: int,
                          max_bytes: int | None = None) -> tuple[bytes, int]:
        """:meth:`topic_read` as one packed page and its entry count (:func:`storage.topics.read_log_packed`).

        Raises:
            ValueError: an invalid topic name, partition or offset.
        """
        return self._read(lambda txn: topics.read_log_packed(txn, self._dbs.topic_log, topic, partition, from_offset,
                                                             limit, max_bytes))

    def topic_read_many(self, requests: Iterable[tuple[str, int, int, int]],
                        max_bytes: int | None = None) -> list[list[topics.LogEntry]]:
        """``topic_read`` of many ``(topic, partition, from_offset, limit)`` in ONE read transaction (a tick's
        reads for its consumers); ``max_bytes`` bounds each request's payloads.

        Raises:
            ValueError: an invalid topic name, partition or offset.
        """
        reqs = list(requests)
        log_db = self._dbs.topic_log
        return self._read(lambda txn: [topics.read_log(txn, log_db, topic, partition, start, limit, max_bytes)
                                       for topic, partition, start, limit in reqs])

    def topic_partitions(self, topic: str) -> dict[int, tuple[int, int]]:
        """``{partition: (low, next)}`` of the partitions of ``topic`` in this store that were ever appended to
        (high offset and retained range for ``fanout status`` and lag)."""
        return self._read(lambda txn: topics.read_partitions(txn, self._dbs.topic_log, self._dbs.topic_counters,
                                                             topic))

    def topic_bounds(self, topic: str, partition: int) -> tuple[int, int]:
        """``(low, next)``: a partition's first retained offset (``next`` when empty) and next offset to assign."""
        return self._read(lambda txn: topics.read_bounds(txn, self._dbs.topic_log, self._dbs.topic_counters, topic,
                                                         partition))

    def topic_committed(self, topic: str, group: str, partition: int) -> int | None:
        """The last offset ``group`` acknowledged in a partition, or None."""
        return self._read(lambda txn: topics.read_committed(txn, self._dbs.topic_offsets, topic, group, partition))

    def topic_groups(self, topic: str) -> dict[str, dict[int, tuple[int, int]]]:
        """``{group: {partition: (last acknowledged offset, updated_ms)}}`` of a topic."""
        return self._read(lambda txn: topics.read_groups(txn, self._dbs.topic_offsets, topic))

    @property
    def applied_seq(self) -> int:
        """Seq of the last applied batch (0 for a new store)."""
        return self._read(lambda txn: _get_int(txn, self._dbs.sys, tables.SYS_APPLIED_SEQ))

    @property
    def epoch(self) -> int:
        """Highest epoch this store has seen (0 for a new store)."""
        return self._read(lambda txn: _get_int(txn, self._dbs.sys, tables.SYS_EPOCH))

    def stats(self) -> dict[str, Any]:
        """Entries per table, map size, used bytes, seq, epoch, readers."""
        map_size, used = self._map_sizes()

        def read(txn: lmdb.Transaction) -> dict[str, Any]:
            return {
                "shard_id": self.shard_id,
                "path": str(self.path),
                "entries": {name: int(txn.stat(self._handles[name])["entries"]) for name in tables.ALL_DBS},
                "map_size_bytes": map_size,
                "max_map_size_bytes": self._max_map,
                "used_bytes": used,
                "applied_seq": _get_int(txn, self._dbs.sys, tables.SYS_APPLIED_SEQ),
                "epoch": _get_int(txn, self._dbs.sys, tables.SYS_EPOCH),
                "readers": int(self._live_env().info()["num_readers"]),
            }

        return self._read(read)

    def scan(self, db: str, cursor: bytes | None = None, limit: int = 1000) -> tuple[list[dict[str, Any]], bytes | None]:
        """One incremental step over table ``db`` in its own short read transaction.

        Args:
            db: table name.
            cursor: ``None`` to start, else the ``next_cursor`` of the previous step.
            limit: rows per step.

        Returns:
            ``(rows, next_cursor)``; ``next_cursor`` is None when the table is exhausted.

        Raises:
            ValueError: unknown table or limit < 1.
        """
        handle = self._handles[tables.check_db(db)]
        if limit < 1:
            raise ValueError(f"limit must be >= 1, got {limit}")

        def step(txn: lmdb.Transaction) -> tuple[list[dict[str, Any]], bytes | None]:
            cur = txn.cursor(handle)
            if not (cur.set_range(cursor) if cursor is not None else cur.first()):
                return [], None
            rows, last = [], b""
            for key, value in cur:
                rows.append(tables.decode_row(db, key, value))
                last = key
                if len(rows) >= limit:
                    return rows, (keys.key_after(last) if cur.next() else None)
            return rows, None

        return self._read(step)


def _get_int(txn: lmdb.Transaction, db: Any, key: bytes) -> int:
    raw = txn.get(key, db=db)
    return 0 if raw is None else int(tables.unpack(raw))


def _rows_of(cur: lmdb.Cursor, prefix: bytes, vin: str, limit: int, after_key: bytes | None) -> list[QueueRow]:
    rows: list[QueueRow] = []
    if limit < 1 or not cur.set_range(keys.key_after(after_key) if after_key is not None else prefix):
        return rows
    plen = len(prefix)
    key = cur.key()
    while key.startswith(prefix):  # cursor steps, not iteration: limit=1 is the common case
        rows.append(QueueRow(key, vin, int.from_bytes(key[plen:plen + 8], "big"), key[plen + 8:].decode(),
                             tables.unpack(cur.value())))
        if len(rows) >= limit or not cur.next():
            break
        key = cur.key()
    return rows
