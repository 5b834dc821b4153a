"""Ingest rounds of one ConnectionNode: intercepted ``$SDV-FANOUT/...`` publishes made durable in batches.

Strategy: the broker hands over :class:`IngestTicket` events (neither routed nor acknowledged). They are
processed in *rounds*: one round takes every ticket waiting, and the next round starts when it is over,
so a burst of triggers costs a few dispatcher calls, not one per trigger, and every publisher's PUBACKs
(and rejections) go out in the order it published. A round:

1. validates every ticket (topic, JSON, fields, VINs, blob size) without I/O. An invalid ticket is
   rejected, and the later tickets of the same connection in the round are dropped unwritten (the
   connection is closed; the client resends them after reconnecting, and they are idempotent);
2. stores every blob of the round on EVERY shard (one ``put_blobs`` call per dispatcher), so any
   dispatcher can read the blobs of its own rows locally;
3. checks that every data_id a trigger names exists on every shard, before anything is enqueued
   (data ids stored by this node recently are known without a call);
4. checks that no trigger re-uses a request id for one of its VINs with another data id (a re-sent
   trigger names the same one): within the round, then on the shards. The shards are asked whether they
   know each request id (one small call per shard, made while the blobs are written), and only where one
   does, whether the trigger's VINs there conflict. A conflicting trigger is rejected and nothing of it
   is written. (Two conflicting triggers published at once through two nodes can still both pass the
   check; the dispatcher refuses the second on the shards where it sees the first, so each shard holds
   one data id per (request id, VIN) either way.)
5. splits each trigger's VINs by shard and sends one ``ingest`` call per involved dispatcher;
6. reports each ticket's outcome in ticket order: ``None`` (durable: PUBACK it) or an error body (reject).

MQTT 5 platforms (a ticket with ``properties``):

- a trigger's Message Expiry Interval is its request's time to live, as a ``ttl`` in the payload is (both
  counted from the acceptance of the trigger); with both, the smaller wins. It is checked as ``ttl`` is (1 s
  to :data:`fanout.trigger.MAX_TTL_MS`; 0 would expire the request before any delivery): out of range, the
  trigger is rejected with field ``message_expiry_interval``;
- a trigger's User Properties and a blob's Content Type go with the items to the shards, which store them for
  the deliveries (:mod:`fanout.node.delivery_props`; over the User Properties bounds: 0x97);
- a rejection carries the PUBACK reason code in ``"reason_code"`` (the broker core sends it,
  :func:`fanout.mqtt.link5.negative_ack5`): 0x97 Quota exceeded for input over a configured bound (VINs,
  blob size) or a full store, 0x90 Topic Name invalid for a bad data id or request id in the topic, 0x83
  Implementation specific error for a well-formed trigger the cluster does not accept (unknown data id, a
  request id re-used with another data id, an expiry interval out of range), 0x80 Unspecified error when a
  dispatcher call failed, else 0x99 Payload format invalid. (0x87 and over-long topics are the broker core's:
  it answers them before a ticket exists.) A 3.1.1 platform's error body has no ``reason_code``.

A dispatcher answers only after its LMDB commit (sync), so an acknowledged trigger is durable. A failed
call (dispatcher dead, store full) rejects the tickets it carried with ``"error": "unavailable"``: the
client sees its connection closed without PUBACK and resends, and the store makes a resend idempotent.

The parsing of a very large trigger (a million VINs, ~0.4 s) runs in a worker thread so the node's event
loop keeps serving connections meanwhile (it still shares the GIL, but is not stalled).
"""
from __future__ import annotations

import asyncio
import dataclasses
import time
from dataclasses import dataclass
from typing import Any, Callable, Protocol, Sequence

import structlog

from fanout.mqtt.hooks import IngestTicket
from fanout.mqtt.reason_codes import ReasonCode as RC
from fanout.node.delivery_props import content_type_of, user_properties_of
from fanout.records import CONFLICT_PREFIX, BlobItem, IngestItem, join_vins
from fanout.request_control import CANCEL, STATUS, Control, Reply, is_request_topic, parse_control, reply
from fanout.trigger import (
    TRIGGER_TOPIC, Trigger, TriggerError, check_ttl, conflict_reason, parse_data_topic, parse_trigger, validate_blob,
)
from storage.errors import StoreFullError
from storage.keys import split_by_shard

