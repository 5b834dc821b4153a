"""Request lifecycle on one shard: time to live, cancel, and the status of a request.

Strategy: the counters themselves live in the store (:mod:`storage.request_stats`, kept by the writes); what
the dispatcher adds is what only it knows, and the two places where it must hold a row back:

- **expiry** (a trigger's ``ttl``): ``expires`` maps request id -> expiry time (ms) for the requests with a
  ttl and rows pending. It is filled by ingest (the same batch writes ``set_expiry``; a trigger without a ttl
  takes the one its request already has in the store) and, at start (a restart, a promoted replica), from the
  ``requests`` table. The core checks it when it picks a row to send
  (:meth:`expired`): a row picked after its request's expiry is dropped as expired instead of sent. The GC
  cycle's sweep (:meth:`sweep_batch`) settles the pending rows of lapsed requests for good.
- **cancel**: :meth:`begin_cancel` marks the request before its ``settle_pending`` batch is written, so
  that from then on no send of it leaves (:meth:`held_back` drops picked rows; the core also drops its queued
  deliveries). The vehicles held back get their next row once the batch is durable (:meth:`end_cancel`).
  A row already handed to a node stays in flight: its PUBACK, if it comes, records it delivered.
- **in flight**: what is in flight is dispatcher memory (one row per vehicle), counted per request when
  asked (:meth:`status`), not on the hot path.
- **User Properties** of a request's trigger (MQTT 5), sent with each of its deliveries: ``user_properties``
  maps request id -> pairs for the requests that have some and rows pending, filled like ``expires`` (by
  ingest, whose batch writes them to the ``reqprops`` table, and at start from that table) and forgotten with
  it when the request is settled (cancel, expiry sweep) or, at each GC cycle's expiry sweep (:meth:`forget_done`), when the
  store says it has nothing pending. Both maps empty is the common case, and then a delivery batch carries no
  properties at all.
"""
from __future__ import annotations

from collections import Counter
from typing import Any, Iterable

from storage import WriteBatch, request_stats, tables
from storage.keys import SEP

TS_BYTES = 8  # the ts_ms part of an ids key (storage.keys)


def request_of(key: bytes) -> str:
    """The request id of an ``ids`` row key (``vin NUL ts_ms request_id``)."""
    return key[key.index(SEP) + 1 + TS_BYTES:].decode()


