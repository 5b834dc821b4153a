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
Heartbeats alone (no PUBACK queued) wait :data:`HEARTBEAT_MAX_WAIT_S` (50 ms): a heartbeat only matters
for a vehicle that has rows and nothing in flight, which a connect, a new batch or a PUBACK already
served; at 5,000 heartbeats/s the 10 ms wait made 25-event calls and the Ray calls were ~55 of the
~120 µs of cluster CPU per heartbeat (docs/profile.md).
"""
from __future__ import annotations

from typing import Callable

EVENTS_BATCH = 1000
EVENTS_MAX_WAIT_S = 0.010
PRESENCE_MAX_WAIT_S = 0.005
HEARTBEAT_MAX_WAIT_S = 0.050


class EventBatching:
    """The shipping decision for one node's event queues.

    Args:
        batch: ship once this many events wait.
        max_wait_s: ship once the oldest waiting event was first seen this long ago.
        presence_wait_s: the same when a presence event waits (at most ``max_wait_s``).
        heartbeat_wait_s: the same when only heartbeats wait (at least ``max_wait_s``).
    """

    __slots__ = ("batch", "max_wait_s", "presence_wait_s", "heartbeat_wait_s", "_since")

    def __init__(self, batch: int = EVENTS_BATCH, max_wait_s: float = EVENTS_MAX_WAIT_S,
                 presence_wait_s: float = PRESENCE_MAX_WAIT_S, heartbeat_wait_s: float = HEARTBEAT_MAX_WAIT_S) -> None:
        self.batch = batch
        self.max_wait_s = max_wait_s
        self.presence_wait_s = min(presence_wait_s, max_wait_s)
        self.heartbeat_wait_s = max(heartbeat_wait_s, max_wait_s)
        self._since: float | None = None  # when the oldest unshipped event was first seen by wait()

    def wait(self, now_s: float, urgent: bool, pending: Callable[[], int], heartbeats_only: bool = False) -> float:
        """Seconds until the queued events are due (0.0: ship now).

        Args:
            now_s: current time (any monotonic clock, seconds).
            urgent: a presence event is queued.
            pending: counts the queued events (called only when the cheaper tests did not decide).
            heartbeats_only: no PUBACK is queued either, only heartbeats.
        """
        if self._since is None:
            self._since = now_s
        waited = now_s - self._since
        due = self.presence_wait_s if urgent else self.heartbeat_wait_s if heartbeats_only else self.max_wait_s
        if waited >= due or pending() >= self.batch:
            return 0.0
        return due - waited

    def shipped(self, now_s: float | None, remaining: bool) -> None:
        """The due events were taken; ``remaining``: some stayed queued (their dispatcher was busy)."""
        self._since = now_s if remaining else None


__all__ = ["EventBatching", "EVENTS_BATCH", "EVENTS_MAX_WAIT_S", "HEARTBEAT_MAX_WAIT_S", "PRESENCE_MAX_WAIT_S"]
