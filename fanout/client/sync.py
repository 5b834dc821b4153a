"""Blocking wrapper over ``FanoutClient`` for code without an event loop.

Strategy: one private event loop in a daemon thread runs the async client; every method submits a
coroutine with ``asyncio.run_coroutine_threadsafe`` and waits for it. The guarantees are the async
client's: ``submit`` returns once the submission is in the ring (HOT) or fsynced in the outbox
(COLD); the thread hop adds tens of microseconds.
"""
from __future__ import annotations

import asyncio
import threading
from typing import Any, Coroutine, Iterable, TypeVar

from fanout.client.client import FanoutClient
from fanout.client.handle import ClientStatus, SubmitHandle
from fanout.client.outbox import DeadLetter

T = TypeVar("T")


class SyncSubmitHandle:
    """Blocking view of a :class:`SubmitHandle`."""

    __slots__ = ("_handle", "_owner")

    def __init__(self, handle: SubmitHandle, owner: "SyncFanoutClient") -> None:
        self._handle = handle
        self._owner = owner

    @property
    def seq(self) -> int:
        return self._handle.seq

    @property
    def request_id(self) -> str:
        return self._handle.request_id

    @property
    def mode(self) -> str:
        return self._handle.mode

    def acked(self, timeout: float | None = None) -> None:
        """Block until acknowledged.

        Raises:
            FanoutRejected, FanoutDeadLettered, FanoutClosed: as ``SubmitHandle.acked``.
            TimeoutError: ``timeout`` elapsed.
        """
        self._owner._call(self._handle.acked(timeout))

    def done(self) -> bool:
        return self._handle.done()

    def progress(self) -> tuple[int, int]:
        return self._handle.progress()


class SyncFanoutClient:
    """``with SyncFanoutClient(host=..., outbox_dir=...) as c: c.submit(vins, payload).acked()``.

    Args:
        **kwargs: passed to :class:`FanoutClient`.
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self._args, self._kwargs = args, kwargs
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="fanout-client-sync", daemon=True)
        self._client: FanoutClient | None = None

    def _call(self, coro: Coroutine[Any, Any, T]) -> T:
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result()

    def start(self) -> None:
        """Start the loop thread and the client (see ``FanoutClient.start``)."""
        if self._client is not None:
            return
        self._thread.start()

        async def make() -> FanoutClient:
            client = FanoutClient(*self._args, **self._kwargs)
            await client.start()
            return client

        self._client = self._call(make())

    def __enter__(self) -> "SyncFanoutClient":
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @property
    def client(self) -> FanoutClient:
        if self._client is None:
            raise RuntimeError("SyncFanoutClient is not started")
        return self._client

    def submit(self, vins: Iterable[str], payload: bytes | str, *, request_id: str | None = None,
               data_id: str | None = None) -> SyncSubmitHandle:
        """Blocking ``FanoutClient.submit``; same arguments, returns a :class:`SyncSubmitHandle`."""
        return SyncSubmitHandle(self._call(self.client.submit(vins, payload, request_id=request_id, data_id=data_id)), self)

    def status(self, request_id: str | None = None, *, timeout_s: float = 30.0) -> Any:
        """``FanoutClient.status``: this client's :class:`ClientStatus` (computed on the loop thread), or with a
        request id the cluster's status of that request (dict, None if unknown)."""
        if request_id is not None:
            return self._call(self.client.status(request_id, timeout_s=timeout_s))  # type: ignore[arg-type]

        async def get() -> ClientStatus:
            return self.client.status()
        return self._call(get())

    def cancel(self, request_id: str, *, timeout_s: float = 30.0) -> dict | None:
        """Blocking ``FanoutClient.cancel``."""
        return self._call(self.client.cancel(request_id, timeout_s=timeout_s))

    def drain(self, timeout: float | None = None) -> bool:
        return self._call(self.client.drain(timeout))

    def dead_letters(self, limit: int | None = None) -> list[DeadLetter]:
        return self._call(self.client.dead_letters(limit))

    def replay_dead_letters(self, seqs: Iterable[int] | None = None) -> int:
        return self._call(self.client.replay_dead_letters(seqs))

    def close(self) -> None:
        """Close the client and stop the loop thread (idempotent)."""
        if self._client is not None:
            self._call(self._client.close())
            self._client = None
        if self._thread.is_alive():
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(timeout=5)
        if not self._loop.is_closed() and not self._loop.is_running():
            self._loop.close()