class RequestLifecycle:
    """Expiry cache, cancels under way and per-request status of one shard.

    Args:
        store: the shard's ``ShardStore`` (read only: writes are returned as ``WriteBatch`` objects).
    """

    __slots__ = ("store", "expires", "user_properties", "_fresh", "cancelling", "held", "expired_rows")

    def __init__(self, store: Any) -> None:
        self.store = store
        counters = store.request_counters_all()
        self.expires: dict[str, int] = {
            c["request_id"]: c["expires_ms"] for c in counters
            if c["expires_ms"] is not None and c[tables.STATUS_PENDING] > 0}
        pending = {c["request_id"] for c in counters if c[tables.STATUS_PENDING] > 0}
        self.user_properties: dict[str, tuple] = {
            rid: props for rid, props in store.user_properties_all().items() if rid in pending}
        self._fresh: set[str] = set()  # requests given properties since the last forget_done
        self.cancelling: set[str] = set()
        self.held: set[str] = set()  # VINs whose send was dropped by a cancel under way
        self.expired_rows = 0

    # -- ingest and pick time ------------------------------------------------------------------------------

    def ingested(self, items: Iterable[tuple]) -> None:
        """Note the expiry and User Properties of :class:`fanout.records.IngestItem` items that have them
        (written with their rows)."""
        expires = self.expires
        asked: set[str] = set()  # one store read per request of the round, not per item of it
        for request_id, _data_id, _joined, ts_ms, ttl_ms, user_properties in items:
            if ttl_ms:
                expires[request_id] = ts_ms + ttl_ms
            elif request_id not in expires and request_id not in asked:
                # A trigger without a ttl keeps the expiry its request already has (the store keeps it, and a
                # restarted dispatcher loads it for every request with rows pending): the rows it adds to a
                # request swept or expired earlier are not sent after that time either, restart or not.
                asked.add(request_id)
                known = self.store.request_counters(request_id)
                if known is not None and known["expires_ms"] is not None:
                    expires[request_id] = known["expires_ms"]
            if user_properties:
                self.user_properties[request_id] = tuple(user_properties)
                self._fresh.add(request_id)

    def forget_done(self) -> None:
        """Forget the User Properties of the requests with nothing pending on the shard any more (all delivered,
        discarded, or removed by GC), so that memory follows the requests in progress. A request ingested since
        the previous call is kept whatever the store says: its rows may not be written yet."""
        users = self.user_properties
        if not users:
            return
        pending = {rid for rid, n, _cancelled, _expired in self.store.request_states() if n > 0}
        fresh, self._fresh = self._fresh, set()
        self.user_properties = {rid: p for rid, p in users.items() if rid in pending or rid in fresh}

    def expired(self, request_id: str, now_ms: int) -> bool:
        """Whether a row of ``request_id`` picked at ``now_ms`` is past its request's ttl."""
        at = self.expires.get(request_id)
        return at is not None and now_ms >= at

    def held_back(self, request_id: str, vin: str) -> bool:
        """Whether a send of ``request_id`` must not leave (a cancel is under way); remembers the VIN."""
        if request_id in self.cancelling:
            self.held.add(vin)
            return True
        return False

    # -- cancel ----------------------------------------------------------------------------------------------

    def begin_cancel(self, request_id: str, now_ms: int) -> WriteBatch:
        """Stop sending ``request_id``; the batch that settles its pending rows as cancelled."""
        self.cancelling.add(request_id)
        return WriteBatch().settle_pending(request_id, tables.STATUS_CANCELLED, now_ms)

    def end_cancel(self, request_id: str) -> list[str]:
        """The cancel batch is durable (or failed): returns the VINs held back, to dispatch again."""
        self.cancelling.discard(request_id)
        self.expires.pop(request_id, None)
        self.user_properties.pop(request_id, None)
        if self.cancelling:
            return []
        held, self.held = list(self.held), set()
        return held

    # -- expiry sweep (GC cycle) -------------------------------------------------------------------------------

    def sweep_batch(self, now_ms: int) -> tuple[WriteBatch, list[str]] | None:
        """The batch settling every pending row of the requests whose ttl has passed, or None."""
        lapsed = [rid for rid, at in self.expires.items() if now_ms >= at]
        if not lapsed:
            return None
        batch = WriteBatch()
        for rid in lapsed:
            batch.settle_pending(rid, tables.STATUS_EXPIRED, now_ms)
        return batch, lapsed

    def swept(self, lapsed: list[str]) -> None:
        """The sweep batch is durable: its requests have nothing pending left."""
        for rid in lapsed:
            self.expires.pop(rid, None)
            self.user_properties.pop(rid, None)

    # -- status ------------------------------------------------------------------------------------------------

    def status(self, request_id: str, inflight_keys: list[bytes]) -> dict[str, Any] | None:
        """The shard's counters of ``request_id`` plus its rows in flight, or None if unknown here."""
        counters = self.store.request_counters(request_id)
        if counters is None:
            return None
        counters["inflight"] = sum(1 for key in inflight_keys if request_of(key) == request_id)
        return counters

    def list(self, inflight_keys: list[bytes], limit: int) -> list[dict[str, Any]]:
        """The counters of the shard's requests (by request id, at most ``limit``) with their rows in flight."""
        inflight = Counter(map(request_of, inflight_keys))
        rows = self.store.request_counters_all(limit)
        for row in rows:
            row["inflight"] = inflight.get(row["request_id"], 0)
        return rows


def merge(parts: list[dict[str, Any]]) -> dict[str, Any]:
    """One request's status over shards (:func:`storage.request_stats.merge` plus ``inflight``)."""
    out = request_stats.merge(parts)
    out["inflight"] = sum(p.get("inflight", 0) for p in parts)
    out["state"] = request_stats.state_of(out)
    return out


__all__ = ["RequestLifecycle", "merge", "request_of"]
