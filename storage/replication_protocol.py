"""Replication of one shard: the primary's bounded log and the replica's apply rules.

Pure logic, transport-agnostic: the ``Dispatcher`` (primary) and ``StoreReplica`` actors call these
objects and move their arguments and answers over Ray. References: chain replication (van Renesse
and Schneider, OSDI 2004) for "apply in seq order, ack when every replica has it"; Raft for terms
(here: epochs) fencing a deposed leader.

Primary (``ShardPrimary``): apply the batch locally as seq n (one LMDB transaction that also bumps
``applied_seq``), keep ``(n, batch_bytes)`` in a ``ReplicationLog`` bounded by entries and bytes,
send ``apply(epoch, n, batch_bytes)`` to every replica, acknowledge the caller when all acked.

Replica (``ReplicaApplier``), for ``apply(epoch, seq, batch_bytes)``, with ``known`` = the highest
epoch the replica has seen and ``applied`` = its ``applied_seq``:

- Rule 1: ``epoch < known`` -> ``Rejected(known)``: the sender is a deposed primary.
- Rule 2: ``epoch > known`` -> adopt it (persisted in ``sys``) and go on with the rules below.
- Rule 3: ``seq <= applied`` -> ``Ack(applied)``, nothing applied (a retried send is idempotent).
- Rule 4: ``seq == applied + 1`` -> apply in one transaction, ``Ack(seq)``.
- Rule 5: ``seq > applied + 1`` -> ``Need(applied + 1)``: the primary resends from there, from its
  log (``ReplicationLog.since``) or, when the log was trimmed past it (``since`` returns None), by a
  snapshot (``ShardStore.copy_to`` -> ``ReplicaApplier.install_snapshot``) followed by the log.

Not handled here (the Controller's job): a deposed primary that applied a seq nobody else has holds a
divergent history under the same seq numbers; Rule 3 cannot see that, so such a node must rejoin by
installing a snapshot, never by catching up.
"""
from __future__ import annotations

import os
from collections import deque
from dataclasses import dataclass
from itertools import islice
from typing import Iterable, Union

import structlog

from storage.batch import WriteBatch
from storage.errors import FencedError, SequenceError
from storage.shard import ApplyResult, ShardStore
from storage.snapshot import SnapshotInfo

log = structlog.get_logger(__name__)


@dataclass(frozen=True, slots=True)
class Ack:
    """The replica holds every batch up to ``seq``."""

    seq: int


@dataclass(frozen=True, slots=True)
class Need:
    """The replica cannot apply the batch sent; resend from ``seq``."""

    seq: int


@dataclass(frozen=True, slots=True)
class Rejected:
    """The sender's epoch is stale; the replica knows ``epoch``."""

    epoch: int


ReplicaReply = Union[Ack, Need, Rejected]
LogEntry = tuple[int, bytes]


class ReplicationLog:
    """The primary's in-memory log of recent batches, bounded by entry count and bytes.

    Holds the contiguous seqs ``base_seq + 1 .. last_seq``; the newest entry is always kept, even
    when it alone exceeds ``max_bytes``.
    """

    def __init__(self, base_seq: int = 0, *, max_entries: int = 10_000, max_bytes: int = 256 << 20) -> None:
        """Args:
        base_seq: the seq the log starts after (the store's ``applied_seq`` when it opens).
        max_entries: keep at most this many batches.
        max_bytes: keep at most this many bytes of batches (beyond the newest one).

        Raises:
            ValueError: a bound below 1 or a negative base.
        """
        if max_entries < 1 or max_bytes < 1 or base_seq < 0:
            raise ValueError(f"bad log bounds: base_seq={base_seq} max_entries={max_entries} max_bytes={max_bytes}")
        self._entries: deque[LogEntry] = deque()
        self._base = base_seq
        self._bytes = 0
        self.max_entries = max_entries
        self.max_bytes = max_bytes

    @property
    def base_seq(self) -> int:
        """Highest seq no longer (or never) in the log; ``since`` needs a snapshot at or below it."""
        return self._base

    @property
    def last_seq(self) -> int:
        """Seq of the newest entry (``base_seq`` when empty)."""
        return self._base + len(self._entries)

    @property
    def size_bytes(self) -> int:
        """Bytes of batches held."""
        return self._bytes

    def __len__(self) -> int:
        return len(self._entries)

    def append(self, seq: int, batch_bytes: bytes) -> None:
        """Add the batch applied as ``seq``, then trim to the bounds.

        Raises:
            ValueError: ``seq`` is not ``last_seq + 1``.
        """
        if seq != self.last_seq + 1:
            raise ValueError(f"replication log append: seq {seq} is not last_seq+1 ({self.last_seq + 1})")
        self._entries.append((seq, batch_bytes))
        self._bytes += len(batch_bytes)
        while len(self._entries) > 1 and (len(self._entries) > self.max_entries or self._bytes > self.max_bytes):
            _, dropped = self._entries.popleft()
            self._bytes -= len(dropped)
            self._base += 1

    def drop_last(self, seq: int) -> bool:
        """Remove the newest entry if it is ``seq`` (a batch shipped before its local apply failed).

        Returns:
            Whether it was removed.
        """
        if not self._entries or self._entries[-1][0] != seq:
            return False
        _, data = self._entries.pop()
        self._bytes -= len(data)
        return True

    def since(self, seq: int) -> list[LogEntry] | None:
        """Entries from ``seq`` (inclusive) to the newest.

        Args:
            seq: the first seq wanted (a replica's ``Need.seq``, i.e. its applied_seq + 1).

        Returns:
            The entries in seq order (``[]`` when ``seq == last_seq + 1``), or None when ``seq`` was
            trimmed: the replica needs a snapshot first.

        Raises:
            ValueError: ``seq`` > ``last_seq + 1`` (the replica claims seqs this primary never wrote).
        """
        if seq <= self._base:
            return None
        if seq > self.last_seq + 1:
            raise ValueError(f"seq {seq} is beyond this log's last seq {self.last_seq}: divergent replica")
        # From the right: a replica in step asks for the newest few entries, and skipping from the left walks the
        # whole deque (10,000 entries when full: ~55 µs per call, once per commit on the event loop).
        out = list(islice(reversed(self._entries), self.last_seq - seq + 1))
        out.reverse()
        return out


