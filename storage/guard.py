"""Shared/exclusive guard that keeps LMDB map resizes away from open read transactions.

Strategy: ``Environment.set_mapsize`` replaces the memory map and invalidates every transaction
and cursor of the environment, in every thread (py-lmdb's rule: no transaction may be active).
Readers hold the guard *shared* for the few microseconds of a read (or one chunk of a snapshot
read); a resize takes it *exclusive*, so it waits for running reads and holds new ones back.
Writers need no part in it: writes and resizes both run under the store's single write lock.
Waiting resizers are preferred over new readers so a stream of reads cannot starve growth.
A thread that holds the guard shared can turn its hold exclusive for a while (``upgraded``): the
outbox writes under a shared hold and must abort a failed write transaction with no read in flight
(py-lmdb's write ``abort`` waits for the environment's in-flight operations, and reader threads
looping over cursors starve it: 1.5 s for one abort with two readers, minutes under CPU load).
"""
from __future__ import annotations

import threading
from contextlib import contextmanager
from typing import Iterator


class ResizeGuard:
    """Many concurrent readers or one resizer."""

    def __init__(self) -> None:
        self._cond = threading.Condition(threading.Lock())
        self._readers = 0
        self._resizing = False
        self._waiting_resizers = 0
        self._upgrading = False

    def acquire_shared(self) -> None:
        """Enter a read (pair with ``release_shared``; ``shared()`` does both)."""
        with self._cond:
            while self._resizing or self._waiting_resizers or self._upgrading:
                self._cond.wait()
            self._readers += 1

    def release_shared(self) -> None:
        """Leave a read."""
        with self._cond:
            self._readers -= 1
            if self._readers <= 1:  # 1: the last holder may be an upgrade waiting for the others
                self._cond.notify_all()

    @contextmanager
    def shared(self) -> Iterator[None]:
        """Hold off resizes while the block runs (reads, copies)."""
        self.acquire_shared()
        try:
            yield
        finally:
            self.release_shared()

    @contextmanager
    def exclusive(self) -> Iterator[None]:
        """Run the block with no read in progress (map resize)."""
        with self._cond:
            self._waiting_resizers += 1
            try:
                while self._resizing or self._readers:
                    self._cond.wait()
            finally:
                self._waiting_resizers -= 1
            self._resizing = True
        try:
            yield
        finally:
            self._release_exclusive()

    def _release_exclusive(self) -> None:
        with self._cond:
            self._resizing = False
            self._cond.notify_all()

    @contextmanager
    def upgraded(self) -> Iterator[None]:
        """Run the block exclusive from inside this thread's shared hold, then hold it shared again.

        New reads wait from the call on, and so does a waiting ``exclusive()``: it waits for this
        thread's shared hold anyway, and letting it in first would deadlock an upgrade whose thread
        keeps something open that the resize waits for (a write transaction, which ``close`` waits for).

        Raises:
            RuntimeError: another thread is upgrading (two upgrades would wait for each other).
        """
        with self._cond:
            if self._upgrading:
                raise RuntimeError("ResizeGuard: concurrent upgrades would deadlock")
            self._upgrading = True
            try:
                while self._readers > 1:  # our own hold is the 1
                    self._cond.wait()
            finally:
                self._upgrading = False  # granted (``_resizing`` keeps everyone out now) or given up
                self._cond.notify_all()
            self._resizing = True
        try:
            yield
        finally:
            self._release_exclusive()
