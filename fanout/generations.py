"""Connection generations: the cluster-wide id of one accepted MQTT connection, and how two compare.

Scheme: ``generation = incarnation << COUNTER_BITS | counter``. Each :class:`GenerationClock` (one per
connection node process) draws a random 31-bit *incarnation* when it starts and counts its connections
from 1; when the counter would overflow it draws a new incarnation. No wall clock is involved, so a node
restarted with its clock stepped back cannot produce generations that look older than its predecessor's
and get its live connections fenced (the failure of the wall-clock generations used before).

What the dispatchers rely on, and why that is enough:

- Identity. Two connections never share a generation: a node's counter never repeats within an
  incarnation, and two incarnations (two node processes, or one node before and after a restart) draw the
  same random number with probability 2^-31; it would matter only if both were alive at once.
- Order within an incarnation. One node ships its events to a dispatcher in order (one ``events`` call in
  flight), so for events of ONE incarnation the larger counter is the newer connection
  (:func:`newer`): a connect older than a connection already seen on that node is stale.
- Across incarnations there is no order to read from the numbers, and none is needed: the shard of
  ``crc32(client_id)`` sees every connect of that client id, on any node, so it orders them by arrival.
  The later connect is the newer one (a second CONNECT takes over, as on a single broker). That holds because
  a node writes a vehicle's CONNACK only after the events call carrying its connect returned
  (:mod:`fanout.mqtt.connack_hold`), and a client connects again only after a CONNACK: a report can no longer
  be overtaken by the client's next connect on another node. Wall-clock generations never ordered that
  case: they were right only while the nodes' clocks agreed to better than a reconnect.

The incarnations are not kept anywhere: a dispatcher never needs to know whether incarnation X came before
incarnation Y, only whether two generations are of the same one.
"""
from __future__ import annotations

import secrets

COUNTER_BITS = 32
INCARNATION_BITS = 31  # generation < 2**63
_COUNTER_MASK = (1 << COUNTER_BITS) - 1


def incarnation_of(generation: int) -> int:
    """The incarnation part of a generation."""
    return generation >> COUNTER_BITS


def newer(generation: int, than: int) -> bool:
    """Whether ``generation`` supersedes ``than`` for events that arrive after it (see module docstring).

    Same incarnation: the larger counter is newer. Other incarnation: newer by arrival (True). Equal: a
    duplicate (False).
    """
    if generation >> COUNTER_BITS == than >> COUNTER_BITS:
        return generation > than
    return True


class GenerationClock:
    """Generations of one connection node process: a random incarnation and a counter.

    Args:
        incarnation: the first incarnation (tests pin it); default a random 31-bit number.
    """

    __slots__ = ("_incarnation", "_counter")

    def __init__(self, incarnation: int | None = None) -> None:
        self._incarnation = _draw() if incarnation is None else incarnation
        self._counter = 0

    @property
    def incarnation(self) -> int:
        """The current incarnation."""
        return self._incarnation

    def next(self) -> int:
        """A generation never returned before, newer than every earlier one of this clock (:func:`newer`)."""
        self._counter += 1
        if self._counter > _COUNTER_MASK:
            # A new incarnation: to a dispatcher it is "another node process", newer by arrival.
            previous = self._incarnation
            while self._incarnation == previous:
                self._incarnation = _draw()
            self._counter = 1
        return self._incarnation << COUNTER_BITS | self._counter


def _draw() -> int:
    return secrets.randbits(INCARNATION_BITS)


__all__ = ["GenerationClock", "newer", "incarnation_of", "COUNTER_BITS"]