@dataclass(frozen=True, slots=True)
class Shipment:
    """A batch the primary applied, to send to every replica as ``apply(epoch, seq, batch_bytes)``."""

    epoch: int
    seq: int
    batch_bytes: bytes
    result: ApplyResult


class ShardPrimary:
    """The primary side of one shard: local apply, log, catch-up material."""

    def __init__(self, store: ShardStore, epoch: int, log: ReplicationLog | None = None) -> None:
        """Take over ``store`` as primary for ``epoch`` (also the promotion of a replica).

        Args:
            store: the shard's store.
            epoch: this primary's epoch (persisted; must not be below the store's).
            log: a log to use (default: an empty one starting after the store's applied seq).

        Raises:
            FencedError: the store already saw a higher epoch.
        """
        store.set_epoch(epoch)
        self.store = store
        self.epoch = epoch
        self.log = log if log is not None else ReplicationLog(store.applied_seq)

    def write(self, batch: WriteBatch) -> Shipment:
        """Apply ``batch`` locally as the next seq and log it.

        Returns:
            The ``Shipment`` to send to replicas.

        Raises:
            FencedError: the store saw a higher epoch (this primary was deposed).
            StoreError: as ``ShardStore.apply``.
        """
        result = self.store.apply(batch, epoch=self.epoch)
        data = batch.to_bytes()  # after apply: enqueue VIN lists are sorted in place, replicas re-sort in O(n)
        self.log.append(result.seq, data)
        return Shipment(self.epoch, result.seq, data, result)

    def catch_up(self, from_seq: int) -> list[LogEntry] | None:
        """Log entries from ``from_seq`` for a replica that answered ``Need(from_seq)``; None -> snapshot."""
        return self.log.since(from_seq)

    def snapshot(self, dest_dir: str | os.PathLike[str]) -> SnapshotInfo:
        """A consistent compact copy of the store for a replica whose need was trimmed from the log."""
        return self.store.copy_to(dest_dir)

    def check_reply(self, reply: ReplicaReply) -> None:
        """Raise if a replica's answer says this primary is deposed.

        Raises:
            FencedError: ``Rejected`` with an epoch above this primary's.
        """
        if isinstance(reply, Rejected) and reply.epoch > self.epoch:
            raise FencedError(
                f"shard {self.store.shard_id}: primary at epoch {self.epoch} fenced by a replica at epoch {reply.epoch}",
                epoch=self.epoch,
                known_epoch=reply.epoch,
            )


