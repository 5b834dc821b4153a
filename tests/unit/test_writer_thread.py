"""actors.writer_thread.WriterThread: jobs in order on one thread, results and exceptions back to the loop."""
from __future__ import annotations

import asyncio
import threading
import time

import pytest

from actors.writer_thread import WriterThread


def test_jobs_run_in_submission_order_on_the_named_thread():
    async def main():
        w = WriterThread("shard-7-writer")
        seen: list[tuple[int, str]] = []

        def job(i: int) -> int:
            time.sleep(0.001 * (5 - i % 5))  # later jobs are quicker: order must come from the queue
            seen.append((i, threading.current_thread().name))
            return i * i

        try:
            results = await asyncio.gather(*(w.run(job, i) for i in range(20)))
            assert w.pending == 0
        finally:
            w.shutdown()
        return results, seen

    results, seen = asyncio.run(main())
    assert results == [i * i for i in range(20)]
    assert [i for i, _ in seen] == list(range(20))
    assert {name for _, name in seen} == {"shard-7-writer"}


def test_an_exception_reaches_the_caller_and_the_thread_goes_on():
    async def main():
        w = WriterThread("w")
        try:
            with pytest.raises(ValueError, match="bad batch"):
                await w.run(lambda: (_ for _ in ()).throw(ValueError("bad batch")))
            assert await w.run(lambda: "next") == "next"
        finally:
            w.shutdown()

    asyncio.run(main())


def test_pending_counts_a_job_until_it_has_run_even_when_its_caller_was_cancelled():
    """StoreReplica reads pending == 0 as "the writer thread is idle" before applying on the loop itself: a
    cancelled caller must not make a job that is still running look finished."""
    async def main():
        w = WriterThread("w")
        gate = threading.Event()
        try:
            slow = asyncio.ensure_future(w.run(gate.wait, 5))
            await asyncio.sleep(0.01)
            assert w.pending == 1
            slow.cancel()  # the job still runs; its answer must not raise InvalidStateError in the loop
            await asyncio.sleep(0.01)
            assert slow.cancelled() and w.pending == 1
            gate.set()
            assert await w.run(lambda: 3) == 3  # after the cancelled job, in order
            assert w.pending == 0
        finally:
            w.shutdown()

    errors: list[dict] = []
    loop = asyncio.new_event_loop()
    loop.set_exception_handler(lambda _loop, ctx: errors.append(ctx))
    try:
        loop.run_until_complete(main())
    finally:
        loop.close()
    assert errors == []


def test_shutdown_lets_the_thread_end():
    async def main():
        w = WriterThread("w")
        await w.run(lambda: None)
        w.shutdown()
        return w

    w = asyncio.run(main())
    w._thread.join(timeout=5)
    assert not w._thread.is_alive()
