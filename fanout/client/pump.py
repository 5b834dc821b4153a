"""The sending half of ``FanoutClient``: connection loop, pump, PUBACKs, losses, cluster errors.

Strategy: everything here runs on the client's asyncio loop, so state changes between two awaits
are atomic. Invariants the code keeps:

- Order: ring items are older than every outbox item that has not failed (the ring only receives
  in HOT mode, HOT needs an empty outbox, and a loss spills the whole ring), so the pump takes the
  ring first, then outbox items loaded in ``seq`` order. After any loss the loaded outbox queue is
  dropped (``_epoch``) and reloaded only once the spill is committed, so spilled (older) items go
  out before newer outbox items.
- Attribution: see the module docstring of ``client.py`` (suspects are sent alone; a failure is
  charged only when it can be attributed to one submission).
- Mode: any item written to the outbox means COLD, synchronously, before the next ``submit`` can
  run; :meth:`_maybe_hot` switches back only when connected, outbox empty and no write pending.
"""
from __future__ import annotations

import asyncio
import time
from collections import deque
from typing import TYPE_CHECKING, Any

import structlog

from fanout.client.errors import (
    TRANSIENT_ERROR, FanoutDeadLettered, FanoutRejected, describe_cluster_error, negative_ack_detail,
)
from fanout.client.handle import COLD
from fanout.client.inflight import Inflight
from fanout.client.outbox import ApplyResult, Failure, OutboxBatch, now_ms
from fanout.client.submission import Submission, parse_cluster_error
from fanout.client.transport import BrokerConnection, ConnectFailed, PublishFailed
from fanout.request_control import replies_topic
from fanout.trigger import errors_topic

if TYPE_CHECKING:
    from fanout.client.control import RequestControl
    from fanout.client.handle import SubmitHandle
    from fanout.client.outbox import Outbox
    from fanout.client.ring import Ring
    from fanout.client.writer import GroupWriter

log = structlog.get_logger(__name__)
_REFILL = 64


