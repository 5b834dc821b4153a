"""A coarse timing wheel for connect timeouts and keepalive deadlines (no per-connection timers).

Strategy: connections are appended to the bucket of their deadline second (``deadline_ms //
resolution_ms``); :meth:`DeadlineWheel.due` pops every bucket up to ``now`` and returns its entries.
The caller re-checks each one against its *current* deadline, which moves on every received byte, and
re-schedules the live ones; so a connection is looked at about once per keepalive period instead of once
per sweep, and receiving data costs one attribute store (``last_rx_ms``), not a timer reset. Each
object remembers its bucket in ``wheel_slot`` so a re-schedule leaves at most one live entry (stale
entries in older buckets are skipped by that check).
"""
from __future__ import annotations

from typing import Any


class DeadlineWheel:
    """Buckets of objects with a ``wheel_slot`` attribute, keyed by deadline // resolution.

    Args:
        resolution_ms: bucket width; deadlines fire up to this late.
    """

    __slots__ = ("_buckets", "_res", "_next")

    def __init__(self, resolution_ms: int = 1000) -> None:
        self._buckets: dict[int, list[Any]] = {}
        self._res = max(1, int(resolution_ms))
        self._next = -1  # lowest bucket index not yet popped (-1: none popped yet)

    def __len__(self) -> int:
        return sum(len(b) for b in self._buckets.values())

    def schedule(self, obj: Any, deadline_ms: int) -> None:
        """Schedule ``obj`` at ``deadline_ms`` (replaces its previous slot)."""
        slot = -(-deadline_ms // self._res)  # ceiling: never fire early
        if 0 <= self._next and slot < self._next:
            slot = self._next
        if obj.wheel_slot == slot:
            return
        obj.wheel_slot = slot
        bucket = self._buckets.get(slot)
        if bucket is None:
            self._buckets[slot] = [obj]
        else:
            bucket.append(obj)

    def cancel(self, obj: Any) -> None:
        """Forget ``obj`` (its entry becomes stale and is skipped)."""
        obj.wheel_slot = -1

    def due(self, now_ms: int) -> list[Any]:
        """Pop and return the objects whose bucket is due at ``now_ms`` (each once, stale ones skipped).

        Their ``wheel_slot`` is reset to -1; re-schedule the ones still alive.
        """
        limit = now_ms // self._res
        buckets = self._buckets
        out: list[Any] = []
        if not buckets:
            self._next = limit + 1
            return out
        start = self._next if self._next >= 0 else min(buckets)
        if limit - start > 4 * len(buckets):
            keys = sorted(k for k in buckets if k <= limit)  # long gap: visit only existing buckets
        else:
            keys = [k for k in range(start, limit + 1) if k in buckets]
        for k in keys:
            for obj in buckets.pop(k):
                if obj.wheel_slot == k:
                    obj.wheel_slot = -1
                    out.append(obj)
        self._next = limit + 1
        return out


__all__ = ["DeadlineWheel"]
