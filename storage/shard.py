"""ShardStore: one LMDB environment per shard directory, written only through WriteBatches.

Strategy:
- One environment per ``<data_dir>/shard-<k>/`` with the named tables of ``storage.tables``.
  LMDB allows one environment per path per process, so opening a path twice raises.
- ``apply(batch)`` runs every op and the ``sys.applied_seq`` bump in ONE write transaction: after a
  crash or an exception the store holds the whole batch or none of it, and ``applied_seq`` says which.
  Writes are serialised by a lock (LMDB has one writer anyway).
- The map starts small (256 MiB by default; on Linux without ``writemap`` the file only grows with
  what is written) and grows on demand: before a batch whose estimated size would not fit, and on
  ``MapFullError`` (abort, double, retry the whole batch). Growing replaces the memory map and kills
  every open transaction, so reads hold a shared ``ResizeGuard`` and growth takes it exclusively.
  At ``max_map_size_bytes``, or when the disk is full, the batch fails with ``StoreFullError``.
- Reads are short transactions; a missing key gives ``None``. Whole-table reads are either
  incremental (``scan``: one short transaction per step, resumable cursor) or bound to one
  transaction (``snapshot_view``) for a consistent export with its ``applied_seq`` watermark.
"""
from __future__ import annotations

import errno
import os
import threading
import time
import weakref
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator

import lmdb
import structlog

from storage import request_stats, snapshot, tables
from storage.batch_apply import Dbs, apply_ops
from storage.batch import WriteBatch, gc_paused
from storage.errors import FencedError, SequenceError, StoreClosedError, StoreError, StoreFullError
from storage.guard import ResizeGuard
from storage.queue_cursor import QueueCursor
from storage.reader import QueueRow, ShardReader, _get_int

__all__ = ["ApplyResult", "QueueRow", "ShardStore", "shard_dir"]

log = structlog.get_logger(__name__)

DEFAULT_MAP_SIZE_BYTES = 256 << 20
DEFAULT_MAX_MAP_SIZE_BYTES = 64 << 30
_PAGE = 4096

_open_paths: set[str] = set()
_open_paths_lock = threading.Lock()


def shard_dir(data_dir: str | os.PathLike[str], shard_id: int) -> Path:
    """Directory of shard ``shard_id`` under ``data_dir`` (``<data_dir>/shard-<k>``)."""
    return Path(data_dir) / f"shard-{shard_id}"


@dataclass(frozen=True, slots=True)
class ApplyResult:
    """What ``apply`` did: the seq now applied, the store's epoch, and per-verb counters."""

    seq: int
    epoch: int
    counts: dict[str, int] = field(default_factory=dict)
    duration_s: float = 0.0
    topic_offsets: list[tuple[str, int, int, int]] = field(default_factory=list)
    """``(topic, partition, first, last)`` offsets assigned to each ``topic_append`` op, in batch order."""


