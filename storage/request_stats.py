"""The ``requests`` table: per-request lifecycle counters, kept by the writes that change them.

Strategy: a request's state on a shard is the multiset of the statuses of its ``reqs`` rows (pending,
delivered, discarded, expired, cancelled). Every op of :mod:`storage.batch_apply` that creates, changes or
deletes a ``reqs`` row reports the move to the :class:`RequestTally` of its transaction
(``tally.move(request_id, old_status, new_status)``: ``None`` for "no row"); at the end of the batch the
tally adds its deltas to the ``requests`` rows, one read and one write per request touched. So:

- the counters are never computed by scanning rows, and cost a dict update per row plus one LMDB get/put
  per request per batch (a tick acknowledging 2,000 rows of one campaign writes one counter row);
- they are part of the same transaction and of the same shipped ``WriteBatch`` as the rows: a replica
  applying the batch computes the same counters, so they survive restarts and failover like the rows;
- ``pending`` is the ``reqs`` rows still pending (the in-flight row of a vehicle is one of them; what is in
  flight is dispatcher memory, added by the dispatcher when it answers a status question).

Value (msgpack list, :data:`FIELDS` order): the count of each status in :data:`STATUSES`, the first and last
delivery time (ms, None before the first), and the request's expiry time (ms, None without a ttl). A row
whose counts all fall to 0 (GC deleted every ``reqs`` row) is deleted unless it still carries an expiry or a
cancel. A cancel is final: the time it happened (``cancelled_ms``) stays in the row, and an ``enqueue`` of a
cancelled request id queues nothing (a trigger re-sent by the platform, or the rest of a big trigger whose head
was written before the cancel).

Migration: a store written before this table existed has no counters for its requests. At open
(:class:`storage.shard.ShardStore`), a store whose ``sys`` lacks :data:`tables.SYS_REQUESTS_BUILT` gets its
counters built once by :func:`rebuild` -- one pass over ``reqs`` in the open's write transaction, which also
sets the mark, so it never runs again. Every replica runs it the same way when it opens its own store, rather
than receiving it as a shipped batch: the counters are a function of the ``reqs`` rows, which replication keeps
equal on every replica at the same ``applied_seq``, and a replica opens (and may be promoted) without a
primary to ship anything. The rows written after that maintain the counters incrementally on each replica.
"""
from __future__ import annotations

from typing import Any, Iterator

import lmdb

from storage import keys, tables

STATUSES: tuple[str, ...] = (tables.STATUS_PENDING, tables.STATUS_DELIVERED, tables.STATUS_DISCARDED,
                             tables.STATUS_EXPIRED, tables.STATUS_CANCELLED)
FIELDS: tuple[str, ...] = (*STATUSES, "first_delivery_ms", "last_delivery_ms", "expires_ms", "cancelled_ms")
_INDEX = {status: i for i, status in enumerate(STATUSES)}
_N = len(STATUSES)
_FIRST, _LAST, _EXPIRES, _CANCELLED_AT = _N, _N + 1, _N + 2, _N + 3
_DELIVERED_STATUS = tables.STATUS_DELIVERED


def _empty() -> list[Any]:
    return [0] * _N + [None, None, None, None]


