"""Shared/exclusive guard that keeps LMDB map resizes away from open read transactions.

Strategy: ``Environment.set_mapsize`` replaces the memory map and invalidates every transaction
and cursor of the environment, in every thread (py-lmdb's rule: no transaction may be active).
Readers hold the guard *shared* for the few microseconds of a read (or one chunk of a snapshot
read); a resize takes it *exclusive*, so it waits for running reads and holds new ones back.
Writers need no part in it: writes and resizes both run under the store's single write lock.
Waiting resizers are preferred over new readers so a stream of reads cannot starve growth.
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

    def acquire_shared(self) -> None:
        """Enter a read (pair with ``release_shared``; ``shared()`` does both)."""
        with self._cond:
            while self._resizing or self._waiting_resizers:
                self._cond.wait()
            self._readers += 1

    def release_shared(self) -> None:
        """Leave a read."""
        with self._cond:
            self._readers -= 1
            if not self._readers:
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
            with self._cond:
                self._resizing = False
                self._cond.notify_all()
