"""Apply the durable-topic ops of a WriteBatch, and append delivery receipts, inside the batch's transaction.

Strategy: the next offset of every partition a batch touches is read from ``topic_counters`` once, kept in the
:class:`TopicTally` of the transaction while the batch's ops run, and written back once at the end
(:meth:`TopicTally.flush`), like the request counters of :mod:`storage.request_stats`. Every offset therefore
comes from stored state and the batch's own ops only: a replica applying the same bytes assigns the same
offsets. Receipts (:meth:`TopicTally.receipt`) are entries of the built-in ``receipts`` topic in partition =
this store's shard id, with the settling op's time as their ``ts_ms``: no clock is read at apply.

Receipt cost (one per acknowledged delivery on the primary and on every replica, the hot path): the partition's key
prefix is built once per batch; the entry's bytes around the VIN (envelope, msgpack headers, JSON payload) once per
(request, data id, status, time, VIN length), since a tick acknowledges many rows of few requests at one time and a
VIN's bytes are the same in the topic and in the payload, so a receipt is one concatenation; the entries go to the
log in one ``putmulti`` and the counter is written once per batch.

Log pages (:func:`put_log`): a partition's new entries sort after all of its old ones, and usually after every key of
the table (by default a shard holds one partition of each topic, and many deployments have one topic: ``receipts``),
so they are put with LMDB's MDB_APPEND, which fills each leaf page before starting the next one. An ordinary put
splits a full leaf in the middle, so an append-only log kept its pages half full: ~1 KiB messages two to a 4 KiB
page instead of three, and every commit wrote and synced that many more pages, on the primary and on each replica.
"""
from __future__ import annotations

import json
from typing import Any

import lmdb
import structlog

from storage import keys, topics

log = structlog.get_logger(__name__)

_U64 = topics._U64
_pack = topics.pack
_TOPIC_PREFIX = topics.RECEIPTS_TOPIC_PREFIX
_EMPTY_STR_QOS1 = b"\xa0\x01"  # msgpack of "" (client_id) and 1 (qos)
_NIL = b"\xc0"  # msgpack of None (properties)
_PENDING_MAX = 65_536
_VIN_BYTES = keys.VIN_CHARS.encode()  # what a VIN is made of: letters, digits, "_" and "-", none escaped in JSON
_SEGMENTS_MAX = 4096  # receipt segment sets kept per transaction (a tick settles rows of few requests)


def _quote(text: str) -> str:
    """JSON string literal of ``text`` (the plain ids of the fleet skip the encoder)."""
    if text.isascii() and text.isprintable() and '"' not in text and "\\" not in text:
        return '"' + text + '"'
    return json.dumps(text)