class ReplicaApplier:
    """The replica side of one shard: applies shipped batches by the rules in the module docstring."""

    def __init__(self, store: ShardStore) -> None:
        """Args:
        store: the replica's store; the applier should be its only writer (it caches seq and epoch,
            and re-reads them if a write fails on a sequence or epoch check).
        """
        self.store = store
        self._epoch = store.epoch
        self._applied = store.applied_seq

    @property
    def epoch(self) -> int:
        """Highest epoch seen."""
        return self._epoch

    @property
    def applied_seq(self) -> int:
        """Seq of the last applied batch."""
        return self._applied

    def apply(self, epoch: int, seq: int, batch_bytes: bytes) -> ReplicaReply:
        """Apply one shipped batch by Rules 1-5.

        Args:
            epoch: the sender's epoch.
            seq: the batch's seq on the primary.
            batch_bytes: ``WriteBatch.to_bytes()`` of the batch.

        Returns:
            ``Ack``, ``Need`` or ``Rejected``.

        Raises:
            BatchFormatError: undecodable batch (nothing applied).
            StoreError: the store could not apply it (e.g. ``StoreFullError``).
        """
        if epoch < self._epoch:
            return Rejected(self._epoch)  # Rule 1
        if seq == self._applied + 1:  # Rule 4 (a higher epoch is persisted in the same transaction)
            try:
                result = self.store.apply(WriteBatch.from_bytes(batch_bytes), seq=seq, epoch=epoch)
            except (SequenceError, FencedError):
                self._refresh()  # someone else wrote the store: re-decide from what it holds
                return self.apply(epoch, seq, batch_bytes)
            self._applied, self._epoch = result.seq, result.epoch
            return Ack(result.seq)
        if epoch > self._epoch:  # Rule 2
            self.store.set_epoch(epoch)
            self._epoch = epoch
        if seq <= self._applied:  # Rule 3
            return Ack(self._applied)
        return Need(self._applied + 1)  # Rule 5

    def hello(self, epoch: int) -> ReplicaReply:
        """A primary's first contact (or probe): Rules 1-2, then ``Ack(applied_seq)`` so it knows where to start.

        Returns:
            ``Rejected(known)`` for a stale sender, else ``Ack(applied_seq)`` (a higher epoch is persisted).
        """
        if epoch < self._epoch:
            return Rejected(self._epoch)
        if epoch > self._epoch:
            self.store.set_epoch(epoch)
            self._epoch = epoch
        return Ack(self._applied)

    def _refresh(self) -> None:
        self._epoch, self._applied = self.store.epoch, self.store.applied_seq

    def apply_many(self, epoch: int, entries: Iterable[LogEntry]) -> ReplicaReply:
        """Apply catch-up entries in order; stop at the first answer that is not an ``Ack``.

        Returns:
            The last answer (``Ack(applied_seq)`` for an empty list).
        """
        if epoch < self._epoch:
            return Rejected(self._epoch)  # also for an empty list: a deposed primary must not think it is acked
        reply: ReplicaReply = Ack(self._applied)
        for seq, data in entries:
            reply = self.apply(epoch, seq, data)
            if not isinstance(reply, Ack):
                break
        return reply

    def install_snapshot(self, snapshot_dir: str | os.PathLike[str]) -> Ack:
        """Replace the replica's store by a primary's snapshot, keeping the higher epoch.

        The store is closed and reopened with the same options; ``self.store`` is the new object.

        Returns:
            ``Ack`` of the snapshot's applied seq (resend the log after it).

        Raises:
            StoreError: the snapshot is missing or of another shard (the old store is reopened).
        """
        old = self.store
        path, shard_id, options = old.path, old.shard_id, dict(old.options)
        known_epoch = self._epoch
        old.close()
        try:
            store = ShardStore.restore_from(snapshot_dir, path, shard_id, **options)
        except BaseException:
            self.store = ShardStore(path, shard_id, **options)
            raise
        if store.epoch < known_epoch:
            store.set_epoch(known_epoch)
        self.store = store
        self._epoch, self._applied = store.epoch, store.applied_seq
        log.info("replica_snapshot_installed", shard=shard_id, applied_seq=self._applied, epoch=self._epoch)
        return Ack(self._applied)


def table_digests(store: ShardStore) -> dict[str, str]:
    """SHA-1 of every replicated table's keys and values, from one read transaction.

    Two stores with equal digests hold the same rows (``sys`` is per store and not compared). Used by
    the fault tests and ``StoreReplica.digests`` to compare a caught-up replica with its primary.
    """
    import hashlib

    from storage import tables

    out: dict[str, str] = {}
    with store.snapshot_view() as view:
        for db in tables.USER_DBS:
            h = hashlib.sha1()
            n = 0
            for keys_, values in view.raw_chunks(db):
                for k, v in zip(keys_, values):
                    h.update(len(k).to_bytes(4, "big") + k + len(v).to_bytes(4, "big") + v)
                n += len(keys_)
            out[db] = f"{n}:{h.hexdigest()}"
    out["applied_seq"] = str(view.applied_seq)
    return out
