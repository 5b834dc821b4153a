"""Connection generations: the cluster-wide number of one accepted MQTT connection.

A node maps its broker's local connection counter to a wall-clock microsecond number
(:class:`GenerationClock`), so a takeover on another node always carries a larger generation than the
connection it replaces (clocks of one machine, or NTP-synchronised machines, are assumed to be closer than
the time a client needs to reconnect).
"""
from __future__ import annotations

import time
from typing import Callable


class GenerationClock:
    """Cluster-wide connection generations: wall-clock microseconds, strictly increasing per node.

    Args:
        clock_us: time source in microseconds (tests inject a counter).
    """

    __slots__ = ("_last", "_clock")

    def __init__(self, clock_us: Callable[[], int] | None = None) -> None:
        self._last = 0
        self._clock = clock_us or (lambda: time.time_ns() // 1000)

    def next(self) -> int:
        """A generation larger than every one returned before by this clock."""
        g = self._clock()
        if g <= self._last:
            g = self._last + 1
        self._last = g
        return g


__all__ = ["GenerationClock"]
