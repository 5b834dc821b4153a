"""One thread that runs an actor's store writes, handed over from its event loop at the least cost.

Why not ``loop.run_in_executor(ThreadPoolExecutor(1), ...)``: that hop (a ``concurrent.futures`` future, a work
item, an asyncio future chained to it by callbacks on both threads) costs 50-65 µs of CPU per call under uvloop,
against 20-25 µs for a ``queue.SimpleQueue`` (in C) and one ``call_soon_threadsafe`` (measured with an async no-op
in a loop; ``python -m benchmarks.call_bench`` prints both as ``thread_hop``). A store write is a few hundred
µs, and a dispatcher commits hundreds of times a second, so the hop is worth its own small class.

Jobs run one at a time in submission order, which is what a store's single writer needs.
"""
from __future__ import annotations

import asyncio
import queue
import threading
from typing import Any, Callable

_STOP = object()


class WriterThread:
    """A daemon thread running ``fn(*args)`` jobs in order for one event loop.

    Args:
        name: the thread's name (``shard-3-writer``): it shows in py-spy and ``/proc``.
    """

    __slots__ = ("_jobs", "_thread", "pending")

    def __init__(self, name: str) -> None:
        self._jobs: queue.SimpleQueue = queue.SimpleQueue()
        # Jobs submitted whose answer has not reached the loop yet. A job counts until it has run even when
        # its caller was cancelled meanwhile, so "pending == 0" (read on the loop thread) means the thread is
        # idle: StoreReplica then applies a small batch on the loop itself without a second writer.
        self.pending = 0
        self._thread = threading.Thread(target=self._work, name=name, daemon=True)
        self._thread.start()

    async def run(self, fn: Callable[..., Any], *args: Any) -> Any:
        """Run ``fn(*args)`` on the thread after the jobs before it; its result or its exception."""
        loop = asyncio.get_running_loop()
        done = loop.create_future()
        self.pending += 1
        self._jobs.put((loop, done, fn, args))
        return await done

    def shutdown(self) -> None:
        """Stop after the jobs already submitted (does not wait for them)."""
        self._jobs.put(_STOP)

    def _work(self) -> None:
        get = self._jobs.get
        while True:
            job = get()
            if job is _STOP:
                return
            loop, done, fn, args = job
            try:
                result = fn(*args)
            except BaseException as exc:  # handed to the awaiting coroutine, which raises it
                self._answer(loop, done, False, exc)
            else:
                self._answer(loop, done, True, result)

    def _answer(self, loop: asyncio.AbstractEventLoop, done: asyncio.Future, ok: bool, value: Any) -> None:
        try:
            loop.call_soon_threadsafe(self._settle, done, ok, value)
        except RuntimeError:  # the loop is closed (actor exiting): nobody awaits the answer any more
            pass

    def _settle(self, done: asyncio.Future, ok: bool, value: Any) -> None:
        """On the loop thread: the job has run."""
        self.pending -= 1
        if done.cancelled():  # the awaiting task was cancelled while the job waited or ran
            return
        if ok:
            done.set_result(value)
        else:
            done.set_exception(value)
