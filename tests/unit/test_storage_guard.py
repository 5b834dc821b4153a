"""ResizeGuard: shared/exclusive hand-over, and the shared -> exclusive upgrade the outbox writer uses
to abort a failed write transaction with no read in flight (py-lmdb's write abort waits for every
in-flight read call; reads looping on other threads starved it: the outbox map-growth test hung)."""
from __future__ import annotations

import threading
import time

import pytest

from storage.guard import ResizeGuard

WAIT_S = 5.0  # generous bound for things that must happen; absences are checked with BLOCKED_S
BLOCKED_S = 0.2


def _upgrade_pending(guard: ResizeGuard) -> None:
    """Wait until some thread has called ``upgraded`` (it then waits for the other readers)."""
    deadline = time.monotonic() + WAIT_S
    while not guard._upgrading:  # noqa: SLF001 - the only way to see "waiting" without a race
        assert time.monotonic() < deadline, "no upgrade started"
        time.sleep(0.001)


def _start(target) -> threading.Thread:
    t = threading.Thread(target=target, daemon=True)
    t.start()
    return t


def test_upgrade_drains_reads_holds_new_ones_off_and_goes_before_a_waiting_resize() -> None:
    guard = ResizeGuard()
    order: list[str] = []
    reader_in, reader_go = threading.Event(), threading.Event()
    writer_shared, upgraded, writer_go = threading.Event(), threading.Event(), threading.Event()
    late_reader_in, resize_in = threading.Event(), threading.Event()

    def reader() -> None:
        with guard.shared():
            reader_in.set()
            reader_go.wait(WAIT_S)

    def writer() -> None:  # the outbox writer: a shared hold around the write, upgraded for the abort
        with guard.shared():
            writer_shared.set()
            reader_in.wait(WAIT_S)
            with guard.upgraded():
                order.append("upgraded")
                upgraded.set()
                writer_go.wait(WAIT_S)

    def late_reader() -> None:
        with guard.shared():
            order.append("late_reader")
            late_reader_in.set()

    def resize() -> None:  # e.g. Outbox.close from another thread
        with guard.exclusive():
            order.append("resize")
            resize_in.set()

    threads = [_start(reader), _start(writer)]
    assert reader_in.wait(WAIT_S) and writer_shared.wait(WAIT_S)
    _upgrade_pending(guard)
    assert not upgraded.wait(BLOCKED_S), "the upgrade must wait for the other reader"
    threads += [_start(late_reader), _start(resize)]
    assert not late_reader_in.wait(BLOCKED_S), "a pending upgrade must hold new reads off"
    assert not resize_in.is_set()

    reader_go.set()
    assert upgraded.wait(WAIT_S), "the upgrade must go once the other reader left"
    assert not late_reader_in.wait(BLOCKED_S) and not resize_in.is_set()

    writer_go.set()
    for t in threads:
        t.join(WAIT_S)
        assert not t.is_alive(), "deadlock"
    assert order == ["upgraded", "resize", "late_reader"]  # a waiting resize still goes before new reads


def test_upgrade_of_the_only_reader_is_immediate_and_returns_to_shared() -> None:
    guard = ResizeGuard()
    resized = threading.Event()

    def resize() -> None:
        with guard.exclusive():
            resized.set()

    with guard.shared():
        with guard.upgraded():
            pass
        t = _start(resize)
        assert not resized.wait(BLOCKED_S), "after the block the thread holds the guard shared again"
    assert resized.wait(WAIT_S)
    t.join(WAIT_S)
    assert not t.is_alive()


def test_second_concurrent_upgrade_raises_instead_of_deadlocking() -> None:
    guard = ResizeGuard()
    first_waiting, upgraded = threading.Event(), threading.Event()

    def first() -> None:
        with guard.shared():
            first_waiting.set()
            with guard.upgraded():
                upgraded.set()

    with guard.shared():
        t = _start(first)
        assert first_waiting.wait(WAIT_S)
        _upgrade_pending(guard)
        assert not upgraded.wait(BLOCKED_S)  # waits for this thread's hold
        with pytest.raises(RuntimeError, match="concurrent upgrades"):
            with guard.upgraded():
                pass
    assert upgraded.wait(WAIT_S)
    t.join(WAIT_S)
    assert not t.is_alive()
