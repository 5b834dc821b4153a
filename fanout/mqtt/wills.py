"""MQTT 5 Will Delay Interval: wills waiting to be published after their connection ended.

Strategy: "The Server delays publishing the Client's Will Message until the Will Delay Interval has passed
or the Session ends, whichever happens first. If a new Network Connection to this Session is made before
the Will Delay Interval has passed, the Server MUST NOT send the Will Message" (3.1.3.2.2, MQTT-3.1.3-9).
:class:`DelayedWills` holds one pending will per client id with its due time; the lifecycle cancels it on
a reconnect, takes it when the session ends, and the periodic sweep takes the due ones. Few clients use
a delay, so a dict scanned once per sweep is enough.
"""
from __future__ import annotations

from typing import Any


class DelayedWills:
    """Pending wills by client id: (due time in ms, the will)."""

    __slots__ = ("_pending",)

    def __init__(self) -> None:
        self._pending: dict[str, tuple[int, Any]] = {}

    def __len__(self) -> int:
        return len(self._pending)

    def add(self, client_id: str, due_ms: int, will: Any) -> None:
        """Hold ``will`` of ``client_id`` until ``due_ms``."""
        self._pending[client_id] = (due_ms, will)

    def cancel(self, client_id: str) -> bool:
        """A new connection of ``client_id``: its pending will is not published (MQTT-3.1.3-9)."""
        return self._pending.pop(client_id, None) is not None

    def take(self, client_id: str) -> Any:
        """The pending will of ``client_id`` (its session ends now), or None."""
        entry = self._pending.pop(client_id, None)
        return None if entry is None else entry[1]

    def due(self, now_ms: int) -> list[tuple[str, Any]]:
        """Remove and return the (client id, will) pairs whose delay has passed."""
        if not self._pending:
            return []
        ready = [(cid, w) for cid, (due, w) in self._pending.items() if due <= now_ms]
        for cid, _ in ready:
            del self._pending[cid]
        return ready


__all__ = ["DelayedWills"]
