"""``FanoutClient``: submit trigger batches to the cluster and never lose an accepted one.

Strategy (hybrid delivery, one asyncio loop, see also ``transport.py`` and ``writer.py``):

- Every submission gets a client-wide sequence number ``seq``; delivery order is ``seq`` order and
  the outbox is keyed by it, so whatever path an item takes it is put back in its place.
- HOT (healthy, outbox empty): ``submit`` appends to a bounded in-memory ring and returns (no
  await, microseconds); one pump task publishes ring items, pipelined up to ``max_inflight``
  unacknowledged PUBLISH packets.
- COLD (disconnected, ring full, a failed item waiting, or ``durability="always"``): ``submit``
  appends to the LMDB outbox and returns only after the fsynced commit (group commit). On a
  connection loss the unacknowledged in-flight items and the ring are spilled to the outbox in the
  same way. The pump publishes ring items first (they are older), then outbox items in ``seq`` order.
  The client returns to HOT only when connected and the outbox is empty with no write pending.
- Poison isolation: a connection loss with several submissions in flight cannot say which one
  caused it, so none is charged; they become *suspects* and, after reconnecting, each suspect is
  sent alone. A failure is charged to a submission (attempts + 1, backoff 1, 2, 4, 8 s ...) when the
  cluster names its request id on ``$SDV-FANOUT/errors/<client_id>``, when paho refuses the PUBLISH,
  or when the connection fails while it is the only submission in flight; after ``max_attempts`` it
  becomes a dead letter. Items behind a waiting item are not blocked; only a failed item can be
  overtaken. Disconnected time costs no attempts.
- A cluster error naming a request id fails that submission at once by default
  (``reject_is_final=True``): the cluster already said it is invalid, so retrying cannot help; it is
  dead-lettered with the error and ``handle.acked()`` raises ``FanoutRejected`` naming the field.
"""
from __future__ import annotations

import asyncio
import os
import uuid
from collections import deque
from pathlib import Path
from typing import AsyncIterator, Awaitable, Iterable, Literal, overload

import structlog

from fanout.client.backoff import RetryPolicy
from fanout.client.consume import DEFAULT_MAX_PENDING, TopicMessage, consume
from fanout.client.control import DEFAULT_TIMEOUT_S, RequestControl
from fanout.client.errors import FanoutClosed, FanoutUnavailable
from fanout.client.handle import COLD, HOT, ClientStatus, SubmitHandle
from fanout.client.inflight import Inflight
from fanout.client.outbox import DEFAULT_OUTBOX_DIR, DeadLetter, Outbox, OutboxBatch, now_ms
from fanout.client.pump import Pump
from fanout.client.ring import Ring
from fanout.client.submission import Submission, make_submission
from fanout.client.transport import BrokerConnection
from fanout.client.writer import GroupWriter
from fanout.request_control import TOPIC_ACK, TOPIC_INFO, request_topic

log = structlog.get_logger(__name__)


