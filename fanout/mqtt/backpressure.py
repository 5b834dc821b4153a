"""Read back-pressure: stop reading from publishers before the node's queued-bytes budget is reached.

Strategy: the node-wide budget (``mqtt.max_queued_bytes``, :class:`~fanout.mqtt.session.QueueBudget`) drops
messages when it is full. Dropping is the last resort; before it, the broker stops taking new messages in:

- Rule 1 (watch the online queues only). What is watched is ``QueueBudget.online_bytes``, the queues of
  connected sessions: they drain as their clients acknowledge. Offline persistent sessions hold their own part
  of the budget (``offline_max_bytes``) and drop by the offline policy past it, so a session nobody comes back
  for never keeps a publisher paused.
- Rule 2 (high and low water). When the online queues hold more than ``high_bytes`` (a fraction of what the
  offline part leaves of the budget), each connection that delivered a PUBLISH in the bytes just handled is
  paused; reading resumes for all of them once the online queues are back at or below ``low_bytes``. Checked
  per received chunk (one comparison) and, while engaged, per flush (so the PUBACKs that drained the queues
  release the publishers in the same loop iteration).
- Rule 3 (never pause a consumer). A connection whose session has queued messages is not paused: its
  PUBACKs are what frees the budget. A paused connection whose session gets messages queued is resumed.
  Subscribers that only acknowledge are never paused at all.
- Rule 4 (the broker decides, the adapter applies). This module only records decisions (``changes``: the
  connections to pause and to resume); the adapter takes them (:meth:`ReadPressure.take`) after each
  ``data_received`` that made one and after each flush, and calls ``pause_reading``/``resume_reading`` on the
  transports. The broker stays sans-I/O. At once, not at the next flush: libuv (uvloop) reads one socket up to
  32 times per loop iteration, megabytes that would all be routed past the high water mark.
- Rule 5 (a paused client is not a silent one). The broker does not read a paused connection's PINGREQs, so
  the keepalive of paused connections is refreshed at every sweep (:meth:`ReadPressure.tick`).

Counted for ``$SYS`` (``episodes``: engagements, ``pauses``: connections paused) and logged once per episode
when it engages and when it is released.
"""
from __future__ import annotations

from typing import Any, Callable

import structlog

from .connection import CLOSED
from .packets import Publish
from .session import QueueBudget
from .settings import MQTTSettings

log = structlog.get_logger(__name__)

#: At most one engaged/released pair of log lines per this many ms: a consumer that never catches up makes
#: several episodes a second; the ones in between are counted in the next line (and in $SYS).
LOG_EVERY_MS = 10_000


