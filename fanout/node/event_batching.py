"""When a connection node ships its queued events to the dispatchers.

Strategy: a Ray call costs a few hundred µs of CPU on each side whatever it carries; shipping at every
2 ms tick sent ~30 events per call under load, i.e. ~10 µs per delivery on each side. So the bulk events
(PUBACKs and heartbeats) wait until :data:`EVENTS_BATCH` are queued or the oldest has waited
:data:`EVENTS_MAX_WAIT_S`; that wait bounds what an ack -> next send cycle can lose. Presence events
(connect, disconnect, subscribe, drops) are *urgent*: they ship once the oldest queued event has waited
:data:`PRESENCE_MAX_WAIT_S` (5 ms), since a delivery decided on stale presence is wasted and a vehicle's
CONNACK waits for its connect's call (``fanout.mqtt.connack_hold``). They used to ship at the next 2 ms
tick: in a connection storm that made ~30 events per call, and the Ray calls were half of the cluster's
CPU per connect (docs/profile.md); 5 ms doubles the events per call and took the storm from 360 to 251 µs
of server CPU per connect and from 3,800 to 4,793 connects/s (less CPU per connect, so shorter queues).
"""
from __future__ import annotations

from typing import Callable

EVENTS_BATCH = 1000
EVENTS_MAX_WAIT_S = 0.010
PRESENCE_MAX_WAIT_S = 0.005


class EventBatching:
    """The shipping decision for one node's event queues.

    Args:
        batch: ship once this many events wait.
        max_wait_s: ship once the oldest waiting event was first seen this long ago.
        presence_wait_s: the same when a presence event waits (at most ``max_wait_s``).
    """

    __slots__ = ("batch", "max_wait_s", "presence_wait_s", "_since")

    def __init__(self, batch: int = EVENTS_BATCH, max_wait_s: float = EVENTS_MAX_WAIT_S,
                 presence_wait_s: float = PRESENCE_MAX_WAIT_S) -> None:
        self.batch = batch
        self.max_wait_s = max_wait_s
        self.presence_wait_s = min(presence_wait_s, max_wait_s)
        self._since: float | None = None  # when the oldest unshipped event was first seen by wait()

    def wait(self, now_s: float, urgent: bool, pending: Callable[[], int]) -> float:
        """Seconds until the queued events are due (0.0: ship now).

        Args:
            now_s: current time (any monotonic clock, seconds).
            urgent: a presence event is queued.
            pending: counts the queued events (called only when the cheaper tests did not decide).
        """
        if self._since is None:
            self._since = now_s
        waited = now_s - self._since
        due = self.presence_wait_s if urgent else self.max_wait_s
        if waited >= due or pending() >= self.batch:
            return 0.0
        return due - waited

    def shipped(self, now_s: float | None, remaining: bool) -> None:
        """The due events were taken; ``remaining``: some stayed queued (their dispatcher was busy)."""
        self._since = now_s if remaining else None


__all__ = ["EventBatching", "EVENTS_BATCH", "EVENTS_MAX_WAIT_S", "PRESENCE_MAX_WAIT_S"]