class TopicTally:
    """The partition counters and appended offset ranges of one write transaction."""

    __slots__ = ("_next", "ranges", "_receipt_prefix", "_segments", "_pending", "_dbs")

    def __init__(self, dbs: Any, shard_id: int) -> None:
        self._dbs = dbs
        self._next: dict[bytes, int] = {}
        self.ranges: list[tuple[str, int, int, int]] = []
        """``(topic, partition, first, last)`` of each ``topic_append`` op, in batch order."""
        self._receipt_prefix = topics.partition_prefix(topics.RECEIPTS_NAME, shard_id)
        self._segments: dict[tuple[str, str, str, int, int], tuple[bytes, ...]] = {}
        """(request id, data id, status, time, VIN length) -> the entry's bytes around the VIN
        (:meth:`_receipt_segments`)."""
        self._pending: list[tuple[bytes, bytes]] = []

    def take(self, txn: lmdb.Transaction[bytes], prefix: bytes, n: int) -> int:
        """Reserve ``n`` offsets of the partition keyed ``prefix``; returns the first."""
        first = self._next.get(prefix)
        if first is None:
            first = topics.read_counter(txn, self._dbs.topic_counters, prefix)
        self._next[prefix] = first + n
        return first

    def current(self, txn: lmdb.Transaction[bytes], prefix: bytes) -> int:
        """The next offset of a partition as of this point of the transaction."""
        nxt = self._next.get(prefix)
        return topics.read_counter(txn, self._dbs.topic_counters, prefix) if nxt is None else nxt

    def receipt(self, txn: lmdb.Transaction[bytes], request_id: str, vin: str, data_id: str, status: str, ts_ms: int) -> None:
        """Append the receipt of one (request, VIN) outcome to ``receipts`` partition = this shard (written to the
        log at :meth:`write_pending`, before any other topic op of the batch and at its end)."""
        prefix = self._receipt_prefix
        nxt = self._next.get(prefix)
        if nxt is None:
            nxt = topics.read_counter(txn, self._dbs.topic_counters, prefix)
        self._next[prefix] = nxt + 1
        vb = vin.encode()
        # A VIN (storage.keys: letters, digits, "_", "-") needs no JSON escape: the same bytes in topic and payload.
        if vb.isalnum() or not vb.translate(None, _VIN_BYTES):
            segments = self._segments.get((request_id, data_id, status, ts_ms, len(vb)))
            if segments is None:
                segments = self._receipt_segments(request_id, data_id, status, ts_ms, len(vb))
            value = segments[0] + vb + segments[1] + vb + segments[2]
        else:
            head, tail, envelope_head = _receipt_parts(request_id, data_id, status, ts_ms)
            value = (envelope_head + _pack(_TOPIC_PREFIX + vin) + _EMPTY_STR_QOS1
                     + _pack(head + json.dumps(vin)[1:-1].encode() + tail) + _NIL)
        # the bytes of pack([ts_ms, "$SDV-FANOUT/receipts/<vin>", "", 1, payload, None])
        pending = self._pending
        pending.append((prefix + _U64.pack(nxt), value))
        if len(pending) >= _PENDING_MAX:  # a cancel of a huge request: bound the memory, not the transaction
            self.write_pending(txn)

    def _receipt_segments(self, request_id: str, data_id: str, status: str, ts_ms: int, n: int) -> tuple[bytes, ...]:
        """The receipt entry's bytes around the two copies of an ``n``-byte VIN (topic, then payload): the
        msgpack headers depend on the VIN's length only, so they are packed once, from a stand-in VIN."""
        if len(self._segments) >= _SEGMENTS_MAX:
            self._segments.clear()
        head, tail, envelope_head = _receipt_parts(request_id, data_id, status, ts_ms)
        topic_len, payload_len = len(_TOPIC_PREFIX) + n, len(head) + n + len(tail)
        topic_header = _pack("x" * topic_len)[:-topic_len]
        payload_header = _pack(b"x" * payload_len)[:-payload_len]
        segments = (envelope_head + topic_header + _TOPIC_PREFIX.encode(), _EMPTY_STR_QOS1 + payload_header + head,
                    tail + _NIL)
        self._segments[(request_id, data_id, status, ts_ms, n)] = segments
        return segments

    def write_pending(self, txn: lmdb.Transaction[bytes]) -> None:
        """Put the receipts appended so far into the log (one C-level ``putmulti``)."""
        if self._pending:
            put_log(txn.cursor(self._dbs.topic_log), self._pending)
            self._pending.clear()

    def flush(self, txn: lmdb.Transaction[bytes]) -> None:
        """Write the pending receipts and the counters of the partitions this transaction appended to."""
        self.write_pending(txn)
        db = self._dbs.topic_counters
        for prefix, nxt in self._next.items():
            txn.put(prefix, topics.pack(nxt), db=db)
        self._next.clear()


def _receipt_parts(request_id: str, data_id: str, status: str, ts_ms: int) -> tuple[bytes, bytes, bytes]:
    """The receipt payload around the VIN, and the envelope's head (msgpack array of 6 + ts_ms)."""
    head = '{"request_id":%s,"vin":"' % _quote(request_id)
    tail = '","data_id":%s,"status":"%s","ts_ms":%d}' % (_quote(data_id), status, ts_ms)
    return head.encode(), tail.encode(), b"\x96" + _pack(ts_ms)


Counts = dict[str, int]


def _inc(counts: Counts, name: str, n: int = 1) -> None:
    counts[name] = counts.get(name, 0) + n


