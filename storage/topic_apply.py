"""Apply the durable-topic ops of a WriteBatch, and append delivery receipts, inside the batch's transaction.

Strategy: the next offset of every partition a batch touches is read from ``topic_counters`` once, kept in the
:class:`TopicTally` of the transaction while the batch's ops run, and written back once at the end
(:meth:`TopicTally.flush`), like the request counters of :mod:`storage.request_stats`. Every offset therefore
comes from stored state and the batch's own ops only: a replica applying the same bytes assigns the same
offsets. Receipts (:meth:`TopicTally.receipt`) are entries of the built-in ``receipts`` topic in partition =
this store's shard id, with the settling op's time as their ``ts_ms``: no clock is read at apply.

Receipt cost (one per acknowledged delivery, the hot path): the partition's key prefix is built once per store,
the JSON-quoted request and data ids once per batch (a tick acknowledges many rows of few requests), and one
``put`` and one msgpack pack per receipt; the counter is written once per batch.
"""
from __future__ import annotations

import json
from typing import Any

import lmdb

from storage import topics

_U64 = topics._U64
_RECEIPT = '{"request_id":%s,"vin":%s,"data_id":%s,"status":"%s","ts_ms":%d}'


def _quote(text: str) -> str:
    """JSON string literal of ``text`` (the plain ids of the fleet skip the encoder)."""
    if text.isascii() and text.isprintable() and '"' not in text and "\\" not in text:
        return '"' + text + '"'
    return json.dumps(text)


class TopicTally:
    """The partition counters and appended offset ranges of one write transaction."""

    __slots__ = ("_next", "ranges", "_receipt_prefix", "_quoted", "_dbs")

    def __init__(self, dbs: Any, shard_id: int) -> None:
        self._dbs = dbs
        self._next: dict[bytes, int] = {}
        self.ranges: list[tuple[str, int, int, int]] = []
        """``(topic, partition, first, last)`` of each ``topic_append`` op, in batch order."""
        self._receipt_prefix = topics.partition_prefix(topics.RECEIPTS_NAME, shard_id)
        self._quoted: dict[str, str] = {}

    def take(self, txn: lmdb.Transaction, prefix: bytes, n: int) -> int:
        """Reserve ``n`` offsets of the partition keyed ``prefix``; returns the first."""
        first = self._next.get(prefix)
        if first is None:
            first = topics.read_counter(txn, self._dbs.topic_counters, prefix)
        self._next[prefix] = first + n
        return first

    def current(self, txn: lmdb.Transaction, prefix: bytes) -> int:
        """The next offset of a partition as of this point of the transaction."""
        nxt = self._next.get(prefix)
        return topics.read_counter(txn, self._dbs.topic_counters, prefix) if nxt is None else nxt

    def receipt(self, txn: lmdb.Transaction, request_id: str, vin: str, data_id: str, status: str, ts_ms: int) -> None:
        """Append the receipt of one (request, VIN) outcome to ``receipts`` partition = this shard."""
        prefix = self._receipt_prefix
        nxt = self._next.get(prefix)
        if nxt is None:
            nxt = topics.read_counter(txn, self._dbs.topic_counters, prefix)
        self._next[prefix] = nxt + 1
        quoted = self._quoted
        rq = quoted.get(request_id)
        if rq is None:
            rq = quoted[request_id] = _quote(request_id)
        dq = quoted.get(data_id)
        if dq is None:
            dq = quoted[data_id] = _quote(data_id)
        payload = (_RECEIPT % (rq, _quote(vin), dq, status, ts_ms)).encode()
        txn.put(prefix + _U64.pack(nxt), topics.pack([ts_ms, topics.RECEIPTS_TOPIC_PREFIX + vin, "", 1, payload, None]),
                db=self._dbs.topic_log)

    def flush(self, txn: lmdb.Transaction) -> None:
        """Write the counters of the partitions this transaction appended to."""
        db = self._dbs.topic_counters
        for prefix, nxt in self._next.items():
            txn.put(prefix, topics.pack(nxt), db=db)
        self._next.clear()


Counts = dict[str, int]


def _inc(counts: Counts, name: str, n: int = 1) -> None:
    counts[name] = counts.get(name, 0) + n


def create_topic(txn: lmdb.Transaction, dbs: Any, op: Any, counts: Counts, tt: TopicTally) -> None:
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


def topic_append(txn: lmdb.Transaction, dbs: Any, op: Any, counts: Counts, tt: TopicTally) -> None:
    """Entries at the partition's next offsets (the op's time is their ``ts_ms``)."""
    _, topic, partition, ts_ms, entries = op
    prefix = topics.partition_prefix(topic, partition)
    first = tt.take(txn, prefix, len(entries))
    pack, u64 = topics.pack, _U64.pack
    txn.cursor(dbs.topic_log).putmulti(
        [(prefix + u64(first + i), pack([ts_ms, *entry])) for i, entry in enumerate(entries)])
    tt.ranges.append((topic, partition, first, first + len(entries) - 1))
    _inc(counts, "topic_appended", len(entries))


def topic_commit(txn: lmdb.Transaction, dbs: Any, op: Any, counts: Counts, tt: TopicTally) -> None:
    """A group's offset moves forward only."""
    _, topic, group, partition, offset, ts_ms = op
    key = topics.offsets_key(topic, group, partition)
    raw = txn.get(key, db=dbs.topic_offsets)
    if raw is not None and topics.unpack(raw)[0] >= offset:
        _inc(counts, "topic_commit_behind")
        return
    txn.put(key, topics.pack([offset, ts_ms]), db=dbs.topic_offsets)
    _inc(counts, "topic_committed")


def topic_reset(txn: lmdb.Transaction, dbs: Any, op: Any, counts: Counts, tt: TopicTally) -> None:
    """A group's offset is set, also backwards."""
    _, topic, group, partition, offset, ts_ms = op
    txn.put(topics.offsets_key(topic, group, partition), topics.pack([offset, ts_ms]), db=dbs.topic_offsets)
    _inc(counts, "topic_reset")


def topic_prune_if(txn: lmdb.Transaction, dbs: Any, op: Any, counts: Counts, tt: TopicTally) -> None:
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
