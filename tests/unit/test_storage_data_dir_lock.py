"""storage.data_dir_lock: one process at a time holds a data dir; a dead holder holds nothing."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap

import pytest

from storage.data_dir_lock import LOCK_FILE, DataDirBusy, DataDirLock


def test_a_second_holder_is_refused_with_the_first_ones_name(tmp_path):
    with DataDirLock(tmp_path, "fanout up") as first:
        assert first.held
        with pytest.raises(DataDirBusy) as refused:
            DataDirLock(tmp_path, "offline gc").acquire()
        assert refused.value.holder == f"fanout up (pid {os.getpid()})"
        assert str(refused.value) == f"the data dir {tmp_path} is in use by fanout up (pid {os.getpid()})"
    assert not first.held and (tmp_path / LOCK_FILE).read_text() == ""
    with DataDirLock(tmp_path, "offline gc"):  # free again
        pass


def test_acquire_is_idempotent_and_release_twice_is_harmless(tmp_path):
    lock = DataDirLock(tmp_path, "x")
    assert lock.acquire() is lock.acquire()
    lock.release()
    lock.release()
    assert not lock.held


def test_a_missing_directory_is_not_created(tmp_path):
    with pytest.raises(FileNotFoundError):
        DataDirLock(tmp_path / "nothing", "x").acquire()
    assert not (tmp_path / "nothing").exists()


def _holder(tmp_path, then: str) -> subprocess.Popen:
    """A process that takes the lock, prints its child's pid (or 0), then ``then`` (Python)."""
    code = textwrap.dedent(f"""
        import os, subprocess, sys, time
        from storage.data_dir_lock import DataDirLock
        DataDirLock({str(tmp_path)!r}, "holder").acquire()
        {then}
    """)
    return subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)


def test_a_killed_holder_leaves_no_lock(tmp_path):
    proc = _holder(tmp_path, "print(0, flush=True); time.sleep(60)")
    try:
        assert proc.stdout.readline().strip() == "0"
        with pytest.raises(DataDirBusy, match=f"holder \\(pid {proc.pid}\\)"):
            DataDirLock(tmp_path, "x").acquire()
        proc.send_signal(signal.SIGKILL)
        proc.wait(10)
        with DataDirLock(tmp_path, "x"):
            pass
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)


def test_children_of_the_holder_do_not_keep_the_lock(tmp_path):
    """As Ray's processes outliving ``fanout up`` for a moment: the lock goes with the holder itself."""
    proc = _holder(tmp_path, "child = subprocess.Popen(['sleep', '60']); print(child.pid, flush=True); os._exit(0)")
    child = int(proc.stdout.readline())
    try:
        proc.wait(10)
        with DataDirLock(tmp_path, "x"):
            pass
    finally:
        os.kill(child, signal.SIGKILL)
