"""Consistent reads of a whole shard: a transaction-bound view, and snapshot files for replicas.

Strategy:
- ``SnapshotView`` is bound to ONE LMDB read transaction, so every table it yields and its
  ``applied_seq`` watermark describe the same instant (the export's consistency rule). It streams:
  ``chunks(db)`` yields lists of decoded rows, each chunk read under the store's resize guard and
  the guard released between chunks. A long-open view pins old pages (LMDB cannot reuse pages a
  reader may still see), and if the map has to grow while it is open its transaction dies: the next
  chunk raises ``SnapshotInvalidatedError`` and the caller starts again. For long exports prefer
  ``ShardStore.copy_to`` and export from the copy, which leaves the live store alone.
- A snapshot on disk is an LMDB environment written by ``env.copy(compact=True, txn=...)`` from one
  read transaction; its ``sys`` table carries the ``applied_seq`` and ``epoch`` it was taken at, so
  no side file can disagree with it. ``install_snapshot_files`` swaps it into a shard directory
  atomically (copy to a temp name, fsync, rename over ``data.mdb``).
"""
from __future__ import annotations

import os
import shutil
from dataclasses import dataclass
from itertools import islice
from pathlib import Path
from typing import Any, Iterator

import lmdb

from storage import tables
from storage.errors import SnapshotInvalidatedError, StoreError
from storage.guard import ResizeGuard

DATA_FILE = "data.mdb"
LOCK_FILE = "lock.mdb"


@dataclass(frozen=True, slots=True)
class SnapshotInfo:
    """A snapshot directory and the state it holds."""

    path: Path
    shard_id: int
    applied_seq: int
    epoch: int
    size_bytes: int


class SnapshotView:
    """Read-only access to one shard as of one read transaction (use via ``ShardStore.snapshot_view``)."""

    def __init__(self, txn: lmdb.Transaction, dbs: dict[str, Any], guard: ResizeGuard, shard_id: int) -> None:
        self._txn = txn
        self._dbs = dbs
        self._guard = guard
        self._invalid = False
        self.shard_id = shard_id
        self.applied_seq: int = _sys_int(txn, dbs[tables.SYS], tables.SYS_APPLIED_SEQ)
        """Seq of the last batch visible in this view: the export's watermark."""
        self.epoch: int = _sys_int(txn, dbs[tables.SYS], tables.SYS_EPOCH)

    def invalidate(self) -> None:
        """Called by the store (under the exclusive guard) when the map is resized."""
        self._invalid = True

    def _check(self) -> None:
        if self._invalid:
            raise SnapshotInvalidatedError(
                f"snapshot of shard {self.shard_id} at seq {self.applied_seq} was invalidated by a map "
                "resize; open a new view"
            )

    def count(self, db: str) -> int:
        """Rows in table ``db`` as of this view.

        Raises:
            ValueError: unknown table. SnapshotInvalidatedError: the view died.
        """
        handle = self._dbs[tables.check_db(db)]
        with self._guard.shared():
            self._check()
            return int(self._txn.stat(handle)["entries"])

    def chunks(self, db: str, chunk_rows: int = 10_000, start: bytes | None = None) -> Iterator[list[dict[str, Any]]]:
        """Stream table ``db`` in key order as lists of decoded rows (fields ``tables.ROW_FIELDS[db]``).

        Args:
            db: table name.
            chunk_rows: rows per yielded list (keep small for ``data``: rows hold whole blobs).
            start: first key to include (default: the beginning).

        Raises:
            ValueError: unknown table or chunk_rows < 1. SnapshotInvalidatedError: the view died.
        """
        handle = self._dbs[tables.check_db(db)]
        if chunk_rows < 1:
            raise ValueError(f"chunk_rows must be >= 1, got {chunk_rows}")
        next_key = start
        while True:
            rows: list[dict[str, Any]] = []
            with self._guard.shared():
                self._check()
                cur = self._txn.cursor(handle)
                positioned = cur.set_range(next_key) if next_key is not None else cur.first()
                last = None
                if positioned:
                    decode = tables.decode_row
                    for key, value in cur:
                        rows.append(decode(db, key, value))
                        last = key
                        if len(rows) >= chunk_rows:
                            break
                cur.close()
            if rows:
                yield rows
            if last is None or len(rows) < chunk_rows:
                return
            next_key = last + b"\x00"

    def raw_chunks(self, db: str, chunk_rows: int = 100_000) -> Iterator[tuple[list[bytes], list[bytes]]]:
        """Stream table ``db`` in key order as ``(keys, values)`` lists of undecoded bytes.

        For bulk export: two C-level cursor passes per chunk (keys, then values) and no per-row
        decoding, so the caller can decode whole columns at once (pyarrow). Same guard and
        invalidation rules as ``chunks``.

        Raises:
            ValueError: unknown table or chunk_rows < 1. SnapshotInvalidatedError: the view died.
        """
        handle = self._dbs[tables.check_db(db)]
        if chunk_rows < 1:
            raise ValueError(f"chunk_rows must be >= 1, got {chunk_rows}")
        next_key: bytes | None = None
        while True:
            with self._guard.shared():
                self._check()
                cur = self._txn.cursor(handle)
                first = cur.set_range(next_key) if next_key is not None else cur.first()
                if not first:
                    cur.close()
                    return
                start = cur.key()
                ks = list(islice(cur.iternext(keys=True, values=False), chunk_rows))
                cur.set_key(start)
                vs = list(islice(cur.iternext(keys=False, values=True), len(ks)))
                cur.close()
            yield ks, vs
            if len(ks) < chunk_rows:
                return
            next_key = ks[-1] + b"\x00"

    def rows(self, db: str, chunk_rows: int = 10_000) -> Iterator[dict[str, Any]]:
        """Rows of table ``db`` one by one (``chunks`` flattened)."""
        for chunk in self.chunks(db, chunk_rows):
            yield from chunk


