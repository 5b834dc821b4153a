"""Execute WriteBatch ops inside one open LMDB write transaction.

Strategy: one small function per verb, dispatched by opcode; each adds to a counters dict that
becomes ``ApplyResult.counts`` (``enqueue_new``, ``enqueue_dup``, ``ack_deleted``, ``guard_skipped``
...). Nothing here commits or aborts: ``ShardStore.apply`` owns the transaction, so an exception
anywhere leaves the store untouched.

Enqueue (the hot path, up to 1,000,000 VINs in one op):
-. a request id that was cancelled on this shard queues nothing (one ``requests`` get per op);
0. refresh the named blob's ``meta.ts_ms`` (once per op): a blob in use is never GC's "expired";
1. sort the VIN list in place (insertion in key order is ~3x faster than random order in LMDB's
   B-tree; the primary pays the sort once, replicas receive the sorted list and re-sort in ~0.1 s);
2. ``getmulti`` the ``reqs`` keys: if none exists (a fresh trigger) both tables are filled with
   C-level ``putmulti`` calls; ``reqs`` uses ``overwrite=False`` so a VIN listed twice counts once;
3. otherwise the found rows decide per VIN, implementing the idempotency rule exactly: a VIN whose
   ``reqs`` row already has the same ``data_id`` (pending or delivered) is a duplicate and queues
   nothing; a different ``data_id`` (the request id re-used for another blob) queues a new row and
   the ``reqs`` row then tracks the new data id; the rest go through ``putmulti`` as above.

The ops that settle a row once per delivery (ack, discard, expire) and the transaction's tally with their
per-batch caches live in :mod:`storage.row_outcomes`.

Durable topics (``create_topic``, ``topic_append``, ``topic_commit``, ``topic_reset``, ``topic_prune_if``) are
applied by :mod:`storage.topic_apply`; the ops that settle a (request, VIN) row (ack, discard, expire,
settle_pending, settle_ids_if) also append its receipt to the built-in ``receipts`` topic there, in this
transaction, only when they change the row's status (exactly one receipt per outcome).

Other ops are applied strictly in batch order. (Sorting runs of acks/deletes by key was tried and
measured: no gain, each op costs ~8 us either way and every touched page is copied once per
transaction whatever the order; unlike inserts, updates and deletes split no pages.)
"""
from __future__ import annotations

import struct
from itertools import repeat
from typing import Any, Callable, NamedTuple

import lmdb

from storage import batch as B
from storage import keys, tables, topic_apply
from storage.errors import BatchFormatError
from storage.request_stats import RequestTally, is_cancelled
from storage.row_outcomes import ApplyTally, ack as _ack, discard as _discard, expire as _expire
from storage.topic_apply import TopicTally

_TS = struct.Struct(">Q")
_SEP = keys.SEP
_SETTLED_UNDELIVERED = frozenset((tables.STATUS_EXPIRED, tables.STATUS_DISCARDED, tables.STATUS_CANCELLED))


class Dbs(NamedTuple):
    """Open database handles of one environment."""

    data: Any
    meta: Any
    ids: Any
    reqs: Any
    sys: Any
    retained: Any
    metrics: Any
    requests: Any
    reqprops: Any
    blobprops: Any
    topics: Any
    topic_log: Any
    topic_counters: Any
    topic_offsets: Any


Counts = dict[str, int]


def _inc(counts: Counts, name: str, n: int = 1) -> None:
    counts[name] = counts.get(name, 0) + n


def _put_blob(txn: lmdb.Transaction[bytes], dbs: Dbs, op: Any, counts: Counts, tally: RequestTally) -> None:
    _, data_id, blob, ts_ms, sha1 = op
    key = data_id.encode()
    raw = txn.get(key, db=dbs.meta)
    if raw is not None:
        old_ts, size, old_sha1 = tables.unpack(raw)
        if old_sha1 == sha1:
            txn.put(key, tables.encode_meta(max(old_ts, ts_ms), size, sha1), db=dbs.meta)
            txn.delete(key, db=dbs.blobprops)  # the latest publish's content type (set_blob_props follows)
            _inc(counts, "blob_refreshed")
            return
        _inc(counts, "blob_replaced")
    else:
        _inc(counts, "blob_new")
    txn.put(key, blob, db=dbs.data)
    txn.delete(key, db=dbs.blobprops)  # the content type is the latest publish's: a set_blob_props op follows
    txn.put(key, tables.encode_meta(ts_ms, len(blob), sha1), db=dbs.meta)


