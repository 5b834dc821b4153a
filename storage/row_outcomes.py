"""The outcome of a (request, VIN) row: ack, discard, expire -- the write batch ops applied once per delivery.

Strategy: :class:`ApplyTally` is what one apply transaction accumulates (the request counters, the topic
partitions' counters and receipts) plus the caches that make a row's outcome cheap: a tick's outcomes name
few (ts_ms, request) pairs, a trigger's rows carry equal ``reqs`` bytes and a batch's outcomes one time, so
keys, decoded values and settled values are computed once per batch and request (see the class). Used by
:mod:`storage.batch_apply` on the primary and on every replica alike (the same batch bytes).
"""
from __future__ import annotations

import struct
from typing import Any

import lmdb

from storage import keys, tables
from storage.request_stats import RequestTally
from storage.topic_apply import TopicTally

_TS = struct.Struct(">Q")
_SEP = keys.SEP
CACHE_MAX = 4096  # entries of each per-transaction cache of ApplyTally

Counts = dict[str, int]


class ApplyTally(RequestTally):
    """What one transaction accumulates: the request counters (``RequestTally``) and, in ``topics``, the topic
    partitions' counters and the receipts (``storage.topic_apply.TopicTally``); both are written at its end.

    It also holds the per-transaction caches of the row outcomes (ack, discard, expire: one op per delivery).
    A tick's acks name few requests, all rows of one trigger carry the same ``reqs`` value (pending, same
    ``ts_ms`` and data id) and every outcome of a batch has the same time, so the key parts of a (request,
    ts_ms), the decoded ``reqs`` value and the settled value to write are each computed once per batch and
    request instead of once per row (msgpack unpack + pack per row cost ~1.5 µs on the primary and again on
    every replica). The cached bytes are the very bytes ``tables.pack`` would produce: the tables stay equal.
    The counters moved by the outcomes are summed per (request, old, new, time) and given to the
    ``RequestTally`` once at the end (:meth:`settle_outcomes`). The rows are read and written through two
    cursors kept for the transaction: a cursor's ``pop``/``get``/``put`` costs about half a ``txn.pop``/``get``/
    ``put`` in py-lmdb, which builds a temporary cursor per call."""

    __slots__ = ("topics", "key_parts", "req_values", "settled_values", "outcomes", "cursors")

    def __init__(self, topics: TopicTally) -> None:
        super().__init__()
        self.topics = topics
        self.key_parts: dict[tuple[int, str], tuple[bytes, bytes]] = {}  # (ts_ms, request id) -> ids suffix, reqs prefix
        self.req_values: dict[bytes, tuple[Any, ...]] = {}  # stored reqs value -> its decoded fields
        self.settled_values: dict[tuple[bytes, str, int], bytes] = {}  # (old value, status, time) -> new value
        self.outcomes: dict[tuple[str, str | None, str, int], int] = {}  # (request id, old, new, time) -> rows
        self.cursors: tuple[Any, Any] | None = None  # (ids, reqs) cursors of the outcomes, made at the first one

    def settle_outcomes(self) -> None:
        """Move the summed row outcomes into the request counters (before ``flush``)."""
        finish = self.finish
        for (request_id, old, new, ts_ms), n in self.outcomes.items():
            finish(request_id, old, new, ts_ms, n)
        self.outcomes.clear()

    def trim_caches(self) -> None:
        """Bound the caches (called on a miss: a batch naming very many requests recomputes its values)."""
        for cache in (self.key_parts, self.req_values, self.settled_values):
            if len(cache) > CACHE_MAX:
                cache.clear()


def ack(txn: lmdb.Transaction[bytes], dbs: Any, op: Any, counts: Counts, tally: ApplyTally) -> None:
    """``ACK``: the vehicle has the row (``dbs``: ``storage.batch_apply.Dbs``)."""
    finish_row(txn, dbs, op, counts, tally, tables.STATUS_DELIVERED, "ack_deleted", "ack_missing")


def discard(txn: lmdb.Transaction[bytes], dbs: Any, op: Any, counts: Counts, tally: ApplyTally) -> None:
    """``DISCARD``: the row was dropped undelivered (its blob is gone, or too large for the vehicle)."""
    finish_row(txn, dbs, op, counts, tally, tables.STATUS_DISCARDED, "discard_deleted", "discard_missing")


def expire(txn: lmdb.Transaction[bytes], dbs: Any, op: Any, counts: Counts, tally: ApplyTally) -> None:
    """``EXPIRE``: the row was not delivered within its request's ttl."""
    finish_row(txn, dbs, op, counts, tally, tables.STATUS_EXPIRED, "expire_deleted", "expire_missing")


def finish_row(txn: lmdb.Transaction[bytes], dbs: Any, op: Any, counts: Counts, tally: ApplyTally, status: str,
               deleted: str, missing: str) -> None:
    """Delete an ``ids`` row and record its outcome (``status`` at ``op[4]``) in its ``reqs`` row, and, when that
    changes the row's status, in a receipt (a repeated PUBACK changes nothing; a late one of a row cancelled or
    expired meanwhile does: the vehicle has it). Runs once per delivery: see ``ApplyTally`` for its caches."""
    _, vin, ts_ms, request_id, done_ts_ms = op
    vb = vin.encode()
    parts = tally.key_parts.get((ts_ms, request_id))
    if parts is None:
        tally.trim_caches()
        rid = request_id.encode()
        parts = tally.key_parts[(ts_ms, request_id)] = (_SEP + _TS.pack(ts_ms) + rid, rid + _SEP)
    cursors = tally.cursors
    if cursors is None:
        cursors = tally.cursors = (txn.cursor(dbs.ids), txn.cursor(dbs.reqs))
    popped = cursors[0].pop(vb + parts[0])
    name = deleted if popped is not None else missing
    counts[name] = counts.get(name, 0) + 1  # inline _inc
    rkey = parts[1] + vb
    reqs_cursor = cursors[1]
    raw = reqs_cursor.get(rkey)
    if raw is not None:
        fields = tally.req_values.get(raw)
        if fields is None:
            tally.trim_caches()
            fields = tally.req_values[raw] = tuple(tables.unpack(raw))
        req_ts, data_id, old_status, _ = fields
        if popped is None and old_status != tables.STATUS_PENDING and status != tables.STATUS_DELIVERED:
            return  # the row was settled already (cancelled, expired, acked): only a late PUBACK may still change it
        value = tally.settled_values.get((raw, status, done_ts_ms))
        if value is None:
            tally.trim_caches()
            value = tally.settled_values[(raw, status, done_ts_ms)] = tables.pack([req_ts, data_id, status, done_ts_ms])
    elif popped is not None:
        req_ts, data_id, old_status = ts_ms, tables.unpack(popped), None
        value = tables.pack([req_ts, data_id, status, done_ts_ms])
    else:
        return
    outcome = (request_id, old_status, status, done_ts_ms)
    outcomes = tally.outcomes
    outcomes[outcome] = outcomes.get(outcome, 0) + 1
    reqs_cursor.put(rkey, value)
    if old_status != status:
        tally.topics.receipt(txn, request_id, vin, data_id, status, done_ts_ms)


__all__ = ["ApplyTally", "CACHE_MAX", "ack", "discard", "expire", "finish_row"]