class RequestTally:
    """The counter deltas of one write transaction, per request id (then :meth:`flush`)."""

    __slots__ = ("_deltas",)

    def __init__(self) -> None:
        self._deltas: dict[str, list[Any]] = {}

    def _of(self, request_id: str) -> list[Any]:
        d = self._deltas.get(request_id)
        if d is None:
            d = self._deltas[request_id] = _empty()
        return d

    def move(self, request_id: str, old: str | None, new: str | None, n: int = 1) -> None:
        """``n`` ``reqs`` rows of ``request_id`` went from status ``old`` to ``new`` (None: no row)."""
        if old == new or n == 0:
            return
        d = self._of(request_id)
        if old is not None:
            d[_INDEX[old]] -= n
        if new is not None:
            d[_INDEX[new]] += n

    def finish(self, request_id: str, old: str | None, new: str, ts_ms: int, n: int = 1) -> None:
        """``n`` rows of ``request_id`` went from ``old`` to ``new`` at ``ts_ms`` (ack, discard, expiry).

        :meth:`move` plus :meth:`delivered_at` in one call: this runs once per delivery, so it is inlined
        (two method calls and ``min``/``max`` per row cost ~3 us per delivery in the hot path bench).
        """
        d = self._deltas.get(request_id)
        if d is None:
            d = self._deltas[request_id] = _empty()
        if old != new:
            if old is not None:
                d[_INDEX[old]] -= n
            d[_INDEX[new]] += n
        if new == _DELIVERED_STATUS:
            first = d[_FIRST]
            if first is None or ts_ms < first:
                d[_FIRST] = ts_ms
            last = d[_LAST]
            if last is None or ts_ms > last:
                d[_LAST] = ts_ms

    def expires(self, request_id: str, expires_ms: int) -> None:
        """``request_id``'s rows are not delivered after ``expires_ms`` (the trigger's ttl)."""
        self._of(request_id)[_EXPIRES] = expires_ms

    def cancelled_at(self, request_id: str, ts_ms: int) -> None:
        """``request_id`` was cancelled at ``ts_ms``: from now on a trigger naming it queues nothing."""
        self._of(request_id)[_CANCELLED_AT] = ts_ms

    def flush(self, txn: lmdb.Transaction[bytes], db: Any, props_db: Any = None) -> int:
        """Add the deltas to the ``requests`` rows in ``txn``; returns how many rows were written. A request
        whose row is deleted loses its ``reqprops`` row (``props_db``) too."""
        written = 0
        for request_id, d in self._deltas.items():
            key = request_id.encode()
            raw = txn.get(key, db=db)
            row = _empty() if raw is None else tables.unpack(raw)
            for i in range(_N):
                row[i] += d[i]
            if d[_FIRST] is not None:
                row[_FIRST] = d[_FIRST] if row[_FIRST] is None else min(row[_FIRST], d[_FIRST])
                row[_LAST] = d[_LAST] if row[_LAST] is None else max(row[_LAST], d[_LAST])
            if d[_EXPIRES] is not None:
                row[_EXPIRES] = d[_EXPIRES]
            if d[_CANCELLED_AT] is not None and row[_CANCELLED_AT] is None:
                row[_CANCELLED_AT] = d[_CANCELLED_AT]
            if any(row[:_N]) or row[_EXPIRES] is not None or row[_CANCELLED_AT] is not None:
                txn.put(key, tables.pack(row), db=db)
            else:
                txn.delete(key, db=db)
                if props_db is not None:
                    txn.delete(key, db=props_db)
            written += 1
        self._deltas.clear()
        return written


def rebuild(txn: lmdb.Transaction[bytes], reqs_db: Any, requests_db: Any) -> tuple[int, int]:
    """Set every request's counts to a recount of its ``reqs`` rows (the one-time migration, see the module
    docstring). A ``requests`` row already there keeps its expiry and cancel times, and its first/last delivery
    times are widened, not narrowed (they also cover rows GC removed since): on a store whose counters were
    kept all along this writes the same values back.

    Returns:
        ``(requests written, reqs rows read)``.
    """
    recounted: dict[str, list[Any]] = {}
    rows = 0
    unpack, decode_key, delivered = tables.unpack, keys.decode_reqs_key, _DELIVERED_STATUS
    for key, raw in txn.cursor(reqs_db):
        request_id = decode_key(key)[0]
        _ts, _data_id, status, done_ms = unpack(raw)
        row = recounted.get(request_id)
        if row is None:
            row = recounted[request_id] = _empty()
        row[_INDEX[status]] += 1
        if status == delivered and done_ms is not None:
            row[_FIRST] = done_ms if row[_FIRST] is None else min(row[_FIRST], done_ms)
            row[_LAST] = done_ms if row[_LAST] is None else max(row[_LAST], done_ms)
        rows += 1
    kept = [(bytes(key), unpack(raw)) for key, raw in txn.cursor(requests_db)]
    for key, old in kept:
        row = recounted.pop(key.decode("utf-8"), None) or _empty()
        for i, pick in ((_FIRST, min), (_LAST, max)):
            known = [v for v in (old[i], row[i]) if v is not None]
            row[i] = pick(known) if known else None
        row[_EXPIRES], row[_CANCELLED_AT] = old[_EXPIRES], old[_CANCELLED_AT]
        if any(row[:_N]) or row[_EXPIRES] is not None or row[_CANCELLED_AT] is not None:
            txn.put(key, tables.pack(row), db=requests_db)
        else:
            txn.delete(key, db=requests_db)
    for request_id, row in recounted.items():
        txn.put(request_id.encode(), tables.pack(row), db=requests_db)
    return len(kept) + len(recounted), rows


