"""The data dir lock: a running cluster and offline maintenance never write the same shards at once.

Strategy: an exclusive ``fcntl.flock`` on ``<data_dir>/fanout.lock``. ``fanout up`` holds it for the life of
its process; offline GC (``run_gc_cycle`` on a data directory) holds it while it runs. Whoever comes second
is refused at once (no waiting) with :class:`DataDirBusy`, whose message names the holder: the file holds
the holder's description and pid, written once the lock is taken. The kernel drops a ``flock`` when its
process dies however it dies, so a killed holder leaves no stale lock; the file itself stays (its text
is only read to explain a refusal). The descriptor is not inherited by child processes (Python opens
files non-inheritable), so Ray processes started by ``fanout up`` never keep the lock alive after it.
"""
from __future__ import annotations

import fcntl
import os
from pathlib import Path

from storage.errors import StoreError

LOCK_FILE = "fanout.lock"


class DataDirBusy(StoreError):
    """Another process holds the data dir lock.

    Attributes:
        data_dir: the locked directory.
        holder: the holder's own description (``"fanout up (pid 123)"``), or None when it wrote none yet.
    """

    def __init__(self, data_dir: str | os.PathLike[str], holder: str | None) -> None:
        super().__init__(f"the data dir {data_dir} is in use by {holder or 'another process'}")
        self.data_dir = str(data_dir)
        self.holder = holder


class DataDirLock:
    """The exclusive lock of one data directory (a context manager; ``acquire`` never blocks).

    Args:
        data_dir: an existing directory (the lock file is created in it).
        holder: what takes the lock, for the message another process gets (``"fanout up"``).
    """

    def __init__(self, data_dir: str | os.PathLike[str], holder: str) -> None:
        self.data_dir = Path(data_dir)
        self.path = self.data_dir / LOCK_FILE
        self.holder = holder
        self._fd: int | None = None

    @property
    def held(self) -> bool:
        return self._fd is not None

    def acquire(self) -> DataDirLock:
        """Take the lock or raise.

        Raises:
            DataDirBusy: another process holds it.
            FileNotFoundError: the directory does not exist.
        """
        if self._fd is not None:
            return self
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 4096, 0).decode(errors="replace").strip() or None
            os.close(fd)
            raise DataDirBusy(self.data_dir, holder) from None
        except BaseException:
            os.close(fd)
            raise
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{self.holder} (pid {os.getpid()})\n".encode(), 0)
        self._fd = fd
        return self

    def release(self) -> None:
        """Drop the lock (closing the descriptor releases the ``flock``); a no-op when not held."""
        fd, self._fd = self._fd, None
        if fd is None:
            return
        try:
            os.ftruncate(fd, 0)  # while still held: nobody reads a departed holder's name
        finally:
            os.close(fd)

    def __enter__(self) -> DataDirLock:
        return self.acquire()

    def __exit__(self, *exc: object) -> None:
        self.release()


__all__ = ["DataDirBusy", "DataDirLock", "LOCK_FILE"]
