"""The primary's replication pipeline: ship applied batches to replicas, acknowledge writes when they hold them.

Strategy (transport-agnostic asyncio; the ``Dispatcher`` plugs in Ray handles, unit tests plug in-process
fakes through :class:`ReplicaTransport`):

- The primary ships a batch BEFORE applying it locally: :meth:`Replicator.ship` on the event loop serialises
  batch n, appends it to the bounded ``ReplicationLog`` and wakes one *pump* per replica, then the writer
  thread applies it as seq n (:meth:`Replicator.apply_shipped`; :meth:`Replicator.apply_local` does both from
  the writer thread, handing the batch to the loop first). The replicas apply n while the primary does, so a write costs
  max(local apply, replica round trip) instead of their sum; and the writer does not wait for replicas
  before applying n+1 either (pipelining). If the local apply fails after shipping, the entry is retracted
  and every replica is reinstalled from a snapshot (it may have applied a batch the primary never did; this
  happens only for a store error such as a full disk: a malformed batch fails on the replica too).
- A pump keeps ONE call in flight to its replica and each call carries every log entry the replica lacks
  (``apply_many``): batches that queue up while a call runs go out together in the next one. Replies follow
  the replica rules of :mod:`storage.replication_protocol`: ``Ack(n)`` advances the replica, ``Need(s)`` rewinds the
  pump to ``s`` (from the log, or by a snapshot when the log was trimmed past it), ``Rejected`` means this
  primary was deposed (every waiting write fails with ``FencedError``).
- The acknowledgement set is the replicas that are *in sync*. Seq n is acknowledged (its waiters resolve)
  when every in-sync replica acked n and at least ``min_acks`` of them did. A replica that errs or does not
  answer within ``timeout_s`` leaves the set (writes stop waiting for it); it rejoins when its pump has
  brought it up to the log's last seq (catch-up). A replica named by :meth:`set_replicas` is presumed in sync
  until it fails. With fewer than ``min_acks`` in sync, writes wait until a replica rejoins or ``2 * timeout_s``
  passes, then fail with :class:`ReplicationUnavailable` (no PUBACK; the
  platform retries, and ingest is idempotent).
- Before :meth:`set_replicas` was called at least once (a restarted primary that has not yet learned its
  replicas from the controller), writes wait the same way, so nothing is acknowledged unreplicated.
"""
from __future__ import annotations

import asyncio
import shutil
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import structlog

from storage.batch import ENQUEUE
from storage.errors import FencedError, StoreError
from storage.replication_protocol import Ack, LogEntry, Need, ReplicaReply, Rejected, ShardPrimary, Shipment
from storage.snapshot import SnapshotInfo

log = structlog.get_logger(__name__)

MAX_CALL_BYTES = 64 << 20  # one apply_many call carries at most this much (beyond its first entry)
SNAPSHOT_ATTEMPTS = 3


class ReplicationUnavailable(StoreError):
    """Fewer replicas than ``min_acks`` acknowledged a write in time (it is applied on the primary only)."""


class ReplicaTransport(Protocol):
    """How the primary talks to one replica (Ray actor calls in production)."""

    async def hello(self, epoch: int) -> ReplicaReply:
        """First contact: ``Ack(applied_seq)`` or ``Rejected``."""
        ...

    async def apply_many(self, epoch: int, entries: list[LogEntry]) -> ReplicaReply:
        """Apply consecutive log entries; the last answer."""
        ...

    async def send_snapshot(self, epoch: int, info: SnapshotInfo) -> ReplicaReply:
        """Ship the snapshot directory ``info.path`` and install it; ``Ack(info.applied_seq)``."""
        ...


@dataclass(slots=True)
class _Replica:
    rid: str
    transport: ReplicaTransport
    acked: int = -1  # -1: not heard from yet
    next_seq: int = -1
    in_sync: bool = False
    errors: int = 0
    last_error: str = ""
    generation: int = 0
    wake: asyncio.Event = field(default_factory=asyncio.Event)
    task: asyncio.Task | None = None