log = structlog.get_logger(__name__)

BIG_PAYLOAD_BYTES = 1 << 20  # parse triggers larger than this (~50,000 VINs) in a worker thread
KNOWN_DATA_TTL_MS = 60_000  # how long a confirmed data_id is trusted without asking the shards
KNOWN_DATA_IDS = 4096  # most data ids trusted at once (a platform may name a new data id per trigger)


class ShardLink(Protocol):
    """The dispatcher calls an ingest round needs (Ray handles in production, fakes in unit tests)."""

    shards: int

    async def put_blobs(self, shard: int, items: list[tuple]) -> Any:
        """Store :class:`fanout.records.BlobItem` tuples durably on ``shard``."""
        ...

    async def has_data(self, shard: int, data_ids: list[str]) -> list[bool]:
        """Whether each data id has a blob on ``shard``."""
        ...

    async def requests_in_use(self, shard: int, request_ids: list[str]) -> list[bool]:
        """Whether ``shard`` holds rows of each request id."""
        ...

    async def trigger_conflicts(self, shard: int, items: list[tuple]) -> list[str | None]:
        """Per :class:`fanout.records.IngestItem`: None, or why its request id may not queue its VINs."""
        ...

    async def ingest(self, shard: int, items: list[tuple]) -> list[Any]:
        """Durably enqueue :class:`fanout.records.IngestItem` tuples on ``shard``.

        Returns:
            One entry per item: a dict of counters, or an error string (e.g. unknown data id).
        """
        ...

    async def request_control(self, shard: int, ops: list[tuple[str, str]]) -> list[Any]:
        """Per ``(verb, request_id)`` (:mod:`fanout.request_control`): the shard's status of the request after
        the verb (a cancel is written, and durable when this returns, even where the shard has no row of the
        request: it stays cancelled there), or None if the shard does not know it."""
        ...


@dataclass(slots=True)
class _Work:
    """One validated ticket of a round."""

    index: int
    ticket: IngestTicket
    data_id: str | None = None  # a blob
    trigger: Trigger | None = None  # a trigger
    buckets: list[list[str]] | None = None
    control: Control | None = None  # a request status or cancel (fanout.request_control)


def _error_body(exc: TriggerError, reason_code: int = RC.PAYLOAD_FORMAT_INVALID) -> dict[str, Any]:
    return {"error": exc.code, "field": exc.field, "reason": exc.reason, "request_id": exc.request_id,
            "reason_code": int(reason_code)}


def _invalid_code(exc: TriggerError, topic: str) -> int:
    """The MQTT 5 reason code of invalid input (see the module docstring)."""
    if exc.over_limit:
        return RC.QUOTA_EXCEEDED
    if exc.field == "message_expiry_interval":
        return RC.IMPLEMENTATION_SPECIFIC_ERROR
    if topic != TRIGGER_TOPIC and exc.field != "payload":  # the data id or request id level of the topic
        return RC.TOPIC_NAME_INVALID
    return RC.PAYLOAD_FORMAT_INVALID


def _conflict(reason: str, request_id: str) -> dict[str, Any]:
    return _error_body(TriggerError("data_id", reason, request_id=request_id), RC.IMPLEMENTATION_SPECIFIC_ERROR)


def _unavailable(reason: str, request_id: str | None = None, failure: BaseException | None = None) -> dict[str, Any]:
    """A call failed (``failure``, when it was an exception): 0x97 for a full store, else 0x80."""
    code = RC.QUOTA_EXCEEDED if isinstance(failure, StoreFullError) else RC.UNSPECIFIED_ERROR
    return {"error": "unavailable", "field": None, "reason": reason, "request_id": request_id, "reason_code": int(code)}


def with_expiry(trig: Trigger, properties: Any) -> Trigger:
    """``trig`` with the Message Expiry Interval of its MQTT 5 PUBLISH as time to live (the smaller of it and
    the payload's ``ttl``); unchanged without one.

    Raises:
        TriggerError: ``field="message_expiry_interval"`` for 0 or an interval over the ttl limit.
    """
    interval = properties.message_expiry_interval if properties is not None else None
    if interval is None:
        return trig
    try:
        expiry_ms = check_ttl(interval, request_id=trig.request_id)
    except TriggerError as exc:
        raise TriggerError("message_expiry_interval", exc.reason, request_id=trig.request_id) from None
    if trig.ttl_ms and trig.ttl_ms <= expiry_ms:
        return trig
    return dataclasses.replace(trig, ttl_ms=expiry_ms)