def create_topic(txn: lmdb.Transaction[bytes], dbs: Any, op: Any, counts: Counts, tt: TopicTally) -> None:
    """Upsert a catalog row; an existing topic keeps its partition count and creation time."""
    _, name, topic_filter, partitions, retention_ms, retention_bytes, key_level, ts_ms = op
    key = name.encode()
    raw = txn.get(key, db=dbs.topics)
    created_ms = ts_ms
    if raw is not None:
        old, created_ms = topics.decode_spec(name, raw)
        partitions = old.partitions
    spec = topics.TopicSpec(name, topic_filter, partitions, retention_ms, retention_bytes, key_level)
    txn.put(key, topics.encode_spec(spec, created_ms), db=dbs.topics)
    _inc(counts, "topic_created" if raw is None else "topic_updated")


def topic_append(txn: lmdb.Transaction[bytes], dbs: Any, op: Any, counts: Counts, tt: TopicTally) -> None:
    """Entries at the partition's next offsets (the op's time is their ``ts_ms``)."""
    _, topic, partition, ts_ms, entries = op
    prefix = topics.partition_prefix(topic, partition)
    first = tt.take(txn, prefix, len(entries))
    pack, u64 = topics.pack, _U64.pack
    put_log(txn.cursor(dbs.topic_log),
            [(prefix + u64(first + i), pack([ts_ms, *entry])) for i, entry in enumerate(entries)])
    tt.ranges.append((topic, partition, first, first + len(entries) - 1))
    _inc(counts, "topic_appended", len(entries))


def put_log(cur: lmdb.Cursor[bytes], entries: list[tuple[bytes, bytes]]) -> None:
    """Put ``entries`` (keys ascending, none stored yet) into the ``topic_log`` table of ``cur``: appended (MDB_APPEND,
    full pages) when all of them sort after the table's last key, else by ordinary puts."""
    if not entries:
        return
    if cur.last() and cur.key() >= entries[0][0]:
        cur.putmulti(entries)
        return
    if cur.putmulti(entries, append=True)[1] != len(entries):
        # MDB_APPEND skips, without an error, a key that does not sort after the last one; entries out of order
        # are a caller's bug, but none may be lost for it: the ordinary put stores what the append skipped.
        log.error("topic log entries not in key order: stored by ordinary puts", entries=len(entries))
        cur.putmulti(entries)


def topic_commit(txn: lmdb.Transaction[bytes], dbs: Any, op: Any, counts: Counts, tt: TopicTally) -> None:
    """A group's offset moves forward only."""
    _, topic, group, partition, offset, ts_ms = op
    key = topics.offsets_key(topic, group, partition)
    raw = txn.get(key, db=dbs.topic_offsets)
    if raw is not None and topics.unpack(raw)[0] >= offset:
        _inc(counts, "topic_commit_behind")
        return
    txn.put(key, topics.pack([offset, ts_ms]), db=dbs.topic_offsets)
    _inc(counts, "topic_committed")


def topic_reset(txn: lmdb.Transaction[bytes], dbs: Any, op: Any, counts: Counts, tt: TopicTally) -> None:
    """A group's offset is set, also backwards."""
    _, topic, group, partition, offset, ts_ms = op
    txn.put(topics.offsets_key(topic, group, partition), topics.pack([offset, ts_ms]), db=dbs.topic_offsets)
    _inc(counts, "topic_reset")


def topic_prune_if(txn: lmdb.Transaction[bytes], dbs: Any, op: Any, counts: Counts, tt: TopicTally) -> None:
    """Delete a partition's entries below an offset (never the counter: offsets are not reused)."""
    _, topic, partition, below = op
    prefix = topics.partition_prefix(topic, partition)
    end = prefix + _U64.pack(below)
    cur = txn.cursor(dbs.topic_log)
    pruned = 0
    if cur.set_range(prefix):
        while True:
            key = cur.key()
            if not key.startswith(prefix) or key >= end:
                break
            pruned += 1
            if not cur.delete():  # delete moves to the next entry; False when it was the last
                break
    _inc(counts, "topic_pruned", pruned)
