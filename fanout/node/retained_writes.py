"""A node's retained messages written to its file (``storage.retained``), one fsynced transaction at a time.

Strategy: every route tick (:data:`actors.connection_node.ROUTE_PERIOD_S`, 50 ms) takes the changes since the
last write and writes them on the default executor, off the event loop. Drain cancels the route loop, which may be
in the middle of such a write: the cancelled caller must not take its changes with it. So a write is awaited with
``asyncio.wait`` (which never cancels what it waits for), its outcome is handled in a done-callback that runs
whatever happens to the caller (a failed write gives its changes back), and the next :meth:`RetainedWrites.persist`
waits for a write still running before it takes the next changes. Drain's own ``persist`` therefore returns only
once every change taken is on disk or given back and written again.
"""
from __future__ import annotations

import asyncio
import functools
from typing import Any

import structlog

log = structlog.get_logger(__name__)


class RetainedWrites:
    """The write path of one node's retained messages.

    Args:
        store: the broker's ``fanout.mqtt.retained.RetainedStore`` (tracking changes).
        file: the node's ``storage.retained.RetainedFile``.
        node_id: for the log.
    """

    __slots__ = ("_store", "_file", "_node_id", "_write")

    def __init__(self, store: Any, file: Any, node_id: str = "") -> None:
        self._store = store
        self._file = file
        self._node_id = node_id
        self._write: asyncio.Future | None = None

    async def persist(self) -> None:
        """Write the changes since the last call, after any write still running (its caller may be gone)."""
        if self._write is not None:
            await asyncio.wait([self._write])
        changes = self._store.take_changes()
        if not changes:
            return
        write = asyncio.get_running_loop().run_in_executor(None, self._file.write, changes)
        self._write = write
        write.add_done_callback(functools.partial(self._written, changes))
        await asyncio.wait([write])  # a cancelled caller leaves the write running; the next persist() waits for it

    def _written(self, changes: dict[str, Any], write: asyncio.Future) -> None:
        if self._write is write:
            self._write = None
        error = None if write.cancelled() else write.exception()
        if write.cancelled() or error is not None:  # kept in memory; written with the next change set
            self._store.requeue(changes)
            log.error("retained messages not persisted", node_id=self._node_id, topics=len(changes),
                      error="cancelled" if error is None else str(error))


__all__ = ["RetainedWrites"]