class ReadPressure:
    """The back-pressure decisions of one broker.

    Args:
        budget: the broker's shared :class:`QueueBudget`.
        high_fraction: ``mqtt.backpressure_high_fraction``.
        low_fraction: ``mqtt.backpressure_low_fraction``.
        wake: called when a decision is pending (the adapter then flushes and takes it).

    Attributes:
        high_bytes: online queued bytes above which publishers are paused.
        low_bytes: online queued bytes at or below which they are resumed.
        engaged: an episode is running.
        paused: the connections paused now.
        changes: decisions the adapter has not taken yet (check it after each ``data_received``: a loop
            may hand one connection several reads before the next flush).
        episodes: engagements since start; pauses: connections paused since start.
    """

    __slots__ = ("budget", "high_bytes", "low_bytes", "engaged", "paused", "episodes", "pauses", "changes",
                 "_wake", "_since_ms", "_episode_pauses", "_peak", "_logged_ms", "_unlogged", "_log_episode")

    def __init__(self, budget: QueueBudget, high_fraction: float, low_fraction: float,
                 wake: Callable[[], None]) -> None:
        self.budget = budget
        online_part = max(0, budget.max_bytes - budget.offline_max_bytes)
        self.high_bytes = int(online_part * high_fraction)
        self.low_bytes = min(int(online_part * low_fraction), self.high_bytes)
        self.engaged = False
        self.paused: set[Any] = set()
        self.episodes = 0
        self.pauses = 0
        # connection -> pause reading (True) or resume (False), for the adapter; the last decision wins
        self.changes: dict[Any, bool] = {}
        self._wake = wake
        self._since_ms = 0
        self._episode_pauses = 0
        self._peak = 0
        self._logged_ms: int | None = None  # when the last logged episode started
        self._unlogged = 0  # episodes since then, not logged
        self._log_episode = False  # the running episode is logged (its release too)

    @classmethod
    def from_settings(cls, budget: QueueBudget, settings: MQTTSettings, wake: Callable[[], None]) -> "ReadPressure":
        """Build from the broker's :class:`MQTTSettings`."""
        return cls(budget, settings.backpressure_high_fraction, settings.backpressure_low_fraction, wake)

    def after_read(self, conn: Any, packets: list[Any], now_ms: int) -> None:
        """The broker handled ``packets`` from ``conn`` and the online queues are over ``high_bytes``: pause
        ``conn`` if it published (Rules 2 and 3)."""
        online = self.budget.online_bytes
        if not self.engaged:
            self.engaged = True
            self.episodes += 1
            self._since_ms = now_ms
            self._episode_pauses = 0
            self._peak = online
            self._log_episode = self._logged_ms is None or now_ms - self._logged_ms >= LOG_EVERY_MS
            if self._log_episode:
                log.warning("mqtt back-pressure engaged: not reading from publishers", online_queued_bytes=online,
                            high_bytes=self.high_bytes, low_bytes=self.low_bytes,
                            offline_queued_bytes=self.budget.offline_bytes, max_queued_bytes=self.budget.max_bytes,
                            episodes_unlogged=self._unlogged)
                self._logged_ms, self._unlogged = now_ms, 0
            else:
                self._unlogged += 1
        elif online > self._peak:
            self._peak = online
        if conn in self.paused:
            return
        s = conn.session
        if s is None or s.queue:
            return  # Rule 3: its acknowledgements free the budget
        for p in packets:
            if isinstance(p, Publish):
                break
        else:
            return
        self.paused.add(conn)
        self.changes[conn] = True
        self.pauses += 1
        self._episode_pauses += 1
        self._wake()

    def queued_for(self, conn: Any) -> None:
        """A message was queued for ``conn``'s session: if ``conn`` is paused, resume it (Rule 3)."""
        if conn in self.paused:
            self.paused.discard(conn)
            self.changes[conn] = False
            self._wake()

    def relieve(self, now_ms: int) -> None:
        """While engaged: end the episode when the online queues are back at or below ``low_bytes``."""
        online = self.budget.online_bytes
        if online > self.low_bytes:
            if online > self._peak:
                self._peak = online
            return
        self.engaged = False
        resumed = len(self.paused)
        for conn in self.paused:
            self.changes[conn] = False
        self.paused.clear()
        if resumed:
            self._wake()
        if self._log_episode:
            log.info("mqtt back-pressure released", online_queued_bytes=online, low_bytes=self.low_bytes,
                     duration_ms=now_ms - self._since_ms, connections_paused=self._episode_pauses,
                     resumed=resumed, peak_online_queued_bytes=self._peak)

    def tick(self, now_ms: int) -> None:
        """At each sweep: refresh the keepalive of paused connections, forget closed ones (Rule 5)."""
        closed = []
        for conn in self.paused:
            if conn.state >= CLOSED:
                closed.append(conn)
            else:
                conn.last_rx_ms = now_ms
        for conn in closed:
            self.paused.discard(conn)

    def take(self) -> dict[Any, bool]:
        """The decisions since the last call, for the adapter: connection -> True (pause reading) or False
        (resume reading)."""
        changes = self.changes
        self.changes = {}
        return changes


__all__ = ["ReadPressure"]