class ShardStore(ShardReader):
    """The LMDB store of one shard (see the module docstring); read verbs come from ``ShardReader``."""

    def __init__(
        self,
        path: str | os.PathLike[str],
        shard_id: int,
        *,
        map_size_bytes: int = DEFAULT_MAP_SIZE_BYTES,
        max_map_size_bytes: int = DEFAULT_MAX_MAP_SIZE_BYTES,
        sync: bool = True,
        readonly: bool = False,
        max_readers: int = 126,
        grow_ahead: bool = True,
    ) -> None:
        """Open (or create) the shard environment at ``path``.

        Args:
            path: the shard directory (created unless ``readonly``).
            shard_id: this shard's index; recorded in ``sys`` and checked on reopen.
            map_size_bytes: initial map size (raised to what the file already uses).
            max_map_size_bytes: growth cap; beyond it ``apply`` raises ``StoreFullError``.
            sync: fsync on commit (``False`` only for tests and throwaway stores).
            readonly: open without write access (inspection tools).
            max_readers: concurrent read transactions allowed across processes.
            grow_ahead: grow the map before a batch whose estimated size does not fit.

        Raises:
            StoreError: the path is already open in this process, holds another shard, or (readonly)
                is not a shard store.
        """
        self.path = Path(path)
        self.shard_id = shard_id
        self.readonly = readonly
        self.options: dict[str, Any] = {
            "map_size_bytes": map_size_bytes,
            "max_map_size_bytes": max_map_size_bytes,
            "sync": sync,
            "readonly": readonly,
            "max_readers": max_readers,
            "grow_ahead": grow_ahead,
        }
        """The keyword options this store was opened with (to reopen it alike)."""
        self._max_map = max(_round_page(max_map_size_bytes), _PAGE * 16)
        self._grow_ahead = grow_ahead
        self._write_lock = threading.RLock()
        self._guard = ResizeGuard()
        self._views: weakref.WeakSet[snapshot.SnapshotView] = weakref.WeakSet()
        if not readonly:
            self.path.mkdir(parents=True, exist_ok=True)
        self._real = os.path.realpath(self.path)
        with _open_paths_lock:
            if self._real in _open_paths:
                raise StoreError(f"shard store {self.path} is already open in this process")
            _open_paths.add(self._real)
        self._release = weakref.finalize(self, _release_path, self._real)
        self._env: lmdb.Environment | None = None
        try:
            self._env = lmdb.open(
                str(self.path),
                map_size=min(_round_page(map_size_bytes), self._max_map),
                max_dbs=len(tables.ALL_DBS) + 4,
                readonly=readonly,
                create=not readonly,
                sync=sync,
                metasync=sync,
                max_readers=max_readers,
                max_spare_txns=4,
            )
            self._env.reader_check()
            self._handles = self._open_dbs()
        except lmdb.Error as exc:
            self.close()
            raise StoreError(f"cannot open shard store {self.path}: {exc}") from exc
        except BaseException:
            self.close()
            raise
        self._dbs = Dbs(**{name: self._handles[name] for name in tables.ALL_DBS})

    def _open_dbs(self) -> dict[str, Any]:
        env = self._env
        assert env is not None
        handles: dict[str, Any] = {}
        for name in tables.ALL_DBS:  # without txn=: py-lmdb then keeps the handle valid (also read-only)
            try:
                handles[name] = env.open_db(name.encode(), create=not self.readonly)
            except lmdb.NotFoundError as exc:
                raise StoreError(f"{self.path} is not a shard store: table {name!r} missing") from exc
        with env.begin(write=not self.readonly) as txn:
            raw = txn.get(tables.SYS_SHARD_ID, db=handles[tables.SYS])
            if raw is None and not self.readonly:
                txn.put(tables.SYS_SHARD_ID, tables.pack(self.shard_id), db=handles[tables.SYS])
            elif raw is not None and tables.unpack(raw) != self.shard_id:
                raise StoreError(f"{self.path} holds shard {tables.unpack(raw)}, not shard {self.shard_id}")
            if not self.readonly and txn.get(tables.SYS_REQUESTS_BUILT, db=handles[tables.SYS]) is None:
                self._build_request_counters(txn, handles)
        return handles

    def _build_request_counters(self, txn: lmdb.Transaction, handles: dict[str, Any]) -> None:
        """One-time migration of a store written before the ``requests`` counters (``request_stats.rebuild``)."""
        started = time.perf_counter()
        requests, rows = request_stats.rebuild(txn, handles[tables.REQS], handles[tables.REQUESTS])
        txn.put(tables.SYS_REQUESTS_BUILT, tables.pack(1), db=handles[tables.SYS])
        (log.info if rows else log.debug)("request_counters_built", shard=self.shard_id, path=str(self.path),
                                          requests=requests, reqs_rows=rows,
                                          duration_s=round(time.perf_counter() - started, 3))

    # -- lifecycle -------------------------------------------------------------------------------
    def close(self) -> None:
        """Close the environment (idempotent). Open snapshot views die with it."""
        with self._write_lock:
            env, self._env = getattr(self, "_env", None), None
            if env is not None:
                env.close()
            self._release()

    def __enter__(self) -> ShardStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _live_env(self) -> lmdb.Environment:
        if self._env is None:
            raise StoreClosedError(f"shard store {self.path} is closed")
        return self._env

    # -- writes ----------------------------------------------------------------------------------
    def apply(self, batch: WriteBatch, *, seq: int | None = None, epoch: int | None = None) -> ApplyResult:
        """Apply ``batch`` and bump ``applied_seq`` in one write transaction.

        Args:
            batch: the ops to apply.
            seq: the seq to record (replicas pass the primary's); must be ``applied_seq + 1``.
                Default: ``applied_seq + 1``.
            epoch: the writer's epoch; lower than the stored epoch is refused, higher is persisted in
                the same transaction.

        Returns:
            ``ApplyResult`` with the new seq, the epoch and per-verb counters.

        Raises:
            FencedError: ``epoch`` below the stored epoch (nothing applied).
            SequenceError: ``seq`` is not ``applied_seq + 1`` (nothing applied).
            StoreFullError: the map cannot grow enough, or the disk is full (nothing applied).
            BatchFormatError: an unknown or malformed op (nothing applied).
            StoreError: the store is read-only or closed.
        """
        if self.readonly:
            raise StoreError(f"shard store {self.path} is read-only")
        started = time.perf_counter()
        with self._write_lock, gc_paused():
            if self._grow_ahead:
                self._ensure_headroom(*batch.space_estimate())
            while True:
                try:
                    topic_offsets: list[tuple[str, int, int, int]] = []
                    seq_now, epoch_now, counts = self._apply_once(batch, seq, epoch, topic_offsets)
                    break
                except lmdb.MapFullError:
                    self._grow(len(batch))
                except lmdb.MapResizedError:
                    self._resize(0)
                except lmdb.DiskError as exc:
                    raise self._disk_full(exc) from exc
                except OSError as exc:
                    if exc.errno == errno.ENOSPC:
                        raise self._disk_full(exc) from exc
                    raise
        result = ApplyResult(seq_now, epoch_now, counts, time.perf_counter() - started, topic_offsets)
        level = log.info if result.duration_s >= 1.0 else log.debug
        level("batch_applied", shard=self.shard_id, seq=seq_now, counts=counts, duration_s=round(result.duration_s, 4))
        return result

    def _apply_once(self, batch: WriteBatch, seq: int | None, epoch: int | None,
                    topic_offsets: list[tuple[str, int, int, int]] | None = None) -> tuple[int, int, dict[str, int]]:
        env, dbs = self._live_env(), self._dbs
        txn = env.begin(write=True)
        try:
            applied = _get_int(txn, dbs.sys, tables.SYS_APPLIED_SEQ)
            known_epoch = _get_int(txn, dbs.sys, tables.SYS_EPOCH)
            if epoch is not None and epoch < known_epoch:
                raise FencedError(
                    f"shard {self.shard_id}: write with epoch {epoch} refused, store is at epoch {known_epoch}",
                    epoch=epoch,
                    known_epoch=known_epoch,
                )
            if seq is not None and seq != applied + 1:
                raise SequenceError(
                    f"shard {self.shard_id}: seq {seq} is not applied_seq+1 ({applied + 1})",
                    seq=seq,
                    applied_seq=applied,
                )
            new_seq = applied + 1 if seq is None else seq
            counts = apply_ops(txn, dbs, batch.ops, self.shard_id, topic_offsets)
            txn.put(tables.SYS_APPLIED_SEQ, tables.pack(new_seq), db=dbs.sys)
            if epoch is not None and epoch > known_epoch:
                txn.put(tables.SYS_EPOCH, tables.pack(epoch), db=dbs.sys)
                known_epoch = epoch
            txn.commit()
        except BaseException:
            self._abort_write(txn)
            raise
        return new_seq, known_epoch, counts

    def _abort_write(self, txn: lmdb.Transaction) -> None:
        """Abort a write transaction with reads held off.

        py-lmdb's ``abort`` takes an environment-wide lock that every read operation also takes;
        with a few threads reading in a loop the aborting thread starves on it (measured: 0.4-40 s
        for one abort with three reader threads). The exclusive guard drains the reads first.
        """
        with self._guard.exclusive():
            txn.abort()

    def set_epoch(self, epoch: int) -> None:
        """Persist a higher epoch (equal is a no-op).

        Raises:
            FencedError: ``epoch`` below the stored epoch.
        """
        with self._write_lock:
            txn = self._live_env().begin(write=True)
            try:
                known = _get_int(txn, self._dbs.sys, tables.SYS_EPOCH)
                if epoch < known:
                    raise FencedError(
                        f"shard {self.shard_id}: epoch {epoch} is below the stored epoch {known}",
                        epoch=epoch,
                        known_epoch=known,
                    )
                if epoch > known:
                    txn.put(tables.SYS_EPOCH, tables.pack(epoch), db=self._dbs.sys)
                txn.commit()
            except BaseException:
                self._abort_write(txn)
                raise

    # -- map growth --------------------------------------------------------------------------------
    def _map_sizes(self) -> tuple[int, int]:
        env = self._live_env()
        info = env.info()
        return int(info["map_size"]), (int(info["last_pgno"]) + 1) * _PAGE

    def _ensure_headroom(self, new_bytes: int, touched_pages: int) -> None:
        map_size, used = self._map_sizes()
        needed = used + new_bytes + min(touched_pages * _PAGE, used)
        if needed <= map_size or map_size >= self._max_map:
            return
        target = map_size
        while target < needed and target < self._max_map:
            target *= 2
        self._resize(min(target, self._max_map), reason="grow_ahead")

    def _grow(self, batch_ops: int) -> None:
        map_size, used = self._map_sizes()
        if map_size >= self._max_map:
            log.error("store_full", shard=self.shard_id, path=str(self.path), map_size_bytes=map_size,
                      max_map_size_bytes=self._max_map)
            raise StoreFullError(
                f"shard store {self.path} is full: map size {map_size} bytes reached max_map_size_bytes "
                f"{self._max_map} ({used} bytes used); the batch of {batch_ops} ops was not applied"
            )
        self._resize(min(map_size * 2, self._max_map), reason="map_full")

    def _resize(self, new_size: int, reason: str = "adopt") -> None:
        env = self._live_env()
        old = int(env.info()["map_size"])
        with self._guard.exclusive():
            for view in list(self._views):
                view.invalidate()
            env.set_mapsize(new_size)
        log.warning("store_map_grown", shard=self.shard_id, path=str(self.path), reason=reason,
                    old_bytes=old, new_bytes=int(env.info()["map_size"]))

    def _disk_full(self, exc: BaseException) -> StoreFullError:
        log.error("store_disk_full", shard=self.shard_id, path=str(self.path), error=str(exc))
        map_size, used = self._map_sizes()
        return StoreFullError(
            f"disk full writing shard store {self.path} ({used} bytes used, map {map_size} bytes): {exc}"
        )

    # -- consistent views and snapshots ---------------------------------------------------------------
    @contextmanager
    def queue_cursor(self) -> Iterator[QueueCursor]:
        """ONE short read transaction over ``ids`` for a batch of next-row questions (a dispatcher tick).

        Holds the resize guard shared for the block, so keep it short (no awaits inside).

        Yields:
            :class:`storage.queue_cursor.QueueCursor`.
        """
        for attempt in (0, 1):
            env = self._live_env()
            self._guard.acquire_shared()
            try:
                txn = env.begin()
            except lmdb.MapResizedError:
                self._guard.release_shared()
                if attempt:
                    raise
                with self._write_lock:  # another process grew the map: adopt its size, then retry
                    self._resize(0)
                continue
            try:
                yield QueueCursor(txn.cursor(self._dbs.ids))
            finally:
                try:
                    txn.abort()
                finally:
                    self._guard.release_shared()
            return

    @contextmanager
    def snapshot_view(self) -> Iterator[snapshot.SnapshotView]:
        """A reader bound to ONE read transaction, with its ``applied_seq`` watermark.

        Yields:
            ``SnapshotView`` (``applied_seq``, ``epoch``, ``count(db)``, ``chunks(db, n)``).
        """
        env = self._live_env()
        with self._guard.shared():
            txn = env.begin()
            view = snapshot.SnapshotView(txn, self._handles, self._guard, self.shard_id)
            self._views.add(view)
        try:
            yield view
        finally:
            self._views.discard(view)
            view.invalidate()
            with self._guard.shared():
                if self._env is not None:
                    try:
                        txn.abort()
                    except lmdb.Error:
                        pass  # already invalidated by a resize

    def copy_to(self, dest_dir: str | os.PathLike[str]) -> snapshot.SnapshotInfo:
        """Write a compact, consistent snapshot of this shard into ``dest_dir`` (created; must be empty).

        Returns:
            ``SnapshotInfo`` with the ``applied_seq`` and ``epoch`` the copy holds.

        Raises:
            StoreError: ``dest_dir`` is not empty.
        """
        dest = Path(dest_dir)
        dest.mkdir(parents=True, exist_ok=True)
        if any(dest.iterdir()):
            raise StoreError(f"snapshot directory {dest} is not empty")
        env = self._live_env()
        with self._guard.shared():
            # One read transaction of its own: contents and sys.applied_seq/epoch are one instant.
            env.copy(str(dest), compact=True)
        info = snapshot.read_snapshot_info(dest)
        log.info("snapshot_written", shard=self.shard_id, path=str(dest), applied_seq=info.applied_seq,
                 size_bytes=info.size_bytes)
        return info

    @classmethod
    def restore_from(cls, snapshot_dir: str | os.PathLike[str], path: str | os.PathLike[str], shard_id: int,
                     **kwargs: Any) -> ShardStore:
        """Replace the shard at ``path`` by a snapshot and open it.

        Args:
            snapshot_dir: a directory written by ``copy_to``.
            path: the shard directory (its store must be closed).
            shard_id: expected shard id of the snapshot.
            **kwargs: ``ShardStore`` options.

        Raises:
            StoreError: the store at ``path`` is open, or the snapshot is missing or of another shard.
        """
        info = snapshot.read_snapshot_info(snapshot_dir)
        if info.shard_id != shard_id:
            raise StoreError(f"snapshot {snapshot_dir} holds shard {info.shard_id}, not shard {shard_id}")
        with _open_paths_lock:
            if os.path.realpath(path) in _open_paths:
                raise StoreError(f"close shard store {path} before restoring a snapshot into it")
        snapshot.install_snapshot_files(snapshot_dir, path)
        log.info("snapshot_restored", shard=shard_id, path=str(path), applied_seq=info.applied_seq)
        return cls(path, shard_id, **kwargs)


def _release_path(real: str) -> None:
    with _open_paths_lock:
        _open_paths.discard(real)


def _round_page(n: int) -> int:
    return max(_PAGE, (int(n) + _PAGE - 1) // _PAGE * _PAGE)