def _touch_meta(txn: lmdb.Transaction[bytes], dbs: Dbs, op: Any, counts: Counts, tally: RequestTally) -> None:
    _, data_id, ts_ms = op
    key = data_id.encode()
    raw = txn.get(key, db=dbs.meta)
    if raw is None:
        _inc(counts, "meta_missing")
        return
    old_ts, size, sha1 = tables.unpack(raw)
    txn.put(key, tables.encode_meta(max(old_ts, ts_ms), size, sha1), db=dbs.meta)
    _inc(counts, "meta_touched")


def _refresh_meta(txn: lmdb.Transaction[bytes], dbs: Dbs, data_id: str, ts_ms: int) -> None:
    """A trigger naming a blob keeps it alive: ``meta.ts_ms`` becomes the later of the two times.

    GC deletes a blob only if its ``meta.ts_ms`` is still the one its snapshot saw
    (``delete_blob_if``), so rows enqueued after the snapshot protect their blob in the same
    transaction that creates them.
    """
    key = data_id.encode()
    raw = txn.get(key, db=dbs.meta)
    if raw is not None:
        old_ts, size, sha1 = tables.unpack(raw)
        if ts_ms > old_ts:
            txn.put(key, tables.encode_meta(ts_ms, size, sha1), db=dbs.meta)


def _enqueue(txn: lmdb.Transaction[bytes], dbs: Dbs, op: Any, counts: Counts, tally: RequestTally) -> None:
    _, ts_ms, request_id, data_id, vins = op
    if is_cancelled(txn, dbs.requests, request_id):  # a cancel is final (storage.request_stats)
        _inc(counts, "enqueue_cancelled", len(vins))
        return
    vins.sort()
    _refresh_meta(txn, dbs, data_id, ts_ms)
    rid = request_id.encode()
    rprefix = rid + _SEP
    suffix = _SEP + _TS.pack(ts_ms) + rid
    pending = tables.encode_req(ts_ms, data_id, tables.STATUS_PENDING)
    ids_value = tables.pack(data_id)
    vbs = list(map(str.encode, vins))
    rkeys = list(map(rprefix.__add__, vbs))
    rcur = txn.cursor(dbs.reqs)
    icur = txn.cursor(dbs.ids)
    found = rcur.getmulti(rkeys)
    if not found:  # zip() hands putmulti one reused 2-tuple: no million-tuple lists
        consumed, added = rcur.putmulti(zip(rkeys, repeat(pending)), overwrite=False)
        icur.putmulti(zip(map(bytes.__add__, vbs, repeat(suffix)), repeat(ids_value)))
        tally.move(request_id, None, tables.STATUS_PENDING, added)
        _inc(counts, "enqueue_new", added)
        _inc(counts, "enqueue_dup", consumed - added)
        return
    # Some rows exist (a retried or overlapping trigger). Decide per distinct key, in C-speed
    # comprehensions rather than one Python loop step per VIN.
    existing = dict(found)  # reqs key -> stored value
    unpack = tables.unpack
    requeue = [k for k, raw in existing.items() if raw != pending and unpack(raw)[1] != data_id]
    plen = len(rprefix)
    for rk in requeue:  # the request id was re-used with another blob: queue it, reqs follows it
        tally.move(request_id, unpack(existing[rk])[2], tables.STATUS_PENDING)
        rcur.put(rk, pending)
        icur.put(rk[plen:] + suffix, ids_value)
    fresh = [(rk, vb) for rk, vb in zip(rkeys, vbs) if rk not in existing]
    consumed, added = rcur.putmulti([(rk, pending) for rk, _ in fresh], overwrite=False)
    icur.putmulti([(vb + suffix, ids_value) for _, vb in fresh])
    tally.move(request_id, None, tables.STATUS_PENDING, added)
    _inc(counts, "enqueue_new", added + len(requeue))
    _inc(counts, "enqueue_dup", len(rkeys) - len(fresh) - len(requeue) + consumed - added)


def _delete_ids(txn: lmdb.Transaction[bytes], dbs: Dbs, op: Any, counts: Counts, tally: RequestTally) -> None:
    _, vin, ts_ms, request_id = op
    hit = txn.delete(vin.encode() + _SEP + _TS.pack(ts_ms) + request_id.encode(), db=dbs.ids)
    _inc(counts, "deleted" if hit else "delete_missing")