class IngestRounds:
    """Runs ingest rounds for one node.

    Args:
        config: loaded config (``fanout.max_batch``, ``fanout.max_blob_size_bytes``).
        link: the dispatcher calls.
        wall_ms: wall clock in ms (row timestamps order a vehicle's queue).
    """

    def __init__(self, config: Any, link: ShardLink, *, wall_ms: Callable[[], int] | None = None) -> None:
        self._link = link
        self._max_batch = int(config.fanout.max_batch)
        self._max_blob = int(config.fanout.max_blob_size_bytes)
        self._wall = wall_ms or (lambda: time.time_ns() // 1_000_000)
        self._known: dict[str, int] = {}  # data_id -> trusted until (wall ms)
        self._last_ts = 0
        self.triggers_ok = 0
        self.blobs_ok = 0
        self.rejected = 0

    def _next_ts(self, now: int) -> int:
        """Row timestamp of the next trigger: wall-clock ms, strictly increasing on this node, so that a
        vehicle's queue follows publish order even for triggers of one round (rows sort by ts, then
        request_id). Under more than 1,000 triggers/s it runs ahead of the clock by the excess."""
        ts = now if now > self._last_ts else self._last_ts + 1
        self._last_ts = ts
        return ts

    def forget_data(self) -> None:
        """Drop the known-data cache (e.g. after a GC pass deleted blobs)."""
        self._known.clear()

    def _trust(self, data_id: str, until: int) -> None:
        """Remember ``data_id`` as existing on every shard until ``until``; the cache keeps the
        :data:`KNOWN_DATA_IDS` most recently confirmed."""
        known = self._known
        known.pop(data_id, None)  # re-inserted last: the dict stays ordered by trust time
        known[data_id] = until
        if len(known) > KNOWN_DATA_IDS:
            del known[next(iter(known))]  # the oldest trust, the first to expire (expired ones just miss)

    @property
    def known_data_ids(self) -> int:
        """Size of the known-data cache."""
        return len(self._known)

    async def run(self, tickets: Sequence[IngestTicket]) -> list[dict[str, Any] | Reply | str | None]:
        """Process one round.

        Args:
            tickets: the tickets, in arrival order.

        Returns:
            Per ticket, in order: None when durable (acknowledge it), a :class:`fanout.request_control.Reply`
            for a request status or cancel (acknowledge it, publish the reply), else an error body (reject it),
            or the string ``"skip"`` for a ticket dropped after an earlier rejection of its connection.
        """
        outcomes: list[Any] = [None] * len(tickets)
        t0 = time.perf_counter()
        work = await self._validate(tickets, outcomes)
        if not work:
            return self._for_protocol(tickets, outcomes)
        t1 = time.perf_counter()
        now = self._wall()
        blobs = [w for w in work if w.data_id is not None]
        triggers = [w for w in work if w.trigger is not None]
        controls = [w for w in work if w.control is not None]
        vins = sum(len(w.trigger.vins) for w in triggers)  # type: ignore[union-attr]
        self._conflicts_within(triggers, outcomes)
        in_use = asyncio.ensure_future(self._requests_in_use(triggers)) if triggers else None
        if blobs:
            await self._put_blobs(blobs, outcomes, now)
        t2 = time.perf_counter()
        if triggers:
            self._cascade(tickets, outcomes)  # a failed blob of a connection stops its later triggers
            triggers = await self._check_data([w for w in triggers if outcomes[w.index] is None], outcomes, now)
        if in_use is not None:
            used = await in_use
            if triggers:
                self._cascade(tickets, outcomes)  # so does an unknown data id
                triggers = await self._check_conflicts([w for w in triggers if outcomes[w.index] is None],
                                                       outcomes, used)
        t3 = time.perf_counter()
        if triggers:
            self._cascade(tickets, outcomes)  # so does a conflict
            triggers = [w for w in triggers if outcomes[w.index] is None]
            if triggers:
                await self._ingest(triggers, outcomes, now)
        self._cascade(tickets, outcomes)
        t4 = time.perf_counter()
        log.info("ingest round", tickets=len(tickets), blobs=len(blobs), triggers=len(triggers), vins=vins,
                 validate_ms=round(1000 * (t1 - t0), 1), blobs_ms=round(1000 * (t2 - t1), 1),
                 check_ms=round(1000 * (t3 - t2), 1), write_ms=round(1000 * (t4 - t3), 1))
        for o in outcomes:
            if o is None:
                continue
            if o != "skip":
                self.rejected += 1
        if controls:  # answered last: a status question sees the triggers published before it in the round
            await self._answer(controls, outcomes)
        return self._for_protocol(tickets, outcomes)

    @staticmethod
    def _for_protocol(tickets: Sequence[IngestTicket], outcomes: list[Any]) -> list[Any]:
        """``outcomes`` with the reason codes left out of 3.1.1 error bodies (the errors topic's JSON as before)."""
        for t, o in zip(tickets, outcomes):
            if t.properties is None and type(o) is dict:
                o.pop("reason_code", None)
        return outcomes

    # -- steps --------------------------------------------------------------------------------------

    async def _validate(self, tickets: Sequence[IngestTicket], outcomes: list[Any]) -> list[_Work]:
        work: list[_Work] = []
        rejected: set[tuple[str, int]] = set()
        shards = self._link.shards
        loop = asyncio.get_running_loop()
        for i, t in enumerate(tickets):
            conn = (t.client_id, t.generation)
            if conn in rejected:
                outcomes[i] = "skip"
                continue
            try:
                if is_request_topic(t.topic):
                    work.append(_Work(i, t, control=parse_control(t.topic, t.payload)))
                elif t.topic == TRIGGER_TOPIC:
                    if len(t.payload) > BIG_PAYLOAD_BYTES:
                        trig, buckets = await loop.run_in_executor(None, self._parse_split, t.payload, shards)
                    else:
                        trig, buckets = self._parse_split(t.payload, shards)
                    user_properties_of(t.properties, trig.request_id)  # bounded before anything is written
                    work.append(_Work(i, t, trigger=with_expiry(trig, t.properties), buckets=buckets))
                else:
                    data_id = parse_data_topic(t.topic)
                    validate_blob(t.payload, self._max_blob)
                    work.append(_Work(i, t, data_id=data_id))
            except TriggerError as exc:
                outcomes[i] = _error_body(exc, _invalid_code(exc, t.topic))
                rejected.add(conn)
        return work

    def _parse_split(self, payload: bytes, shards: int) -> tuple[Trigger, list[list[str]]]:
        trig = parse_trigger(payload, max_batch=self._max_batch)
        return trig, split_by_shard(trig.vins, shards)

    async def _put_blobs(self, blobs: list[_Work], outcomes: list[Any], now: int) -> None:
        items = [BlobItem.build(w.data_id, w.ticket.payload, now, content_type_of(w.ticket.properties))  # type: ignore[arg-type]
                 for w in blobs]
        results = await asyncio.gather(
            *(self._link.put_blobs(s, items) for s in range(self._link.shards)), return_exceptions=True
        )
        failed = [r for r in results if isinstance(r, BaseException)]
        if failed:
            log.error("ingest blob write failed", error=repr(failed[0]), blobs=len(items))
            for w in blobs:
                outcomes[w.index] = _unavailable(f"blob store failed: {failed[0]!r}", failure=failed[0])
            return
        until = now + KNOWN_DATA_TTL_MS
        for w in blobs:
            self._trust(w.data_id, until)  # type: ignore[arg-type]
        self.blobs_ok += len(blobs)

    async def _check_data(self, triggers: list[_Work], outcomes: list[Any], now: int) -> list[_Work]:
        known = self._known
        unknown = sorted({w.trigger.data_id for w in triggers if known.get(w.trigger.data_id, 0) < now})  # type: ignore[union-attr]
        missing: set[str] = set()
        if unknown:
            results = await asyncio.gather(
                *(self._link.has_data(s, unknown) for s in range(self._link.shards)), return_exceptions=True
            )
            for r in results:
                if isinstance(r, BaseException):
                    log.error("ingest data check failed", error=repr(r))
                    for w in triggers:
                        if w.trigger.data_id in unknown:  # type: ignore[union-attr]
                            outcomes[w.index] = _unavailable(f"data check failed: {r!r}", w.trigger.request_id, r)  # type: ignore[union-attr]
                    return [w for w in triggers if w.trigger.data_id not in unknown]  # type: ignore[union-attr]
                missing.update(d for d, ok in zip(unknown, r) if not ok)
            until = now + KNOWN_DATA_TTL_MS
            for d in unknown:
                if d not in missing:
                    self._trust(d, until)
        ok = []
        for w in triggers:
            trig = w.trigger
            if trig.data_id in missing:  # type: ignore[union-attr]
                exc = TriggerError(
                    "data_id", f"unknown data_id {trig.data_id!r}: publish $SDV-FANOUT/data/<data_id> first",  # type: ignore[union-attr]
                    request_id=trig.request_id,  # type: ignore[union-attr]
                )
                outcomes[w.index] = _error_body(exc, RC.IMPLEMENTATION_SPECIFIC_ERROR)
            else:
                ok.append(w)
        return ok

    @staticmethod
    def _conflicts_within(triggers: list[_Work], outcomes: list[Any]) -> None:
        """A trigger re-using the request id of an earlier trigger of the round with another data id for
        a common VIN is rejected (the shards have not seen the earlier one yet)."""
        by_request: dict[str, list[_Work]] = {}
        for w in triggers:
            by_request.setdefault(w.trigger.request_id, []).append(w)  # type: ignore[union-attr]
        for request_id, ws in by_request.items():
            if len(ws) < 2 or len({w.trigger.data_id for w in ws}) < 2:  # type: ignore[union-attr]
                continue
            for i, w in enumerate(ws):
                trig = w.trigger
                assert trig is not None
                for earlier in ws[:i]:
                    e = earlier.trigger
                    assert e is not None
                    common = set(trig.vins).intersection(e.vins) if e.data_id != trig.data_id else ()
                    if common and outcomes[earlier.index] is None:
                        outcomes[w.index] = _conflict(conflict_reason(request_id, trig.data_id, min(common),
                                                                      e.data_id), request_id)
                        break

    async def _requests_in_use(self, triggers: list[_Work]) -> dict[int, Any]:
        """Per shard the triggers touch: ``{request_id: in use}``, or the exception of its call."""
        shards = sorted({s for w in triggers for s, b in enumerate(w.buckets or ()) if b})
        request_ids = sorted({w.trigger.request_id for w in triggers})  # type: ignore[union-attr]
        results = await asyncio.gather(*(self._link.requests_in_use(s, request_ids) for s in shards),
                                       return_exceptions=True)
        return {s: r if isinstance(r, BaseException) else dict(zip(request_ids, r)) for s, r in zip(shards, results)}

    async def _check_conflicts(self, triggers: list[_Work], outcomes: list[Any], used: dict[int, Any]) -> list[_Work]:
        """Ask the shards that know a trigger's request id whether its VINs there conflict."""
        asks: dict[int, list[_Work]] = {}
        for w in triggers:
            trig = w.trigger
            assert trig is not None and w.buckets is not None
            for shard, vins in enumerate(w.buckets):
                if not vins:
                    continue
                known = used.get(shard)
                if isinstance(known, BaseException):
                    outcomes[w.index] = _unavailable(f"shard {shard} request check failed", trig.request_id, known)
                elif known and known.get(trig.request_id):
                    asks.setdefault(shard, []).append(w)
        shards = list(asks)
        calls = []
        for s in shards:
            items = [IngestItem.build(w.trigger.request_id, w.trigger.data_id, join_vins(w.buckets[s]), 0)  # type: ignore[union-attr,index]
                     for w in asks[s]]
            calls.append(self._link.trigger_conflicts(s, items))
        results = await asyncio.gather(*calls, return_exceptions=True)
        for shard, result in zip(shards, results):
            failed = isinstance(result, BaseException)
            for i, w in enumerate(asks[shard]):
                rid = w.trigger.request_id  # type: ignore[union-attr]
                if outcomes[w.index] is not None:
                    continue
                if failed:
                    outcomes[w.index] = _unavailable(f"shard {shard} conflict check failed: {result!r}", rid, result)
                elif result[i] is not None:
                    outcomes[w.index] = _conflict(result[i], rid)
        return [w for w in triggers if outcomes[w.index] is None]

    async def _ingest(self, triggers: list[_Work], outcomes: list[Any], now: int) -> None:
        per_shard: dict[int, list[tuple]] = {}
        owners: dict[int, list[_Work]] = {}
        loop = asyncio.get_running_loop()
        for w in triggers:
            trig = w.trigger
            assert trig is not None and w.buckets is not None
            ts = self._next_ts(now)
            users = user_properties_of(w.ticket.properties)  # checked against the bounds in _validate
            big = len(trig.vins) > 200_000
            for shard, vins in enumerate(w.buckets):
                if not vins:
                    continue
                joined = await loop.run_in_executor(None, join_vins, vins) if big else join_vins(vins)
                per_shard.setdefault(shard, []).append(IngestItem.build(trig.request_id, trig.data_id, joined, ts,
                                                                         trig.ttl_ms, users))
                owners.setdefault(shard, []).append(w)
            w.buckets = None
        shards = list(per_shard)
        results = await asyncio.gather(
            *(self._link.ingest(s, per_shard[s]) for s in shards), return_exceptions=True
        )
        for shard, result in zip(shards, results):
            ws = owners[shard]
            if isinstance(result, BaseException):
                log.error("ingest write failed", shard=shard, error=repr(result), triggers=len(ws))
                for w in ws:
                    outcomes[w.index] = _unavailable(f"shard {shard} write failed", w.trigger.request_id, result)  # type: ignore[union-attr]
                continue
            for w, r in zip(ws, result):
                if isinstance(r, str) and outcomes[w.index] is None:
                    rid = w.trigger.request_id  # type: ignore[union-attr]
                    if r.startswith(CONFLICT_PREFIX):  # a conflicting trigger came through another node meanwhile
                        outcomes[w.index] = _conflict(r[len(CONFLICT_PREFIX):], rid)
                    else:  # the shard refused it (its data_id vanished between check and write): report it
                        outcomes[w.index] = {**_unavailable(r, rid), "reason_code": int(RC.IMPLEMENTATION_SPECIFIC_ERROR)}
        self.triggers_ok += sum(1 for w in triggers if outcomes[w.index] is None)

    async def _answer(self, controls: list[_Work], outcomes: list[Any]) -> None:
        """Status and cancel questions still to acknowledge: one batched call per shard, one Reply each."""
        asked = [w for w in controls if outcomes[w.index] is None]
        if not asked:
            return
        ops = [(w.control.verb, w.control.request_id) for w in asked]  # type: ignore[union-attr]
        shards = range(self._link.shards)
        cancels = sorted({rid for verb, rid in ops if verb == CANCEL})
        if cancels:  # a cancel is written on every shard (final there too), but only for a request some shard knows
            known = await asyncio.gather(*(self._link.request_control(s, [(STATUS, r) for r in cancels]) for s in shards),
                                         return_exceptions=True)
            unknown = {r for i, r in enumerate(cancels)
                       if all(not isinstance(k, BaseException) and k[i] is None for k in known)}
            ops = [(STATUS, rid) if verb == CANCEL and rid in unknown else (verb, rid) for verb, rid in ops]
        per_shard = await asyncio.gather(*(self._link.request_control(s, ops) for s in shards), return_exceptions=True)
        for i, w in enumerate(asked):
            parts = [answers if isinstance(answers, BaseException) else answers[i] for answers in per_shard]
            outcomes[w.index] = reply(w.control, parts)  # type: ignore[arg-type]

    @staticmethod
    def _cascade(tickets: Sequence[IngestTicket], outcomes: list[Any]) -> None:
        """A connection with a rejected ticket: its later tickets of the round are not acknowledged."""
        bad: set[tuple[str, int]] = set()
        for i, t in enumerate(tickets):
            conn = (t.client_id, t.generation)
            if conn in bad:
                if outcomes[i] is None:
                    outcomes[i] = "skip"
            elif outcomes[i] is not None and outcomes[i] != "skip":
                bad.add(conn)


__all__ = ["IngestRounds", "ShardLink", "BIG_PAYLOAD_BYTES"]