class Pump:
    """Mixin holding the sending machinery; ``FanoutClient`` defines the state it uses."""

    if TYPE_CHECKING:
        host: str
        port: int
        client_id: str
        max_batch: int
        _max_trigger_bytes: int | None
        _loop: asyncio.AbstractEventLoop
        _wake: asyncio.Event
        _lost: asyncio.Event
        _connected: asyncio.Event
        _first_attempt: asyncio.Event
        _ring: Ring[Submission]
        _inflight: Inflight
        _cold: deque[Submission]
        _cold_seqs: set[int]
        _outbox_dirty: bool
        _suspects: set[int]
        _isolated: int | None
        _handles: dict[int, SubmitHandle]
        _rejections: dict[int, dict[str, Any]]
        _conn: BrokerConnection | None
        _control: RequestControl
        _epoch: int
        _pending_writes: int
        _spills: int
        _removes: list[int]
        _removing: set[int]
        _background: set[asyncio.Task[None]]
        _last_error: str
        _last_cluster_error: str
        _acked: int
        _closed: bool
        _outbox: Outbox | None
        _writer: GroupWriter | None
        _max_inflight: int
        _reject_is_final: bool
        _mqtt_version: str
        _mqtt5: bool
        _connects: int
        _keepalive_s: int
        _connect_timeout_s: float
        _reconnect: tuple[float, float]
        _ack_timeout_s: float
        _username: str | None
        _password: str | None

        def _set_mode(self, mode: str, reason: str) -> None: ...
        def _maybe_hot(self) -> None: ...

    # ------------------------------------------------------------------ connection

    async def _connection_loop(self) -> None:
        delay = self._reconnect[0]
        failures = 0
        while not self._closed:
            conn = BrokerConnection(client_id=self.client_id, username=self._username, password=self._password,
                                    keepalive_s=self._keepalive_s, on_ack=self._on_ack, on_message=self._on_message,
                                    on_lost=self._on_lost, mqtt5=self._mqtt5)
            try:
                await conn.open(self.host, self.port, self._connect_timeout_s)
            except ConnectFailed as exc:
                if exc.protocol_refused and self._mqtt_version == "auto":
                    self._mqtt5 = False  # for this client's lifetime: the server is not going to change
                    log.info("client.mqtt5_refused", error=str(exc), using="3.1.1")
                    continue
                self._first_attempt.set()
                self._last_error = str(exc)
                failures += 1
                (log.warning if failures == 1 else log.debug)("client.connect_failed", error=str(exc), retry_in_s=delay)
                await asyncio.sleep(delay)
                delay = min(delay * 2, self._reconnect[1])
                continue
            failures = 0
            self._connects += 1
            self._lost.clear()
            self._conn = conn
            self._inflight = Inflight()
            conn.subscribe(errors_topic(self.client_id))
            conn.subscribe(replies_topic(self.client_id))  # answers to status and cancel (client/control.py)
            self._connected.set()
            self._first_attempt.set()
            log.info("client.connected", host=self.host, port=self.port, client_id=self.client_id,
                     outbox=self._outbox.depth if self._outbox else 0, suspects=len(self._suspects))
            self._outbox_dirty = True
            self._maybe_hot()
            self._wake.set()
            up_since = self._loop.time()
            await self._lost.wait()
            delay = self._reconnect[0] if self._loop.time() - up_since > 1.0 else min(max(delay, self._reconnect[0]) * 2, self._reconnect[1])
            await asyncio.sleep(delay)

    def _on_lost(self, conn: BrokerConnection, reason: str) -> None:
        if conn is not self._conn:
            return
        self._conn = None
        self._connected.clear()
        self._epoch += 1
        unacked = self._inflight.reset()
        isolated, self._isolated = self._isolated, None
        error = reason if not self._last_cluster_error else f"{reason}; cluster error: {self._last_cluster_error}"
        self._last_error, self._last_cluster_error = error, ""
        batch = OutboxBatch()
        if isolated is not None and len(unacked) == 1 and unacked[0].seq == isolated:
            batch.failures.append(Failure(isolated, error))
        else:
            self._suspects.update(s.seq for s in unacked)
        batch.appends = [s for s in unacked if not s.durable] + self._ring.drain()
        for s in batch.appends:
            s.durable = True
        for s in unacked + batch.appends:
            h = self._handles.get(s.seq)
            if h is not None:
                h._sub = None  # back in the outbox: do not keep it in memory too
        self._cold.clear()
        self._cold_seqs.clear()
        self._outbox_dirty = True
        if self.durability == "hybrid":  # type: ignore[attr-defined]
            self._set_mode(COLD, "disconnected")
        log.warning("client.disconnected", reason=reason, unacked=len(unacked), spilled=len(batch.appends),
                    charged=isolated if batch.failures else None, suspects=len(self._suspects))
        if batch.appends or batch.failures:
            self._spawn_write(batch, spill=True)
        self._lost.set()

    def _spawn(self, coro: Any) -> None:
        """Run a background coroutine, keeping a reference (the loop only keeps weak ones)."""
        task = self._loop.create_task(coro)
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    def _spawn_write(self, batch: OutboxBatch, spill: bool = False) -> None:
        self._pending_writes += 1
        self._spills += spill
        self._spawn(self._settle(batch, spill))

    async def _settle(self, batch: OutboxBatch, spill: bool) -> None:
        """Commit a spill/failure batch, then fail dead-lettered handles and schedule retries."""
        assert self._writer is not None
        try:
            result: ApplyResult = await self._writer.apply(batch)
        except Exception as exc:  # noqa: BLE001 - the disk is the last resort; report and fail
            log.critical("client.outbox_write_failed", error=repr(exc), items=len(batch.appends))
            for s in batch.appends:
                h = self._handles.pop(s.seq, None)
                if h is not None:
                    h._fail(exc)
            return
        finally:
            self._pending_writes -= 1
            self._spills -= spill
        mine = {f.seq for f in batch.failures}  # the result covers the whole merged commit
        for seq, (attempts, error) in result.dead.items():
            if seq not in mine:
                continue
            log.error("client.dead_letter", seq=seq, attempts=attempts, error=error)
            self._suspects.discard(seq)
            h = self._handles.pop(seq, None)
            detail = self._rejections.pop(seq, None)
            if h is not None:
                h._fail(FanoutRejected(seq, h.request_id, attempts, detail) if detail is not None
                        else FanoutDeadLettered(seq, h.request_id, attempts, error))
        for seq, next_ms in result.retry.items():
            if seq not in mine:
                continue
            self._rejections.pop(seq, None)
            log.info("client.retry_scheduled", seq=seq, in_s=round((next_ms - now_ms()) / 1000, 3))
            self._loop.call_later(max(0.0, (next_ms - now_ms()) / 1000), self._retry_due)
        self._outbox_dirty = True
        self._maybe_hot()
        self._wake.set()

    def _retry_due(self) -> None:
        self._outbox_dirty = True
        self._wake.set()

    # ------------------------------------------------------------------ pump

    async def _pump(self) -> None:
        while True:
            await self._wake.wait()
            self._wake.clear()
            try:
                await self._pump_once()
            except asyncio.CancelledError:
                raise
            except Exception:  # noqa: BLE001 - never let the pump die
                log.exception("client.pump_error")
                await asyncio.sleep(0.1)
                self._wake.set()

    async def _pump_once(self) -> None:
        while True:
            conn = self._conn
            if conn is None or self._isolated is not None or self._inflight.messages >= self._max_inflight:
                return
            if len(self._ring):
                sub, from_ring = self._ring.peek(), True
            elif self._cold:
                sub, from_ring = self._cold[0], False
            else:
                if self._outbox_dirty and not self._spills:
                    await self._refill()
                    continue
                self._maybe_hot()
                return
            assert sub is not None
            if sub.seq in self._suspects and len(self._inflight):
                return  # a suspect goes alone: wait for the window to empty
            if from_ring:
                self._ring.pop()
            else:
                self._cold.popleft()
                self._cold_seqs.discard(sub.seq)
            if sub.seq in self._suspects:
                self._isolated = sub.seq
            self._publish(conn, sub)

    async def _refill(self) -> None:
        assert self._writer is not None and self._outbox is not None
        epoch = self._epoch
        exclude = frozenset(self._cold_seqs | self._inflight.seqs() | self._removing)
        # Cleared before the read, not after: a commit that lands while the read runs (the writer is another
        # thread) sets it again, and the read may not see that commit. Cleared after, such a submission stayed in
        # the outbox with nothing left to load it (test_durability_always_never_goes_hot hung, rarely, in CI).
        self._outbox_dirty = False
        try:
            items = await self._writer.read(self._outbox.load_ready, now_ms(), exclude, _REFILL)
        except BaseException:
            self._outbox_dirty = True
            raise
        if epoch != self._epoch:
            self._outbox_dirty = True
            return
        if len(items) >= _REFILL:
            self._outbox_dirty = True
        for sub in items:
            if sub.seq not in self._cold_seqs and sub.seq not in self._inflight and sub.seq not in self._removing:
                self._cold.append(sub)
                self._cold_seqs.add(sub.seq)

    def _publish(self, conn: BrokerConnection, sub: Submission) -> None:
        h = self._handles.get(sub.seq)
        if h is not None:
            h._sub = sub  # progress of this attempt
        try:
            self._inflight.send(sub, self.max_batch, conn.publish, time.monotonic(), self._max_trigger_bytes)
        except PublishFailed as exc:
            if exc.connection_lost:
                return  # stays tracked: the coming loss report spills it as a suspect, uncharged
            self._inflight.forget(sub.seq)
            if self._isolated == sub.seq:
                self._isolated = None
            self._fail_item(sub, str(exc))

    def _fail_item(self, sub: Submission, error: str, final: bool = False) -> None:
        """Charge one failed attempt to ``sub`` (appending it to the outbox if it is not there)."""
        self._last_error = error
        h = self._handles.get(sub.seq)
        if h is not None:
            h._sub = None
        batch = OutboxBatch(failures=[Failure(sub.seq, error, final)])
        if not sub.durable:
            sub.durable = True
            batch.appends.append(sub)
        if self.durability == "hybrid":  # type: ignore[attr-defined]
            self._set_mode(COLD, "publish_failed")
        self._spawn_write(batch)

    # ------------------------------------------------------------------ inbound

    def _on_ack(self, mid: int, code: int = 0, reason: str | None = None) -> None:
        if code >= 0x80:
            self._on_refused(mid, code, reason)
            return
        for sub in self._inflight.ack(mid):
            self._complete(sub)
        self._wake.set()

    def _on_refused(self, mid: int, code: int, reason: str | None) -> None:
        """An MQTT 5 negative PUBACK: the submissions of that message fail as :class:`FanoutRejected`, the
        connection and every other submission on it go on (3.1.1 learns it from the errors topic and a close)."""
        for sub in self._inflight.reject(mid):
            self._reject(sub, negative_ack_detail(code, reason, sub.request_id))
        self._wake.set()

    def _complete(self, sub: Submission) -> None:
        self._acked += 1
        self._suspects.discard(sub.seq)
        if self._isolated == sub.seq:
            self._isolated = None
        if sub.durable:
            if not self._removes:
                self._loop.call_soon(self._flush_removes)
            self._removes.append(sub.seq)
            self._removing.add(sub.seq)  # acknowledged, still in the outbox until the removal commits
        h = self._handles.pop(sub.seq, None)
        if h is not None:
            h._resolve()

    def _flush_removes(self) -> None:
        if self._removes and self._writer is not None:
            removes, self._removes = self._removes, []
            self._spawn(self._commit_removes(removes))

    async def _commit_removes(self, removes: list[int]) -> None:
        assert self._writer is not None
        try:
            await self._writer.apply(OutboxBatch(removes=removes), urgent=False)
        except Exception as exc:  # noqa: BLE001 - a lost removal only means a QoS 1 duplicate later
            log.error("client.outbox_remove_failed", error=repr(exc), count=len(removes))
        self._removing.difference_update(removes)
        self._maybe_hot()
        self._wake.set()

    def _on_message(self, topic: str, payload: bytes) -> None:
        if topic == errors_topic(self.client_id):
            self._on_cluster_error(parse_cluster_error(payload))
        elif topic == replies_topic(self.client_id):
            self._control.on_reply(payload)

    def _on_cluster_error(self, detail: dict[str, Any]) -> None:
        text = describe_cluster_error(detail)
        self._last_cluster_error = self._last_error = text
        rid = detail.get("request_id")
        subs = self._inflight.find_request(rid) if isinstance(rid, str) else []
        log.warning("client.cluster_error", error=text, request_id=rid, matched=bool(subs))
        if not subs:
            return
        sub = subs[0]
        self._inflight.forget(sub.seq)
        self._reject(sub, detail)

    def _reject(self, sub: Submission, detail: dict[str, Any]) -> None:
        """The cluster refused ``sub`` (already out of the in-flight tracker): dead-letter it with ``detail``,
        unless the refusal says the cluster could not take it *now* (``"unavailable"``: a dispatcher failing
        over, a full store), which charges one attempt and retries it after the backoff."""
        text = describe_cluster_error(detail)
        self._last_cluster_error = self._last_error = text
        self._suspects.discard(sub.seq)
        if self._isolated == sub.seq:
            self._isolated = None
        if detail.get("error") == TRANSIENT_ERROR:
            self._fail_item(sub, text)
        else:
            self._rejections[sub.seq] = detail
            self._fail_item(sub, text, final=self._reject_is_final)
        self._wake.set()

    # ------------------------------------------------------------------ housekeeping

    async def _housekeeping(self) -> None:
        assert self._writer is not None and self._outbox is not None
        last_prune = time.monotonic()
        while True:
            await asyncio.sleep(0.5)
            conn = self._conn
            if conn is not None:
                conn.misc()
                oldest = self._inflight.oldest_sent_at()
                if oldest is not None and time.monotonic() - oldest > self._ack_timeout_s:
                    conn.abort(f"no PUBACK within {self._ack_timeout_s}s")
            nxt = self._outbox.next_retry_ms()
            if nxt is not None and nxt <= now_ms():
                self._retry_due()
            if time.monotonic() - last_prune > 3600:
                last_prune = time.monotonic()
                await self._writer.run(self._outbox.prune_dead_letters)