def _guarded_ids_key(txn: lmdb.Transaction[bytes], dbs: Dbs, vin: str, ts_ms: int, request_id: str, expected: str,
                     counts: Counts) -> bytes | None:
    """The ``ids`` key of a GC op if its row still points at ``expected`` (else None, counted ``guard_skipped``)."""
    key = vin.encode() + _SEP + _TS.pack(ts_ms) + request_id.encode()
    raw = txn.get(key, db=dbs.ids)
    if raw is None or tables.unpack(raw) != expected:
        _inc(counts, "guard_skipped")
        return None
    return key


def _delete_ids_if(txn: lmdb.Transaction[bytes], dbs: Dbs, op: Any, counts: Counts, tally: RequestTally) -> None:
    _, vin, ts_ms, request_id, expected = op
    key = _guarded_ids_key(txn, dbs, vin, ts_ms, request_id, expected, counts)
    if key is not None:
        txn.delete(key, db=dbs.ids)
        _inc(counts, "deleted")


def _settle_ids_if(txn: lmdb.Transaction[bytes], dbs: Dbs, op: Any, counts: Counts, tally: ApplyTally) -> None:
    """GC: delete an ``ids`` row past retention or without its blob, and settle its ``reqs`` row (expired,
    discarded) in the same transaction, so the request's counters no longer count it pending."""
    _, vin, ts_ms, request_id, expected, status, settled_ts_ms = op
    key = _guarded_ids_key(txn, dbs, vin, ts_ms, request_id, expected, counts)
    if key is None:
        return
    txn.delete(key, db=dbs.ids)
    _inc(counts, "deleted")
    rkey = request_id.encode() + _SEP + vin.encode()
    raw = txn.get(rkey, db=dbs.reqs)
    if raw is None:
        return
    req_ts, data_id, old_status, _ = tables.unpack(raw)
    if old_status != tables.STATUS_PENDING:
        return  # settled already (acked, cancelled, expired by its ttl)
    if req_ts != ts_ms and _queues_request(txn, dbs, vin, request_id):
        return  # the VIN was queued again for the request (re-used with another blob): that row stays pending
    tally.finish(request_id, old_status, status, settled_ts_ms)
    txn.put(rkey, tables.pack([req_ts, data_id, status, settled_ts_ms]), db=dbs.reqs)
    tally.topics.receipt(txn, request_id, vin, data_id, status, settled_ts_ms)
    _inc(counts, f"{status}_rows")


def _queues_request(txn: lmdb.Transaction[bytes], dbs: Dbs, vin: str, request_id: str) -> bool:
    """Whether ``vin`` still has an ``ids`` row of ``request_id`` (a scan of the VIN's queue, which is short; only
    for a ``reqs`` row that does not describe the row just deleted)."""
    prefix = vin.encode() + _SEP
    rid = request_id.encode()
    cur = txn.cursor(dbs.ids)
    if cur.set_range(prefix):
        for key in cur.iternext(values=False):
            if not key.startswith(prefix):
                break
            if key[len(prefix) + 8:] == rid:
                return True
    return False


def _repoint_ids_if(txn: lmdb.Transaction[bytes], dbs: Dbs, op: Any, counts: Counts, tally: RequestTally) -> None:
    _, vin, ts_ms, request_id, expected, new_data_id = op
    key = _guarded_ids_key(txn, dbs, vin, ts_ms, request_id, expected, counts)
    if key is not None:
        txn.put(key, tables.pack(new_data_id), db=dbs.ids)
        _inc(counts, "repointed")


def _delete_reqs(txn: lmdb.Transaction[bytes], dbs: Dbs, op: Any, counts: Counts, tally: RequestTally) -> None:
    _, request_id, vin = op
    raw = txn.pop(request_id.encode() + _SEP + vin.encode(), db=dbs.reqs)
    if raw is not None:
        tally.move(request_id, tables.unpack(raw)[2], None)
    _inc(counts, "deleted" if raw is not None else "delete_missing")


def _delete_reqs_if(txn: lmdb.Transaction[bytes], dbs: Dbs, op: Any, counts: Counts, tally: RequestTally) -> None:
    _, request_id, vin, expected_ts, expected_status = op
    key = request_id.encode() + _SEP + vin.encode()
    raw = txn.get(key, db=dbs.reqs)
    if raw is not None:
        ts_ms, _data_id, status, _ = tables.unpack(raw)
        # a row seen pending may since have been settled undelivered (by this plan's own settle_ids_if, a
        # ttl expiry, a cancel): it is as dead as when it was seen; a re-queue (new ts) or an ack keeps it
        if ts_ms == expected_ts and (status == expected_status or (
                expected_status == tables.STATUS_PENDING and status in _SETTLED_UNDELIVERED)):
            txn.delete(key, db=dbs.reqs)
            tally.move(request_id, status, None)
            _inc(counts, "deleted")
            return
    _inc(counts, "guard_skipped")


