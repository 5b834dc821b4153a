"""benchmarks.loadgen.run_async: the benchmarks' event-loop runner ends even when a task left behind ignores
its cancel (asyncio.run would wait for it forever, and under uvloop no signal handler could interrupt that)."""
from __future__ import annotations

import asyncio
import time

import pytest

from benchmarks.loadgen import run_async


async def _stubborn(started: asyncio.Event) -> None:
    started.set()
    while True:
        try:
            await asyncio.sleep(3600)
        except asyncio.CancelledError:
            continue  # the kind of task that hung a test run: it swallows every cancel


def test_a_task_that_ignores_its_cancel_is_reported_and_abandoned(capsys):
    async def main() -> str:
        started = asyncio.Event()
        asyncio.get_running_loop().create_task(_stubborn(started), name="stubborn")
        await started.wait()
        return "result"

    t0 = time.monotonic()
    assert run_async(main(), cancel_wait_s=0.2) == "result"
    assert time.monotonic() - t0 < 5.0
    err = capsys.readouterr().err
    assert "task stubborn did not stop within 0 s of its cancel; abandoned" in err and "_stubborn" in err


def test_the_exception_of_the_coroutine_is_raised_after_a_bounded_clean_up(capsys):
    async def main() -> None:
        started = asyncio.Event()
        asyncio.get_running_loop().create_task(_stubborn(started), name="stubborn")
        await started.wait()
        raise RuntimeError("fleet failed")

    with pytest.raises(RuntimeError, match="fleet failed"):
        run_async(main(), cancel_wait_s=0.2)
    assert "stubborn" in capsys.readouterr().err


def test_tasks_that_honour_the_cancel_end_quietly(capsys):
    cancelled = []

    async def polite() -> None:
        try:
            await asyncio.sleep(3600)
        except asyncio.CancelledError:
            cancelled.append(True)
            raise

    async def main() -> int:
        asyncio.get_running_loop().create_task(polite())
        await asyncio.sleep(0)
        return 7

    assert run_async(main()) == 7
    assert cancelled == [True] and capsys.readouterr().err == ""