class Replicator:
    """One shard primary's replication state and pumps (see the module docstring).

    Args:
        primary: the shard's ``ShardPrimary`` (store, epoch, log).
        min_acks: in-sync replicas needed to acknowledge a write.
        timeout_s: a replica call slower than this drops the replica from the ack set; a write waiting for
            ``min_acks`` longer than this fails.
        expect_replicas: wait for :meth:`set_replicas` before acknowledging anything.
    """

    def __init__(self, primary: ShardPrimary, *, min_acks: int = 0, timeout_s: float = 5.0,
                 expect_replicas: bool = False, loop: asyncio.AbstractEventLoop | None = None) -> None:
        self.primary = primary
        self._loop = loop
        self.min_acks = min_acks
        self.timeout_s = timeout_s
        self._configured = not expect_replicas
        self._replicas: dict[str, _Replica] = {}
        self._waiters: list[tuple[int, asyncio.Future, float]] = []
        self._fenced: FencedError | None = None
        self._closed = False
        self._timer: asyncio.TimerHandle | None = None

    # -- the write path ------------------------------------------------------------------------------------

    @property
    def epoch(self) -> int:
        return self.primary.epoch

    def apply_local(self, batch: Any) -> Shipment:
        """Apply on the primary (writer thread). Raises ``FencedError`` once a replica deposed this primary."""
        if self._fenced is not None:
            raise self._fenced
        store = self.primary.store
        seq = store.applied_seq + 1  # this thread is the store's only writer: the seq is known before applying
        data = self._serialise(batch)
        loop = self._loop
        if loop is not None:  # ship first (see the module docstring); the loop appends in call order = seq order
            loop.call_soon_threadsafe(self._logged, seq, data)
        try:
            result = store.apply(batch, seq=seq, epoch=self.primary.epoch)
        except BaseException:
            if loop is not None:
                loop.call_soon_threadsafe(self._retract, seq)
            raise
        return Shipment(self.epoch, result.seq, data, result)

    def ship(self, batch: Any) -> tuple[int, bytes]:
        """On the event-loop thread, before the writer thread applies ``batch``: serialise it, log it as the next
        seq and wake the pumps, so the replicas start on it while the primary applies it.

        Why not from the writer thread, as :meth:`apply_local` does: its hand-over reaches the loop only once the
        loop thread gets the GIL back, which the writer thread holds through the batch's Python work (until
        LMDB's commit releases it), so the replicas started later than the primary (``docs/profile.md``, ninth
        round). Call it only when no other apply is in flight (the dispatcher's group commit runs one at a
        time), so ``applied_seq + 1`` is the seq.

        Returns:
            ``(seq, bytes)`` for :meth:`apply_shipped`.

        Raises:
            FencedError: a replica deposed this primary.
        """
        if self._fenced is not None:
            raise self._fenced
        seq = self.primary.store.applied_seq + 1
        data = self._serialise(batch)
        self._logged(seq, data)
        return seq, data

    def apply_shipped(self, batch: Any, seq: int, data: bytes) -> Shipment:
        """On the writer thread: apply a batch :meth:`ship` logged as ``seq`` (retracted if the apply fails)."""
        try:
            result = self.primary.store.apply(batch, seq=seq, epoch=self.primary.epoch)
        except BaseException:
            if self._loop is not None:
                self._loop.call_soon_threadsafe(self._retract, seq)
            else:  # no loop given: the caller runs everything on one thread
                self._retract(seq)
            raise
        return Shipment(self.epoch, result.seq, data, result)

    @staticmethod
    def _serialise(batch: Any) -> bytes:
        for op in batch.ops:
            if op[0] == ENQUEUE:
                op[4].sort()  # the local apply sorts these in place anyway; shipped sorted, replicas insert in key order
        return batch.to_bytes()

    def _logged(self, seq: int, data: bytes) -> None:
        plog = self.primary.log
        if seq == plog.last_seq + 1:
            plog.append(seq, data)
            for r in self._replicas.values():
                r.wake.set()

    def _retract(self, seq: int) -> None:
        """The local apply of a shipped ``seq`` failed: forget it; replicas that may hold it get a snapshot."""
        if not self.primary.log.drop_last(seq):
            return
        log.error("local apply failed after shipping: replicas will be reinstalled by snapshot",
                  shard=self.primary.store.shard_id, seq=seq)
        for r in self._replicas.values():
            r.generation += 1  # replies to calls made before this are ignored
            r.next_seq = 0
            r.acked = -1
            self._drop(r, f"seq {seq} retracted")

    def shipped(self, shipment: Shipment) -> asyncio.Future:
        """Log the applied batch (event-loop thread, in seq order) and return a future of its acknowledgement.

        Returns:
            A future resolved when the batch is replicated as required, failed with ``ReplicationUnavailable``
            or ``FencedError`` otherwise.
        """
        self._logged(shipment.seq, shipment.batch_bytes)  # no-op when shipped early by apply_local
        fut = asyncio.get_running_loop().create_future()
        # Twice the replica timeout: a stalled replica is dropped from the ack set (after timeout_s) before
        # a write that could go on without it is failed.
        self._waiters.append((shipment.seq, fut, time.monotonic() + 2 * self.timeout_s))
        for r in self._replicas.values():
            r.wake.set()
        self._settle()
        return fut

    # -- membership ------------------------------------------------------------------------------------------

    def set_replicas(self, replicas: dict[str, ReplicaTransport], min_acks: int | None = None) -> None:
        """Replace the replica set; a replica id already present keeps its pump and state."""
        self._configured = True
        if min_acks is not None:
            self.min_acks = min_acks
        for rid in set(self._replicas) - set(replicas):
            gone = self._replicas.pop(rid)
            if gone.task is not None:
                gone.task.cancel()
        for rid, transport in replicas.items():
            old = self._replicas.get(rid)
            if old is not None:
                old.transport = transport
                continue
            # Presumed in the ack set until it fails or times out: a write right after start-up (or after a
            # failover) waits for the replicas the controller named instead of being acknowledged on the primary alone.
            r = _Replica(rid, transport, in_sync=True)
            self._replicas[rid] = r
            r.task = asyncio.get_running_loop().create_task(self._pump(r))
        log.info("replicas set", shard=self.primary.store.shard_id, epoch=self.epoch, replicas=sorted(replicas),
                 min_acks=self.min_acks)
        self._settle()

    def close(self) -> None:
        self._closed = True
        for r in self._replicas.values():
            if r.task is not None:
                r.task.cancel()
        if self._timer is not None:
            self._timer.cancel()
        for _seq, fut, _dl in self._waiters:
            if not fut.done():
                fut.set_exception(ReplicationUnavailable("primary closed"))
        self._waiters = []

    def status(self) -> dict[str, Any]:
        """``{epoch, applied_seq, log_base, min_acks, replicas: [{id, acked_seq, lag, in_sync, errors}]}``."""
        last = self.primary.log.last_seq
        return {
            "epoch": self.epoch, "applied_seq": last, "log_base": self.primary.log.base_seq,
            "log_entries": len(self.primary.log), "min_acks": self.min_acks, "fenced": self._fenced is not None,
            "waiting_writes": len(self._waiters),
            "replicas": [{"id": r.rid, "acked_seq": r.acked, "lag": (last - r.acked) if r.acked >= 0 else None,
                          "in_sync": r.in_sync, "errors": r.errors, "last_error": r.last_error}
                         for r in self._replicas.values()],
        }

    # -- acknowledgement ------------------------------------------------------------------------------------------

    def _settle(self) -> None:
        """Resolve the waiters the ack set now covers; fail the ones past their deadline."""
        if not self._waiters:
            return
        in_sync = [r for r in self._replicas.values() if r.in_sync]
        frontier = -1
        if self._configured and len(in_sync) >= self.min_acks:
            frontier = min((r.acked for r in in_sync), default=self.primary.log.last_seq)
        now = time.monotonic()
        keep: list[tuple[int, asyncio.Future, float]] = []
        for seq, fut, deadline in self._waiters:
            if fut.done():
                continue
            if self._fenced is not None:
                fut.set_exception(self._fenced)
            elif seq <= frontier:
                fut.set_result(seq)
            elif now >= deadline:
                fut.set_exception(ReplicationUnavailable(
                    f"shard {self.primary.store.shard_id}: seq {seq} not acknowledged by {self.min_acks} replica(s) "
                    f"within {self.timeout_s:.1f}s ({len(in_sync)} in sync)"))
            else:
                keep.append((seq, fut, deadline))
        self._waiters = keep
        if keep and self._timer is None and not self._closed:
            delay = max(0.01, min(d for _, _, d in keep) - now)
            self._timer = asyncio.get_running_loop().call_later(delay, self._on_timer)

    def _on_timer(self) -> None:
        self._timer = None
        self._settle()

    def _drop(self, r: _Replica, why: str) -> None:
        r.errors += 1
        r.last_error = why[:200]
        if r.in_sync:
            r.in_sync = False
            log.warning("replica dropped from the ack set", shard=self.primary.store.shard_id, replica=r.rid,
                        acked_seq=r.acked, reason=why[:200])
        self._settle()

    # -- the pump -----------------------------------------------------------------------------------------------

    async def _call(self, r: _Replica, coro: Any) -> ReplicaReply:
        """Await one replica call; past ``timeout_s`` drop the replica from the ack set but keep waiting (bounded):
        the call may still land, and replies must stay in order."""
        task = asyncio.ensure_future(coro)
        try:
            return await asyncio.wait_for(asyncio.shield(task), self.timeout_s)
        except asyncio.TimeoutError:
            self._drop(r, f"no answer within {self.timeout_s:.1f}s")
        return await asyncio.wait_for(task, max(60.0, 10 * self.timeout_s))

    async def _pump(self, r: _Replica) -> None:
        backoff = 0.05
        plog = self.primary.log
        while not self._closed and self._fenced is None:
            generation = r.generation
            try:
                if r.next_seq < 0:
                    reply = await self._call(r, r.transport.hello(self.epoch))
                elif r.next_seq > plog.last_seq:
                    if not r.in_sync:
                        self._rejoin(r)
                    r.wake.clear()
                    await r.wake.wait()
                    continue
                else:
                    entries = plog.since(r.next_seq)
                    if entries is None:
                        reply = await self._snapshot(r)
                    else:
                        reply = await self._call(r, r.transport.apply_many(self.epoch, _cap(entries)))
                backoff = 0.05
            except asyncio.CancelledError:
                raise
            except ValueError as exc:  # the replica claims seqs beyond our log: divergent, reinstall it
                log.warning("replica ahead of the primary's log, sending a snapshot", replica=r.rid, error=str(exc))
                r.next_seq = 0
                continue
            except Exception as exc:  # dead or restarting replica: probe again after a pause
                self._drop(r, repr(exc))
                r.next_seq = -1
                await asyncio.sleep(backoff)
                backoff = min(2.0, backoff * 2)
                continue
            if generation == r.generation:  # else a retraction happened meanwhile: the reply may ack a stale seq
                self._on_reply(r, reply)

    def _on_reply(self, r: _Replica, reply: ReplicaReply) -> None:
        if isinstance(reply, Rejected):
            if reply.epoch > self.epoch:
                self._fenced = FencedError(
                    f"shard {self.primary.store.shard_id}: primary at epoch {self.epoch} deposed (replica {r.rid} "
                    f"knows epoch {reply.epoch})", epoch=self.epoch, known_epoch=reply.epoch)
                log.error("primary fenced", shard=self.primary.store.shard_id, epoch=self.epoch, known=reply.epoch)
                self._settle()
            return
        if isinstance(reply, Need):
            r.next_seq = reply.seq
            r.acked = reply.seq - 1
        elif isinstance(reply, Ack):
            if reply.seq > self.primary.log.last_seq:  # a replica ahead of us (divergent): reinstall it
                r.next_seq = 0
                return
            r.acked = reply.seq
            r.next_seq = reply.seq + 1
        if not r.in_sync and r.acked >= self.primary.log.last_seq:
            self._rejoin(r)
        self._settle()

    def _rejoin(self, r: _Replica) -> None:
        r.in_sync = True
        log.info("replica in sync", shard=self.primary.store.shard_id, replica=r.rid, acked_seq=r.acked,
                 epoch=self.epoch)
        self._settle()

    async def _snapshot(self, r: _Replica) -> ReplicaReply:
        """Catch-up beyond the log: a consistent copy of the store (``env.copy``), then the log after it."""
        store = self.primary.store
        loop = asyncio.get_running_loop()
        for attempt in range(SNAPSHOT_ATTEMPTS):
            dest = Path(f"{store.path}.snap-{uuid.uuid4().hex[:8]}")
            try:
                info = await loop.run_in_executor(None, self.primary.snapshot, dest)
                log.info("sending snapshot to replica", shard=store.shard_id, replica=r.rid,
                         applied_seq=info.applied_seq, size_bytes=info.size_bytes, attempt=attempt)
                reply = await asyncio.wait_for(r.transport.send_snapshot(self.epoch, info),
                                               max(60.0, 10 * self.timeout_s))
            finally:
                shutil.rmtree(dest, ignore_errors=True)
            if not isinstance(reply, Ack) or self.primary.log.since(reply.seq + 1) is not None:
                return reply
        raise StoreError(f"replica {r.rid}: the log moved past {SNAPSHOT_ATTEMPTS} snapshots in a row")


def _cap(entries: list[LogEntry]) -> list[LogEntry]:
    """At most ``MAX_CALL_BYTES`` of entries (always the first), so one call's arguments stay bounded."""
    total = 0
    for i, (_seq, data) in enumerate(entries):
        total += len(data)
        if i and total > MAX_CALL_BYTES:
            return entries[:i]
    return entries


__all__ = ["Replicator", "ReplicaTransport", "ReplicationUnavailable"]
