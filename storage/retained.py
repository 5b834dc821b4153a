"""Retained MQTT messages on disk: one small LMDB file per connection node, read back as a union.

Strategy:
- Every connection node holds every retained message (they are mirrored between nodes), so each node
  writes its own file ``<data_dir>/retained/<node_id>.lmdb`` and nobody shares a writer. At start a
  node loads the union of all files in that folder, newest write per topic winning; a cleared topic is
  kept as a tombstone so that an older file cannot bring it back.
- Writes are batched by the node (the changes of ~50 ms in one transaction, fsynced), so a retained
  publish costs no disk wait on the MQTT path; a crash loses at most that last batch, a clean stop none.
- Values are msgpack ``[ts_ms, qos, payload]`` (payload None for a tombstone).
"""
from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Mapping

import lmdb
import msgpack
import structlog

from storage.errors import StoreError, StoreFullError

log = structlog.get_logger(__name__)

SUBDIR = "retained"
MAP_SIZE_BYTES = 1 << 30  # sparse on Linux: the file grows only with what is written


def retained_dir(data_dir: str | os.PathLike[str]) -> Path:
    """The folder of the nodes' retained files."""
    return Path(data_dir) / SUBDIR


class RetainedFile:
    """The retained messages written by one node.

    Args:
        path: the LMDB file (``<data_dir>/retained/<node_id>.lmdb``); its folder is created.
    """

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._env = lmdb.open(str(self.path), subdir=False, map_size=MAP_SIZE_BYTES, max_dbs=1, lock=True)

    def write(self, changes: Mapping[str, tuple[bytes, int] | None], now_ms: int | None = None) -> int:
        """Store set (``(payload, qos)``) and cleared (None) topics in one durable transaction.

        Returns:
            The number of topics written.

        Raises:
            StoreFullError: the map or the disk is full; StoreError: any other LMDB failure.
        """
        if not changes:
            return 0
        ts = int(time.time() * 1000) if now_ms is None else now_ms
        try:
            with self._env.begin(write=True) as txn:
                for topic, value in changes.items():
                    payload, qos = (None, 0) if value is None else value
                    txn.put(topic.encode(), msgpack.packb([ts, qos, payload]))
        except lmdb.MapFullError as exc:
            raise StoreFullError(f"retained store {self.path} is full ({MAP_SIZE_BYTES} bytes)") from exc
        except lmdb.Error as exc:
            if "No space left" in str(exc):
                raise StoreFullError(f"disk full writing {self.path}") from exc
            raise StoreError(f"retained store {self.path}: {exc}") from exc
        return len(changes)

    def close(self) -> None:
        self._env.close()


def load_retained(data_dir: str | os.PathLike[str]) -> dict[str, tuple[bytes, int]]:
    """The retained messages of the union of every node's file (newest per topic; tombstones drop it)."""
    best: dict[str, tuple[int, int, bytes | None]] = {}
    folder = retained_dir(data_dir)
    for path in sorted(folder.glob("*.lmdb")) if folder.is_dir() else ():
        try:
            env = lmdb.open(str(path), subdir=False, readonly=True, lock=False, max_dbs=1)
        except lmdb.Error as exc:
            log.error("retained file unreadable, skipped", path=str(path), error=str(exc))
            continue
        try:
            with env.begin() as txn:
                for key, raw in txn.cursor():
                    ts, qos, payload = msgpack.unpackb(raw)
                    topic = bytes(key).decode()
                    have = best.get(topic)
                    if have is None or ts >= have[0]:
                        best[topic] = (ts, qos, payload)
        finally:
            env.close()
    return {t: (p, q) for t, (_ts, q, p) in best.items() if p}


__all__ = ["RetainedFile", "load_retained", "retained_dir"]