def decode(request_id: str, raw: bytes) -> dict[str, Any]:
    """A ``requests`` value as ``{request_id, vins, pending, delivered, ..., expires_ms}``."""
    row = tables.unpack(raw)
    out: dict[str, Any] = {"request_id": request_id, "vins": sum(row[:_N])}
    out.update(zip(FIELDS, row))
    return out


def is_cancelled(txn: lmdb.Transaction[bytes], db: Any, request_id: str) -> bool:
    """Whether ``request_id`` was cancelled on this shard (a later trigger naming it then queues nothing)."""
    raw = txn.get(request_id.encode(), db=db)
    return raw is not None and tables.unpack(raw)[_CANCELLED_AT] is not None


def read_one(txn: lmdb.Transaction[bytes], db: Any, request_id: str) -> dict[str, Any] | None:
    """The counters of ``request_id`` or None."""
    raw = txn.get(request_id.encode(), db=db)
    return None if raw is None else decode(request_id, raw)


def iter_all(txn: lmdb.Transaction[bytes], db: Any, limit: int | None = None) -> Iterator[dict[str, Any]]:
    """Every request's counters in request id order (at most ``limit``)."""
    for n, (key, raw) in enumerate(txn.cursor(db)):
        if limit is not None and n >= limit:
            return
        yield decode(bytes(key).decode("utf-8"), raw)


def iter_states(txn: lmdb.Transaction[bytes], db: Any, limit: int | None = None) -> Iterator[tuple[str, int, int, int]]:
    """``(request_id, pending, cancelled, expired)`` of every request (what :func:`state_of` needs), without
    building a dict per request: ``fanout_requests{state}`` reads every request at each scrape."""
    pending, cancelled = _INDEX[tables.STATUS_PENDING], _INDEX[tables.STATUS_CANCELLED]
    expired = _INDEX[tables.STATUS_EXPIRED]
    unpack = tables.unpack
    for n, (key, raw) in enumerate(txn.cursor(db)):
        if limit is not None and n >= limit:
            return
        row = unpack(raw)
        yield bytes(key).decode("utf-8"), row[pending], row[cancelled], row[expired]


def merge(parts: list[dict[str, Any]]) -> dict[str, Any]:
    """Sum one request's counters over shards (first/last: min/max; expiry: the latest)."""
    out: dict[str, Any] = {"request_id": parts[0]["request_id"], "vins": 0}
    for name in STATUSES:
        out[name] = sum(p.get(name, 0) for p in parts)
    out["vins"] = sum(p["vins"] for p in parts)
    for name, pick in (("first_delivery_ms", min), ("last_delivery_ms", max), ("expires_ms", max),
                       ("cancelled_ms", min)):
        values = [p[name] for p in parts if p.get(name) is not None]
        out[name] = pick(values) if values else None
    return out


def state_of(counters: dict[str, Any]) -> str:
    """One word for a request: ``active`` (rows pending), ``cancelled``, ``expired`` or ``done``."""
    return _state(counters.get(tables.STATUS_PENDING, 0), counters.get(tables.STATUS_CANCELLED, 0),
                  counters.get(tables.STATUS_EXPIRED, 0))


def _state(pending: int, cancelled: int, expired: int) -> str:
    return "active" if pending > 0 else "cancelled" if cancelled > 0 else "expired" if expired > 0 else "done"


REQUEST_STATES: tuple[str, ...] = ("active", "done", "cancelled", "expired")


def count_states(shard_rows: list[list[tuple[str, int, int, int]]]) -> dict[str, int]:
    """Requests per state from every shard's :func:`iter_states` rows (a request is summed over shards first)."""
    totals: dict[str, list[int]] = {}
    for rows in shard_rows:
        for rid, pending, cancelled, expired in rows:
            t = totals.get(rid)
            if t is None:
                totals[rid] = [pending, cancelled, expired]
            else:
                t[0] += pending
                t[1] += cancelled
                t[2] += expired
    out = dict.fromkeys(REQUEST_STATES, 0)
    for pending, cancelled, expired in totals.values():
        out[_state(pending, cancelled, expired)] += 1
    return out

__all__ = ["RequestTally", "STATUSES", "FIELDS", "REQUEST_STATES", "rebuild", "decode", "read_one", "iter_all", "iter_states",
           "merge", "state_of", "count_states"]