def _delete_blob(txn: lmdb.Transaction[bytes], dbs: Dbs, op: Any, counts: Counts, tally: RequestTally) -> None:
    key = op[1].encode()
    hit = txn.delete(key, db=dbs.meta)
    hit = txn.delete(key, db=dbs.data) or hit
    txn.delete(key, db=dbs.blobprops)
    _inc(counts, "deleted" if hit else "delete_missing")


def _delete_blob_if(txn: lmdb.Transaction[bytes], dbs: Dbs, op: Any, counts: Counts, tally: RequestTally) -> None:
    _, data_id, expected_ts = op
    key = data_id.encode()
    raw = txn.get(key, db=dbs.meta)
    if raw is None or tables.unpack(raw)[0] != expected_ts:
        _inc(counts, "guard_skipped")
        return
    txn.delete(key, db=dbs.meta)
    txn.delete(key, db=dbs.data)
    txn.delete(key, db=dbs.blobprops)
    _inc(counts, "deleted")


def _put_retained(txn: lmdb.Transaction[bytes], dbs: Dbs, op: Any, counts: Counts, tally: RequestTally) -> None:
    _, topic, payload, qos, ts_ms = op
    txn.put(keys.retained_key(topic), tables.encode_retained(topic, payload, qos, ts_ms), db=dbs.retained)
    _inc(counts, "retained_put")


def _delete_retained(txn: lmdb.Transaction[bytes], dbs: Dbs, op: Any, counts: Counts, tally: RequestTally) -> None:
    hit = txn.delete(keys.retained_key(op[1]), db=dbs.retained)
    _inc(counts, "retained_deleted" if hit else "delete_missing")


def _put_metric(txn: lmdb.Transaction[bytes], dbs: Dbs, op: Any, counts: Counts, tally: RequestTally) -> None:
    _, name, value, ts_ms = op
    txn.put(name.encode(), tables.encode_metric(value, ts_ms), db=dbs.metrics)
    _inc(counts, "metric_put")


def _settle_pending(txn: lmdb.Transaction[bytes], dbs: Dbs, op: Any, counts: Counts, tally: ApplyTally) -> None:
    """Cancel or expire a whole request on this shard: a prefix scan of its ``reqs`` rows (the operation
    itself, not the counters, reads the rows: it has to find the pending ones)."""
    _, request_id, status, ts_ms = op
    rid = request_id.encode()
    prefix = rid + _SEP
    cur = txn.cursor(dbs.reqs)
    settled: list[tuple[bytes, bytes]] = []
    receipts: list[tuple[str, str]] = []
    if cur.set_range(prefix):
        for key, raw in cur:
            if not key.startswith(prefix):
                break
            req_ts, data_id, old, _ = tables.unpack(raw)
            if old == tables.STATUS_PENDING:
                settled.append((key, tables.pack([req_ts, data_id, status, ts_ms])))
                vb = key[len(prefix):]
                txn.delete(vb + _SEP + _TS.pack(req_ts) + rid, db=dbs.ids)
                receipts.append((vb.decode("ascii"), data_id))
    if settled:
        txn.cursor(dbs.reqs).putmulti(settled)
    for vin, data_id in receipts:  # after the scan: the receipts' puts go to another table, the cursor stays
        tally.topics.receipt(txn, request_id, vin, data_id, status, ts_ms)
    tally.move(request_id, tables.STATUS_PENDING, status, len(settled))
    if status == tables.STATUS_CANCELLED:
        tally.cancelled_at(request_id, ts_ms)
    _inc(counts, f"{status}_rows", len(settled))


def _set_expiry(txn: lmdb.Transaction[bytes], dbs: Dbs, op: Any, counts: Counts, tally: RequestTally) -> None:
    _, request_id, expires_ms = op
    tally.expires(request_id, expires_ms)
    _inc(counts, "expiry_set")


def _set_request_props(txn: lmdb.Transaction[bytes], dbs: Dbs, op: Any, counts: Counts, tally: RequestTally) -> None:
    """The User Properties of a request's trigger (the latest trigger carrying some wins); none for a cancelled
    request, which queues nothing either. Deleted with the request's ``requests`` row (RequestTally.flush)."""
    _, request_id, pairs = op
    if is_cancelled(txn, dbs.requests, request_id):
        return
    txn.put(request_id.encode(), tables.encode_user_properties(pairs), db=dbs.reqprops)
    _inc(counts, "request_props_set")