def _sys_int(txn: lmdb.Transaction, sys_db: Any, key: bytes) -> int:
    raw = txn.get(key, db=sys_db)
    return 0 if raw is None else int(tables.unpack(raw))


def read_snapshot_info(snapshot_dir: str | os.PathLike[str]) -> SnapshotInfo:
    """Read the shard id, applied seq and epoch recorded inside a snapshot directory.

    Raises:
        StoreError: no ``data.mdb`` there, or it is not a shard store.
    """
    path = Path(snapshot_dir)
    data = path / DATA_FILE
    if not data.is_file():
        raise StoreError(f"no snapshot at {path}: {DATA_FILE} missing")
    try:
        env = lmdb.open(str(path), readonly=True, lock=False, max_dbs=len(tables.ALL_DBS) + 4)
    except lmdb.Error as exc:
        raise StoreError(f"cannot open snapshot {path}: {exc}") from exc
    try:
        try:
            sys_db = env.open_db(tables.SYS.encode(), create=False)
        except lmdb.NotFoundError as exc:
            raise StoreError(f"snapshot {path} is not a shard store (no sys table)") from exc
        with env.begin() as txn:
            shard_raw = txn.get(tables.SYS_SHARD_ID, db=sys_db)
            return SnapshotInfo(
                path=path,
                shard_id=-1 if shard_raw is None else int(tables.unpack(shard_raw)),
                applied_seq=_sys_int(txn, sys_db, tables.SYS_APPLIED_SEQ),
                epoch=_sys_int(txn, sys_db, tables.SYS_EPOCH),
                size_bytes=data.stat().st_size,
            )
    finally:
        env.close()


def install_snapshot_files(snapshot_dir: str | os.PathLike[str], shard_dir: str | os.PathLike[str]) -> None:
    """Replace the environment in ``shard_dir`` by the snapshot's, atomically.

    The store at ``shard_dir`` must be closed in every process. The stale lock file is removed (LMDB
    recreates it).

    Raises:
        StoreError: the snapshot is missing. OSError: copying failed (the old store is untouched).
    """
    src = Path(snapshot_dir) / DATA_FILE
    if not src.is_file():
        raise StoreError(f"no snapshot at {snapshot_dir}: {DATA_FILE} missing")
    dest_dir = Path(shard_dir)
    dest_dir.mkdir(parents=True, exist_ok=True)
    tmp = dest_dir / (DATA_FILE + ".restore")
    shutil.copyfile(src, tmp)
    with open(tmp, "rb+") as fh:
        os.fsync(fh.fileno())
    os.replace(tmp, dest_dir / DATA_FILE)
    (dest_dir / LOCK_FILE).unlink(missing_ok=True)
    dir_fd = os.open(dest_dir, os.O_RDONLY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)
