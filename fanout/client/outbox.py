"""Durable outbox of the platform client: LMDB in a local directory, plus dead letters.

Strategy:

- One LMDB environment per outbox directory, opened with ``sync=True``: every committed write
  transaction is fsynced before ``commit`` returns, so a COLD ``submit`` that returned survives a
  process crash and a power loss. Writes arrive as one :class:`OutboxBatch` (appends, failures,
  removes) applied in one transaction; the client coalesces concurrent operations into one batch
  (group commit), so N concurrent COLD submits cost one fsync.
- Tables: ``items`` (seq, 8-byte big endian -> msgpack record) so a cursor yields submission order;
  ``retry`` (seq -> [attempts, next_retry_ms, last_error]) only for items that failed, mirrored in
  memory so a scan for ready items never reads a payload it skips; ``dead`` (seq -> [record,
  attempts, last_error, dead_at_ms]).
- One client per outbox: an exclusive ``flock`` on ``client.lock`` (released by the kernel when the
  process dies, so ``kill -9`` never leaves a stale lock). Read-only tools (``fanout outbox status``)
  open without the lock; LMDB itself is safe across processes.
- Threads: writes come from one thread at a time (the client's writer thread); reads
  (``load_ready``, ``dead_letters``) may run on another. Growing the map on ``MapFullError`` calls
  ``set_mapsize``, which py-lmdb allows only while no transaction of this process is active, so every
  transaction holds a ``storage.guard.ResizeGuard`` shared and a grow holds it exclusive (a waiting
  grow keeps new transactions out, so a stream of reads cannot starve it). A thread never opens a
  transaction while it holds one: a grow waiting in between would deadlock it. A failed write
  transaction is aborted, and the map grown, with the writer's shared hold turned exclusive
  (``ResizeGuard.upgraded``): py-lmdb's write abort waits for every in-flight read call, and a stream
  of reads starved it without end.
"""
from __future__ import annotations

import fcntl
import os
import struct
import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Container, Iterable, Iterator, TypeVar

import lmdb
import msgpack
import structlog

from fanout.client.backoff import RetryPolicy
from fanout.client.errors import OutboxLocked
from fanout.client.submission import Submission
from storage.guard import ResizeGuard

log = structlog.get_logger(__name__)
R = TypeVar("R")

_SEQ = struct.Struct(">Q")
_DAY_MS = 86_400_000
DEFAULT_OUTBOX_DIR = Path(os.environ.get("XDG_STATE_HOME") or Path.home() / ".local" / "state") / "sdv-fanout" / "outbox"


def now_ms() -> int:
    """Wall-clock time in ms (outbox timestamps survive restarts, so not monotonic)."""
    return time.time_ns() // 1_000_000


@dataclass(slots=True)
class Failure:
    """One failed attempt to record: ``final`` dead-letters at once (explicit cluster rejection)."""

    seq: int
    error: str
    final: bool = False


@dataclass(slots=True)
class OutboxBatch:
    """Outbox mutations applied in one fsynced transaction, in this order: appends, failures, removes."""

    appends: list[Submission] = field(default_factory=list)
    failures: list[Failure] = field(default_factory=list)
    removes: list[int] = field(default_factory=list)

    def extend(self, other: "OutboxBatch") -> None:
        self.appends.extend(other.appends)
        self.failures.extend(other.failures)
        self.removes.extend(other.removes)


@dataclass(slots=True)
class ApplyResult:
    """What a batch did to failed items: ``dead`` seq -> (attempts, error); ``retry`` seq -> next ms."""

    dead: dict[int, tuple[int, str]] = field(default_factory=dict)
    retry: dict[int, int] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class DeadLetter:
    """A dead-lettered submission as listed by ``fanout outbox dead-letters``."""

    seq: int
    request_id: str
    data_id: str
    vins: int
    payload_bytes: int
    attempts: int
    last_error: str
    ts_ms: int
    dead_at_ms: int