def _set_blob_props(txn: lmdb.Transaction[bytes], dbs: Dbs, op: Any, counts: Counts, tally: RequestTally) -> None:
    """The Content Type of a blob's publish (after its put_blob op; deleted with the blob)."""
    _, data_id, content_type = op
    key = data_id.encode()
    if txn.get(key, db=dbs.meta) is None:
        return  # no blob (not put, or GC'd): no orphan row
    txn.put(key, tables.encode_blob_props(content_type), db=dbs.blobprops)
    _inc(counts, "blob_props_set")


def _topic_op(handler: Callable[[lmdb.Transaction[bytes], Any, Any, Counts, TopicTally], None]) -> Callable[..., None]:
    def run(txn: lmdb.Transaction[bytes], dbs: Dbs, op: Any, counts: Counts, tally: ApplyTally) -> None:
        tally.topics.write_pending(txn)  # the receipts so far are in the log before a topic op reads it
        handler(txn, dbs, op, counts, tally.topics)
    return run


_HANDLERS: dict[int, Callable[[lmdb.Transaction[bytes], Dbs, Any, Counts, ApplyTally], None]] = {
    B.PUT_BLOB: _put_blob,
    B.TOUCH_META: _touch_meta,
    B.ENQUEUE: _enqueue,
    B.ACK: _ack,
    B.DELETE_IDS: _delete_ids,
    B.DELETE_IDS_IF: _delete_ids_if,
    B.DELETE_REQS: _delete_reqs,
    B.DELETE_REQS_IF: _delete_reqs_if,
    B.DELETE_BLOB: _delete_blob,
    B.DELETE_BLOB_IF: _delete_blob_if,
    B.PUT_RETAINED: _put_retained,
    B.DELETE_RETAINED: _delete_retained,
    B.PUT_METRIC: _put_metric,
    B.REPOINT_IDS_IF: _repoint_ids_if,
    B.DISCARD: _discard,
    B.EXPIRE: _expire,
    B.SETTLE_PENDING: _settle_pending,
    B.SET_EXPIRY: _set_expiry,
    B.SETTLE_IDS_IF: _settle_ids_if,
    B.SET_REQUEST_PROPS: _set_request_props,
    B.SET_BLOB_PROPS: _set_blob_props,
    B.CREATE_TOPIC: _topic_op(topic_apply.create_topic),
    B.TOPIC_APPEND: _topic_op(topic_apply.topic_append),
    B.TOPIC_COMMIT: _topic_op(topic_apply.topic_commit),
    B.TOPIC_RESET: _topic_op(topic_apply.topic_reset),
    B.TOPIC_PRUNE_IF: _topic_op(topic_apply.topic_prune_if),
}


def apply_ops(txn: lmdb.Transaction[bytes], dbs: Dbs, ops: list[Any], shard_id: int = 0,
              topic_offsets: list[tuple[str, int, int, int]] | None = None) -> Counts:
    """Execute ``ops`` in order inside ``txn`` (which the caller commits or aborts).

    Args:
        txn: an open write transaction.
        dbs: the environment's database handles.
        ops: ``WriteBatch.ops``.
        shard_id: the store's shard (the ``receipts`` partition its outcomes go to).
        topic_offsets: if given, extended with ``(topic, partition, first, last)`` of each ``topic_append`` op.

    Returns:
        Counters of what happened (``enqueue_new``, ``enqueue_dup``, ``blob_refreshed``, ...).

    Raises:
        BatchFormatError: an op with an unknown opcode or the wrong number of fields.
        lmdb.Error: from LMDB (``MapFullError`` is handled by the caller).
    """
    counts: Counts = {}
    tally = ApplyTally(TopicTally(dbs, shard_id))
    handlers = _HANDLERS
    for op in ops:
        handler = handlers.get(op[0]) if op else None
        if handler is None:
            raise BatchFormatError(f"unknown write batch op {op[:1]!r}")
        try:
            handler(txn, dbs, op, counts, tally)
        except (ValueError, TypeError, KeyError) as exc:
            raise BatchFormatError(f"malformed {B.OP_NAMES[op[0]]} op: {exc}") from exc
    tally.settle_outcomes()
    tally.flush(txn, dbs.requests, dbs.reqprops)
    tally.topics.flush(txn)
    if topic_offsets is not None:
        topic_offsets.extend(tally.topics.ranges)
    return counts