class FanoutClient(Pump):
    """Async platform client; use ``async with FanoutClient(...) as c: h = await c.submit(...)``.

    Args:
        host, port: the cluster's MQTT listener.
        username, password: MQTT login (a user with role ``platform``).
        client_id: MQTT client id; default ``fanout-client-<random>``.
        outbox_dir: outbox directory (one client per directory); default
            ``$XDG_STATE_HOME/sdv-fanout/outbox``.
        durability: ``"hybrid"`` (HOT ring when healthy) or ``"always"`` (every submission is
            fsynced to the outbox before ``submit`` returns).
        ring_size: HOT ring capacity (submissions).
        max_batch: most VINs per trigger; must not exceed the server's ``fanout.max_batch``.
        max_packet_bytes: the server's ``mqtt.max_packet_size``; triggers are also split so that each
            PUBLISH fits (None = split by ``max_batch`` only). The blob itself must fit too.
        max_inflight: unacknowledged PUBLISH packets before the pump waits.
        max_attempts, backoff_base_s, backoff_max_s: retry policy of failed items.
        dead_letter_retain_days: dead letters older than this are pruned.
        reject_is_final: a cluster error naming the request dead-letters it at once.
        keepalive_s, connect_timeout_s, reconnect_min_s, reconnect_max_s: connection tuning.
        mqtt_version: ``"auto"`` (MQTT 5, and 3.1.1 when the server refuses it), ``"5"`` or ``"3.1.1"``.
            On MQTT 5 a refused trigger or blob fails only its submissions (``FanoutRejected`` with
            ``detail["reason_code"]``) and the connection stays up.
        ack_timeout_s: drop the connection when a PUBACK is this late.
        close_timeout_s: how long ``close`` waits for in-memory items to be acknowledged before
            spilling them to the outbox.
    """

    def __init__(
        self,
        host: str = "127.0.0.1",
        port: int = 1883,
        username: str | None = None,
        password: str | None = None,
        client_id: str | None = None,
        outbox_dir: str | os.PathLike[str] | None = None,
        *,
        durability: Literal["hybrid", "always"] = "hybrid",
        ring_size: int = 10_000,
        max_batch: int = 1_000_000,
        max_packet_bytes: int | None = 1 << 20,
        max_inflight: int = 128,
        max_attempts: int = 5,
        backoff_base_s: float = 1.0,
        backoff_max_s: float = 300.0,
        dead_letter_retain_days: float = 30.0,
        reject_is_final: bool = True,
        keepalive_s: int = 30,
        connect_timeout_s: float = 5.0,
        reconnect_min_s: float = 0.1,
        reconnect_max_s: float = 5.0,
        ack_timeout_s: float = 30.0,
        close_timeout_s: float = 10.0,
        mqtt_version: Literal["auto", "5", "3.1.1"] = "auto",
    ) -> None:
        if durability not in ("hybrid", "always"):
            raise ValueError(f"durability must be 'hybrid' or 'always', got {durability!r}")
        if mqtt_version not in ("auto", "5", "3.1.1"):
            raise ValueError(f"mqtt_version must be 'auto', '5' or '3.1.1', got {mqtt_version!r}")
        if max_batch < 1 or max_inflight < 1:
            raise ValueError("max_batch and max_inflight must be >= 1")
        self.host, self.port = host, port
        self._username, self._password = username, password
        self.client_id = client_id or f"fanout-client-{uuid.uuid4().hex[:12]}"
        self.outbox_dir = Path(outbox_dir) if outbox_dir is not None else DEFAULT_OUTBOX_DIR
        self.durability = durability
        self.max_batch = max_batch
        self._max_trigger_bytes = None if max_packet_bytes is None else max(256, max_packet_bytes - 64)  # PUBLISH header + topic
        self.policy = RetryPolicy(max_attempts, backoff_base_s, 2.0, backoff_max_s)
        self._retain_days = dead_letter_retain_days
        self._max_inflight = max_inflight
        self._reject_is_final = reject_is_final
        self._mqtt_version = mqtt_version
        self._mqtt5 = mqtt_version != "3.1.1"
        self._connects = 0
        self._keepalive_s = keepalive_s
        self._connect_timeout_s = connect_timeout_s
        self._reconnect = (reconnect_min_s, reconnect_max_s)
        self._ack_timeout_s = ack_timeout_s
        self._close_timeout_s = close_timeout_s
        self._ring: Ring[Submission] = Ring(ring_size)
        self._mode = COLD
        self._inflight = Inflight()
        self._cold: deque[Submission] = deque()
        self._cold_seqs: set[int] = set()
        self._outbox_dirty = True
        self._suspects: set[int] = set()
        self._isolated: int | None = None
        self._handles: dict[int, SubmitHandle] = {}
        self._rejections: dict[int, dict] = {}
        self._conn: BrokerConnection | None = None
        self._epoch = 0
        self._pending_writes = 0
        self._spills = 0
        self._removes: list[int] = []
        self._removing: set[int] = set()
        self._last_error = ""
        self._last_cluster_error = ""
        self._submitted = self._acked = 0
        self.mode_changes: list[tuple[str, str]] = []  # (mode, reason), bounded
        self._started = self._closed = False
        self._outbox: Outbox | None = None
        self._writer: GroupWriter | None = None
        self._tasks: list[asyncio.Task[None]] = []
        self._background: set[asyncio.Task[None]] = set()
        self._last_blob: tuple[bytes | None, str] = (None, "")

    # ------------------------------------------------------------------ lifecycle

    async def __aenter__(self) -> "FanoutClient":
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def start(self, connect_wait_s: float | None = None) -> None:
        """Open the outbox, start the connection, and wait (bounded) for the first connection attempt.

        A cluster that is down is not an error: the client starts in COLD mode and keeps trying.

        Args:
            connect_wait_s: how long to wait for the outcome of the first connection attempt
                (default ``connect_timeout_s`` + 1 s).

        Raises:
            OutboxLocked: another process uses ``outbox_dir``.
        """
        if self._started:
            return
        loop = asyncio.get_running_loop()
        self._loop = loop
        self._wake = asyncio.Event()
        self._lost = asyncio.Event()
        self._connected = asyncio.Event()
        self._control = RequestControl(self._publish_control, self._connected.wait)
        self._first_attempt = asyncio.Event()
        self._outbox = await loop.run_in_executor(None, lambda: Outbox(self.outbox_dir, policy=self.policy, dead_letter_retain_days=self._retain_days))
        self._writer = GroupWriter(self._outbox)
        await self._writer.run(self._outbox.prune_dead_letters)
        self._seq = self._outbox.next_seq
        self._started = True
        log.info("client.start", client_id=self.client_id, outbox=str(self.outbox_dir), outbox_depth=self._outbox.depth,
                 dead_letters=self._outbox.dead_count, durability=self.durability, mode=self._mode)
        for coro, name in ((self._connection_loop(), "connect"), (self._pump(), "pump"), (self._housekeeping(), "housekeeping")):
            self._tasks.append(loop.create_task(coro, name=f"fanout-client-{name}"))
        try:  # wait for the first attempt's outcome, not for a connection that may never come
            await asyncio.wait_for(self._first_attempt.wait(), self._connect_timeout_s + 1 if connect_wait_s is None else connect_wait_s)
        except asyncio.TimeoutError:
            pass
        if self._conn is None:
            log.warning("client.start_disconnected", host=self.host, port=self.port, error=self._last_error)

    async def close(self) -> None:
        """Stop: wait (bounded) for in-memory items to be acknowledged, spill the rest to the
        outbox, disconnect, and close the outbox. Handles still pending fail with FanoutClosed."""
        if self._closed or not self._started:
            return
        self._closed = True
        deadline = self._loop.time() + self._close_timeout_s
        while (len(self._ring) or any(not s.durable for s in self._inflight.subs())) and self._conn is not None \
                and self._loop.time() < deadline:
            await asyncio.sleep(0.005)
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        if self._background:
            await asyncio.wait(set(self._background), timeout=self._close_timeout_s)
        if self._conn is not None:
            conn, self._conn = self._conn, None
            await conn.close()
        leftovers = [s for s in self._inflight.reset() if not s.durable] + self._ring.drain()
        assert self._writer is not None and self._outbox is not None
        if leftovers:
            for s in leftovers:
                s.durable = True
            await self._writer.apply(OutboxBatch(appends=leftovers))
        if self._removes:
            removes, self._removes = self._removes, []
            await self._writer.apply(OutboxBatch(removes=removes))
        for handle in self._handles.values():
            handle._fail(FanoutClosed(f"client closed before {handle.request_id!r} was acknowledged; it stays in the outbox {self.outbox_dir}"))
        self._handles.clear()
        await self._writer.close()
        log.info("client.closed", client_id=self.client_id, outbox_depth=self._outbox.depth, spilled=len(leftovers))
        self._outbox.close()

    # ------------------------------------------------------------------ submit

    async def submit(
        self,
        vins: Iterable[str],
        payload: bytes | str,
        *,
        request_id: str | None = None,
        data_id: str | None = None,
    ) -> SubmitHandle:
        """Accept one submission: the blob and a trigger naming ``vins``.

        Returns as soon as the submission is accepted: HOT, in the in-memory ring (no I/O); COLD,
        fsynced in the outbox. Await ``handle.acked()`` for the PUBACKs. If the caller is
        cancelled while a COLD commit is under way the commit still completes and the
        submission is still delivered.

        Args:
            vins: the VINs (split into triggers of at most ``max_batch``; chunks share the request id).
            payload: the blob.
            request_id: the request id (default: a random UUID hex).
            data_id: blob id (default: SHA-1 hex of ``payload``).

        Returns:
            A :class:`SubmitHandle`.

        Raises:
            SubmissionInvalid: an argument cannot be sent (names it).
            FanoutClosed: the client is closed or not started.
            lmdb.Error, OSError: a COLD submission could not be written (it was not accepted).
        """
        if self._closed or not self._started:
            raise FanoutClosed("client is not running (use 'async with FanoutClient(...)' or start())")
        hashed = data_id is None
        if hashed and payload is self._last_blob[0]:
            data_id = self._last_blob[1]  # the same (immutable) bytes object as last time: skip re-hashing
        sub = make_submission(self._seq, vins, payload, request_id or uuid.uuid4().hex, data_id, now_ms())
        if hashed and type(payload) is bytes:
            self._last_blob = (payload, sub.data_id)
        self._seq += 1
        handle = SubmitHandle(sub, self._loop.create_future(), self._mode)
        self._handles[sub.seq] = handle
        self._submitted += 1
        if self._mode == HOT:
            if self._ring.push(sub):
                self._wake.set()
                return handle
            self._set_mode(COLD, "ring_full")
            handle.mode = COLD
        # The commit and what follows it run as a task of their own: a caller cancelled while the
        # commit is under way must not skip telling the pump (the item would sit in the outbox until
        # some later submit woke it) nor drop _pending_writes early (the client could go HOT with the
        # item still landing in the outbox).
        self._pending_writes += 1
        commit = self._loop.create_task(self._commit_cold(sub, handle), name=f"fanout-client-commit-{sub.seq}")
        self._background.add(commit)
        commit.add_done_callback(self._background.discard)
        await asyncio.shield(commit)  # a failed commit raises here; if the caller is gone, it was logged by the writer
        return handle

    async def _commit_cold(self, sub: Submission, handle: SubmitHandle) -> None:
        """Commit one COLD submission to the outbox, then hand it to the pump (``_pending_writes`` already counts it)."""
        assert self._writer is not None
        try:
            await self._writer.apply(OutboxBatch(appends=[sub]))
        except BaseException:
            self._handles.pop(sub.seq, None)
            raise
        finally:
            self._pending_writes -= 1
        sub.durable = True
        handle._sub = None  # the outbox holds it now
        self._outbox_dirty = True
        self._wake.set()

    # ------------------------------------------------------------------ observability and maintenance

    @overload
    def status(self) -> ClientStatus: ...

    @overload
    def status(self, request_id: str, *, timeout_s: float = DEFAULT_TIMEOUT_S) -> Awaitable[dict | None]: ...

    def status(self, request_id: str | None = None, *,
               timeout_s: float = DEFAULT_TIMEOUT_S) -> ClientStatus | Awaitable[dict | None]:
        """Without an argument, this client: a snapshot (mode, ring depth, outbox depth, oldest item age, dead
        letters, ...). With a request id, ``await client.status(request_id)``: the cluster's status of that
        request (``vins``, ``delivered``, ``pending``, ``inflight``, ``expired``, ``discarded``, ``cancelled``,
        ``state``, first/last delivery and expiry times in ms), or None when the cluster does not know it.

        Raises (the awaitable):
            ValueError: not a valid request id. FanoutUnavailable: no answer within ``timeout_s``.
        """
        if request_id is not None:
            return self._control.ask("status", request_id, timeout_s)
        ob = self._outbox
        candidates = [ts for ts in (self._ring.peek().ts_ms if len(self._ring) else None, self._inflight.oldest_ts_ms(),
                                    ob.oldest_ts_ms if ob else None) if ts is not None]
        oldest = (now_ms() - min(candidates)) / 1000 if candidates else None
        return ClientStatus(self.client_id, self._mode, self.durability, self._conn is not None, len(self._ring),
                            self._ring.capacity, len(self._inflight), ob.depth if ob else 0, len(ob.retry) if ob else 0,
                            len(self._suspects), oldest, ob.dead_count if ob else 0, self._submitted, self._acked,
                            self._last_error, "5" if self._mqtt5 else "3.1.1", self._connects)

    async def cancel(self, request_id: str, *, timeout_s: float = DEFAULT_TIMEOUT_S) -> dict | None:
        """Cancel a request: nothing more of it is delivered, its pending rows are removed (a message in flight
        may still arrive; its PUBACK is recorded). Returns its status after the cancel (durable on every shard),
        or None when the cluster does not know it. Idempotent.

        Raises:
            ValueError: not a valid request id. FanoutUnavailable: no answer within ``timeout_s``.
        """
        return await self._control.ask("cancel", request_id, timeout_s)

    def consume(self, topic: str, group: str, start: str | int = "latest", *, topic_filter: str | None = None,
                max_pending: int = DEFAULT_MAX_PENDING) -> AsyncIterator[TopicMessage]:
        """``async for msg in client.consume(topic, group)``: the durable topic's messages for this consumer group
        (:mod:`fanout.client.consume`); ``await msg.ack()`` commits (in offset order per partition). ``start``
        (``earliest`` | ``latest`` | an offset) applies to a group without commits.

        Raises:
            ValueError: a bad ``start``. FanoutUnavailable: the cluster did not say what the topic's filter is.
        """
        return consume(self, topic, group, start, topic_filter=topic_filter, max_pending=max_pending)

    async def topic_info(self, topic: str, *, timeout_s: float = DEFAULT_TIMEOUT_S) -> dict:
        """``{"filter", "partitions"}`` of a durable topic. Raises FanoutUnavailable (no answer, no such topic)."""
        body = await self._control.call(request_topic(topic, TOPIC_INFO), {}, timeout_s, f"topic-info of {topic!r}")
        if "error" in body:
            raise FanoutUnavailable(f"topic {topic!r}: {body.get('reason') or body['error']}")
        return body

    async def ack(self, topic: str, group: str, partition: int, upto: int, *,
                  timeout_s: float = DEFAULT_TIMEOUT_S) -> int | None:
        """Commit ``group``'s position in ``partition`` of ``topic`` up to ``upto`` (durable when this returns; a
        commit never moves a group back). Returns the group's committed offset there.

        Raises:
            FanoutUnavailable: no answer, or no such topic/partition.
        """
        body = await self._control.call(request_topic(topic, TOPIC_ACK),
                                        {"group": group, "partition": partition, "upto": upto}, timeout_s,
                                        f"topic-ack of {topic!r}/{group}")
        if "error" in body:
            raise FanoutUnavailable(f"topic-ack of {topic!r}/{group}: {body.get('reason') or body['error']}")
        return body.get("committed")

    def _publish_control(self, topic: str, payload: bytes) -> None:
        conn = self._conn
        if conn is None:
            raise ConnectionError("not connected")
        conn.publish(topic, payload)

    @property
    def mode(self) -> str:
        """``"hot"`` or ``"cold"``."""
        return self._mode

    async def dead_letters(self, limit: int | None = None) -> list[DeadLetter]:
        """The dead letters of this client's outbox, oldest first."""
        assert self._writer is not None and self._outbox is not None
        return await self._writer.read(self._outbox.dead_letters, limit)

    async def replay_dead_letters(self, seqs: Iterable[int] | None = None) -> int:
        """Move dead letters back to the outbox (attempts reset) to be sent again.

        Args:
            seqs: which ones (None = all).

        Returns:
            How many were moved back.
        """
        assert self._writer is not None and self._outbox is not None
        moved = await self._writer.run(self._outbox.replay_dead_letters, None if seqs is None else list(seqs))
        if moved:
            log.info("client.replay", count=len(moved), first_seq=moved[0])
            self._set_mode(COLD, "replay")
            self._outbox_dirty = True
            self._wake.set()
        return len(moved)

    async def drain(self, timeout: float | None = None) -> bool:
        """Wait until nothing is left to send (ring, in flight, outbox empty; dead letters aside).

        Returns:
            True when drained, False when ``timeout`` elapsed first.
        """
        deadline = None if timeout is None else self._loop.time() + timeout
        while len(self._ring) or len(self._inflight) or self._pending_writes or (self._outbox and self._outbox.depth) or self._removing:
            if deadline is not None and self._loop.time() >= deadline:
                return False
            await asyncio.sleep(0.005)
        return True

    def _set_mode(self, mode: str, reason: str) -> None:
        if mode == self._mode:
            return
        previous, self._mode = self._mode, mode
        self.mode_changes.append((mode, reason))
        del self.mode_changes[:-1000]
        log.info("client.mode", mode=mode, previous=previous, reason=reason, ring=len(self._ring),
                 outbox=self._outbox.depth if self._outbox else 0, connected=self._conn is not None)

    def _maybe_hot(self) -> None:
        ob = self._outbox
        if (self._mode == COLD and self.durability == "hybrid" and self._conn is not None and not self._closed
                and ob is not None and ob.depth == 0 and self._pending_writes == 0 and not self._cold):
            self._set_mode(HOT, "drained")