@dataclass(frozen=True, slots=True)
class OutboxStatus:
    """Counters of one outbox."""

    path: str
    depth: int
    retrying: int
    dead_letters: int
    oldest_ts_ms: int | None
    next_retry_ms: int | None


class Outbox:
    """The durable outbox and dead-letter store of one client.

    Args:
        path: directory (created if missing).
        policy: retry policy applied by :meth:`apply` to failures.
        dead_letter_retain_days: dead letters older than this are removed by :meth:`prune_dead_letters`.
        exclusive: take the one-client lock (False for read-only tools).
        map_size: initial LMDB map size in bytes; doubled on demand.

    Raises:
        OutboxLocked: ``exclusive`` and another live process holds the directory.
    """

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        policy: RetryPolicy | None = None,
        dead_letter_retain_days: float = 30,
        exclusive: bool = True,
        map_size: int = 64 << 20,
    ) -> None:
        self.path = Path(path)
        self.path.mkdir(parents=True, exist_ok=True)
        self.policy = policy or RetryPolicy()
        self.retain_ms = int(dead_letter_retain_days * _DAY_MS)
        self._lock_fd: int | None = self._take_lock() if exclusive else None
        self._guard = ResizeGuard()
        try:
            self._env = lmdb.open(str(self.path), subdir=True, map_size=map_size, max_dbs=4, sync=True,
                                  metasync=True, readahead=False, meminit=False)
        except BaseException:
            self._release_lock()
            raise
        self._items = self._env.open_db(b"items")
        self._retry_db = self._env.open_db(b"retry")
        self._dead = self._env.open_db(b"dead")
        self.retry: dict[int, tuple[int, int, str]] = {}
        with self._txn() as txn:
            for k, v in txn.cursor(db=self._retry_db):
                attempts, next_ms, err = msgpack.unpackb(v, raw=False)
                self.retry[_SEQ.unpack(k)[0]] = (attempts, next_ms, err)
            self.depth = txn.stat(self._items)["entries"]
            self.dead_count = txn.stat(self._dead)["entries"]
            last_items = _last_key(txn, self._items)
            last_dead = _last_key(txn, self._dead)
        self.next_seq = max(last_items, last_dead) + 1
        self.oldest_ts_ms = self._read_oldest_ts()

    # ------------------------------------------------------------------ lifecycle

    def _take_lock(self) -> int:
        fd = os.open(self.path / "client.lock", os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 64, 0).decode(errors="replace").strip() or "?"
            os.close(fd)
            raise OutboxLocked(f"outbox {self.path} is in use by process {holder}; give each client its own outbox_dir") from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, str(os.getpid()).encode(), 0)
        return fd

    def _release_lock(self) -> None:
        if self._lock_fd is not None:
            os.close(self._lock_fd)
            self._lock_fd = None

    def close(self) -> None:
        """Close the environment and release the lock (idempotent)."""
        with self._guard.exclusive():
            if self._env is not None:
                self._env.close()
                self._env = None  # type: ignore[assignment]
        self._release_lock()

    # ------------------------------------------------------------------ transactions

    @contextmanager
    def _txn(self, db: lmdb._Database | None = None) -> Iterator[lmdb.Transaction]:
        """A read transaction holding the map guard shared (see the module docstring; writes: ``_write``)."""
        with self._guard.shared(), self._env.begin(db=db) as txn:
            yield txn

    def _write(self, body: Callable[[lmdb.Transaction], R]) -> R:
        """Run ``body`` in one write transaction, growing the map and re-running it on ``MapFullError``
        (the failed transaction was aborted, so ``body`` must keep its effects inside it)."""
        while True:
            with self._guard.shared():
                txn = self._env.begin(write=True)
                try:
                    result = body(txn)
                    txn.commit()
                    return result
                except BaseException as exc:
                    # py-lmdb's write abort waits until no other thread is inside an LMDB call; readers
                    # looping over cursors starved it for minutes (test_map_grows_while_readers_scan...
                    # hung), so hold the reads off for the abort, and for the grow that follows.
                    with self._guard.upgraded():
                        txn.abort()
                        if not isinstance(exc, lmdb.MapFullError):
                            raise
                        size = self._env.info()["map_size"] * 2
                        self._env.set_mapsize(size)  # py-lmdb: needs no active transaction in this process
            log.info("outbox.map_grow", path=str(self.path), map_size=size)

    # ------------------------------------------------------------------ writes

    def apply(self, batch: OutboxBatch, now: int | None = None) -> ApplyResult:
        """Apply appends, failures and removes in one fsynced transaction.

        A failure of an item not in the outbox (already acked or removed) is ignored; a failure
        brings ``attempts`` up by one and sets ``next_retry_ms`` by the policy, or moves the item to
        the dead letters (``final`` or ``attempts >= max_attempts``).

        Args:
            batch: the mutations.
            now: wall-clock ms for backoff and dead-letter timestamps (default: now).

        Returns:
            Which failed items were retried (and when) or dead-lettered.

        Raises:
            lmdb.Error: the write failed (nothing was applied).
        """
        now = now_ms() if now is None else now
        result, retry_changes, d_depth, d_dead = self._write(lambda txn: self._apply_txn(txn, batch, now))
        for seq, value in retry_changes.items():
            if value is None:
                self.retry.pop(seq, None)
            else:
                self.retry[seq] = value
        self.depth += d_depth
        self.dead_count += d_dead
        if batch.removes or result.dead or (batch.appends and self.oldest_ts_ms is None):
            self.oldest_ts_ms = self._read_oldest_ts()
        return result

    def _apply_txn(self, txn: lmdb.Transaction, batch: OutboxBatch,
                   now: int) -> tuple[ApplyResult, dict[int, tuple[int, int, str] | None], int, int]:
        result = ApplyResult()
        retry_changes: dict[int, tuple[int, int, str] | None] = {}
        d_depth = d_dead = 0
        for sub in batch.appends:
            key = _SEQ.pack(sub.seq)
            if txn.replace(key, sub.pack(), db=self._items) is None:
                d_depth += 1
            if sub.attempts:
                state = (sub.attempts, sub.next_retry_ms, sub.last_error)
                txn.put(key, msgpack.packb(list(state)), db=self._retry_db)
                retry_changes[sub.seq] = state
        for f in batch.failures:
            key = _SEQ.pack(f.seq)
            raw = txn.get(key, db=self._items)
            if raw is None:
                continue
            prev = retry_changes.get(f.seq) or self.retry.get(f.seq)
            attempts, next_ms = self.policy.after_failure(prev[0] if prev else 0, now)
            if f.final or next_ms is None:
                txn.delete(key, db=self._items)
                txn.delete(key, db=self._retry_db)
                txn.put(key, msgpack.packb([raw, attempts, f.error, now]), db=self._dead)
                retry_changes[f.seq] = None
                result.dead[f.seq] = (attempts, f.error)
                d_depth -= 1
                d_dead += 1
            else:
                state = (attempts, next_ms, f.error)
                txn.put(key, msgpack.packb(list(state)), db=self._retry_db)
                retry_changes[f.seq] = state
                result.retry[f.seq] = next_ms
        for seq in batch.removes:
            key = _SEQ.pack(seq)
            if txn.delete(key, db=self._items):
                d_depth -= 1
            if txn.delete(key, db=self._retry_db):
                retry_changes[seq] = None
        return result, retry_changes, d_depth, d_dead

    # ------------------------------------------------------------------ reads

    def load_ready(self, now: int, exclude: Container[int], limit: int) -> list[Submission]:
        """Items that may be published now, in sequence order.

        Args:
            now: wall-clock ms; items whose ``next_retry_ms`` is later are skipped.
            exclude: seqs to skip (in flight or already queued by the caller).
            limit: most items returned.

        Returns:
            Up to ``limit`` submissions (``durable=True``, retry state filled in).
        """
        out: list[Submission] = []
        retry = self.retry
        with self._txn(db=self._items) as txn:
            cur = txn.cursor()
            for key in cur.iternext(keys=True, values=False):
                seq = _SEQ.unpack(key)[0]
                if seq in exclude:
                    continue
                state = retry.get(seq)
                if state is not None and state[1] > now:
                    continue
                sub = Submission.unpack(seq, cur.value())
                if state is not None:
                    sub.attempts, sub.next_retry_ms, sub.last_error = state
                out.append(sub)
                if len(out) >= limit:
                    break
        return out

    def next_retry_ms(self) -> int | None:
        """Earliest ``next_retry_ms`` among items waiting for a retry, or None."""
        return min((s[1] for s in list(self.retry.values())), default=None)  # list(): atomic snapshot vs the writer thread

    def _read_oldest_ts(self) -> int | None:
        with self._txn(db=self._items) as txn:
            cur = txn.cursor()
            if not cur.first():
                return None
            up = msgpack.Unpacker(raw=False)
            up.feed(cur.value())
            up.read_array_header()
            up.skip()
            return int(up.unpack())

    def status(self) -> OutboxStatus:
        """Depth, retrying items, dead letters, oldest item and next retry time."""
        return OutboxStatus(str(self.path), self.depth, len(self.retry), self.dead_count, self.oldest_ts_ms, self.next_retry_ms())

    # ------------------------------------------------------------------ dead letters

    def dead_letters(self, limit: int | None = None) -> list[DeadLetter]:
        """Dead letters, oldest sequence first.

        Args:
            limit: most returned (None = all).
        """
        out: list[DeadLetter] = []
        with self._txn(db=self._dead) as txn:
            for key, value in txn.cursor():
                seq = _SEQ.unpack(key)[0]
                raw, attempts, err, dead_at = msgpack.unpackb(value, raw=False)
                sub = Submission.unpack(seq, raw)
                out.append(DeadLetter(seq, sub.request_id, sub.data_id, len(sub.vins), len(sub.payload), attempts, err, sub.ts_ms, dead_at))
                if limit is not None and len(out) >= limit:
                    break
        return out

    def replay_dead_letters(self, seqs: Iterable[int] | None = None) -> list[int]:
        """Move dead letters back into the outbox with their attempts reset.

        They keep their original sequence number, so they are sent before anything newer still
        waiting in the outbox.

        Args:
            seqs: which dead letters (None = all).

        Returns:
            The seqs moved back.
        """
        wanted = None if seqs is None else {int(s) for s in seqs}

        def move(txn: lmdb.Transaction) -> list[int]:
            moved: list[int] = []
            for key, value in list(txn.cursor(db=self._dead)):
                seq = _SEQ.unpack(key)[0]
                if wanted is not None and seq not in wanted:
                    continue
                raw = msgpack.unpackb(value, raw=False)[0]
                txn.put(key, raw, db=self._items)
                txn.delete(key, db=self._dead)
                txn.delete(key, db=self._retry_db)
                moved.append(seq)
            return moved

        moved = self._write(move)
        for seq in moved:
            self.retry.pop(seq, None)
        self.depth += len(moved)
        self.dead_count -= len(moved)
        if moved:
            self.oldest_ts_ms = self._read_oldest_ts()
        return moved

    def prune_dead_letters(self, now: int | None = None) -> int:
        """Delete dead letters older than ``dead_letter_retain_days``.

        Returns:
            How many were deleted.
        """
        cutoff = (now_ms() if now is None else now) - self.retain_ms

        def prune(txn: lmdb.Transaction) -> int:
            pruned = 0
            for key, value in list(txn.cursor(db=self._dead)):
                if msgpack.unpackb(value, raw=False)[3] < cutoff:
                    txn.delete(key, db=self._dead)
                    pruned += 1
            return pruned

        pruned = self._write(prune)
        self.dead_count -= pruned
        if pruned:
            log.info("outbox.dead_letters_pruned", path=str(self.path), pruned=pruned)
        return pruned


def _last_key(txn: lmdb.Transaction, db: lmdb._Database) -> int:
    cur = txn.cursor(db=db)
    return _SEQ.unpack(cur.key())[0] if cur.last() else 0
