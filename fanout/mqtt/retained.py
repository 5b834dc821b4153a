"""Retained messages: one per topic name, replayed to new subscriptions.

Strategy: a dict from topic name to ``(payload, qos)``. A PUBLISH with RETAIN=1 replaces the topic's
message; an empty payload removes it (MQTT-3.3.1-10/11); RETAIN=1 with QoS 0 is stored like any other
(MQTT-3.3.1-7 allows discarding it later, this store keeps it). :meth:`RetainedStore.matching` answers a
filter without wildcards with one lookup, a wildcard filter whose first level is a name (``agent/<VIN>/#``,
what every vehicle subscribes on connect) with a scan over the topics under that first level only (an
index kept beside the dict: a storm of vehicle connects scanned every ``$SYS`` topic per SUBSCRIBE, 58 µs
of the 550 µs per connect, docs/profile.md), and a filter starting with a wildcard with a scan over every
stored topic, which is fine for the few hundred retained topics of this system ($SYS values, wills); a
topic tree would be the next step if millions of retained topics had to be served.

Bounds: at most ``max_messages`` topics and ``max_bytes`` of topic + payload (``mqtt.max_retained_messages``,
``mqtt.max_retained_bytes``), ``$SYS/...`` excluded (the server's own statistics, a fixed set). A retained
message that does not fit is not stored, and the topic's previous retained message is removed all the
same: it has been superseded, and replaying it to later subscribers would present stale data as the
latest. The message itself is still routed to the current subscribers; the caller counts the refusal.

Persistence stays outside (sans-I/O): with ``track_changes`` the store remembers which topics changed
since :meth:`RetainedStore.take_changes`, and the adapter writes them wherever it keeps them
(``storage.retained`` in the cluster). ``$SYS/...`` topics are not tracked: each node republishes its
own statistics.
"""
from __future__ import annotations

import sys
from typing import Iterator

from .topics import topic_matches

_SYS_PREFIX = "$SYS/"


class RetainedStore:
    """Topic name -> (payload, qos) of the last retained message.

    Args:
        max_messages: most retained topics kept, ``$SYS/...`` excluded.
        max_bytes: most topic + payload bytes kept, ``$SYS/...`` excluded.
    """

    __slots__ = ("_msgs", "_by_first", "_changes", "max_messages", "max_bytes", "_count", "_bytes")

    def __init__(self, max_messages: int = sys.maxsize, max_bytes: int = sys.maxsize) -> None:
        self._msgs: dict[str, tuple[bytes, int]] = {}
        # first topic level -> its topics (an ordered set, in the order they entered _msgs)
        self._by_first: dict[str, dict[str, None]] = {}
        self._changes: dict[str, tuple[bytes, int] | None] | None = None
        self.max_messages = max_messages
        self.max_bytes = max_bytes
        self._count = 0  # topics and bytes under the bounds (not $SYS)
        self._bytes = 0

    @property
    def stored_bytes(self) -> int:
        """Topic + payload bytes of the retained messages under the bounds (``$SYS/...`` excluded)."""
        return self._bytes

    def track_changes(self) -> None:
        """From now on remember changed topics for :meth:`take_changes`."""
        if self._changes is None:
            self._changes = {}

    def take_changes(self) -> dict[str, tuple[bytes, int] | None]:
        """Topics changed since the last call: ``(payload, qos)``, or None where the message was cleared."""
        changes = self._changes
        if not changes:
            return {}
        self._changes = {}
        return changes

    def __len__(self) -> int:
        return len(self._msgs)

    def __contains__(self, topic: str) -> bool:
        return topic in self._msgs

    def get(self, topic: str) -> tuple[bytes, int] | None:
        """The retained (payload, qos) of ``topic``, or None."""
        return self._msgs.get(topic)

    def requeue(self, changes: dict[str, tuple[bytes, int] | None]) -> None:
        """Give back changes that could not be persisted (newer changes of the same topics win)."""
        if self._changes is not None:
            self._changes = {**changes, **self._changes}

    def set(self, topic: str, payload: bytes, qos: int) -> str | None:
        """Store (or, for an empty payload, clear) the retained message of ``topic``.

        Args:
            topic: topic name (valid, no wildcards).
            payload: message; ``b""`` removes the topic's retained message (MQTT-3.3.1-10).
            qos: the QoS it was published with (replay uses min(this, granted QoS)).

        Returns:
            None when stored (or cleared); when a bound refused it, ``"retained_messages"`` or
            ``"retained_bytes"`` (the topic's previous message is removed then, see the module docstring).
        """
        msgs = self._msgs
        if topic.startswith(_SYS_PREFIX):
            if payload:
                if topic not in msgs:
                    self._index(topic)
                msgs[topic] = (payload, qos)
            elif msgs.pop(topic, None) is not None:
                self._unindex(topic)
            return None
        old = msgs.get(topic)
        refused = None
        if payload:
            size = len(topic) + len(payload)
            freed = len(topic) + len(old[0]) if old is not None else 0
            if old is None and self._count >= self.max_messages:
                refused = "retained_messages"
            elif self._bytes - freed + size > self.max_bytes:
                refused = "retained_bytes"
            else:
                msgs[topic] = (payload, qos)
                self._bytes += size - freed
                if old is None:
                    self._count += 1
                    self._index(topic)
        if refused is not None or not payload:
            if old is None:
                return refused  # clearing nothing changes nothing
            del msgs[topic]
            self._unindex(topic)
            self._bytes -= len(topic) + len(old[0])
            self._count -= 1
            payload = b""
        if self._changes is not None:
            self._changes[topic] = (payload, qos) if payload else None
        return refused

    def matching(self, topic_filter: str) -> Iterator[tuple[str, bytes, int]]:
        """(topic, payload, qos) of every retained message the filter matches, topics in insertion order.

        The ``$`` rule applies: ``#`` and ``+/...`` do not match ``$SYS/...`` (MQTT-4.7.2-1).
        """
        if "+" not in topic_filter and "#" not in topic_filter:
            hit = self._msgs.get(topic_filter)
            if hit is not None:
                yield topic_filter, hit[0], hit[1]
            return
        first = topic_filter.partition("/")[0]
        msgs = self._msgs
        if first == "+" or first == "#":
            candidates = list(msgs.items())
        else:
            candidates = [(t, msgs[t]) for t in self._by_first.get(first, ())]
        for topic, (payload, qos) in candidates:
            if topic_matches(topic_filter, topic):
                yield topic, payload, qos

    def _index(self, topic: str) -> None:
        first = topic.partition("/")[0]
        group = self._by_first.get(first)
        if group is None:
            self._by_first[first] = group = {}
        group[topic] = None

    def _unindex(self, topic: str) -> None:
        first = topic.partition("/")[0]
        group = self._by_first.get(first)
        if group is not None:
            group.pop(topic, None)
            if not group:
                del self._by_first[first]

    def topics(self) -> list[str]:
        """Every topic with a retained message."""
        return list(self._msgs)


__all__ = ["RetainedStore"]
