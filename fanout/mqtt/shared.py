"""MQTT 5 shared subscriptions: ``$share/<group>/<filter>`` (section 4.8.2), on one node.

Strategy: each (group, filter) pair is one *group* holding its members (client id -> granted QoS, in
subscription order). The groups' filters live in a :class:`SubscriptionTrie` of their own, keyed by the
whole shared filter string, so a topic finds its groups the way ordinary subscriptions are found and an
ordinary match never sees them. Each matching message goes to ONE member of each group: round-robin,
starting after the member served last, preferring a connected member whose window is open, then any
connected member, then (QoS > 0) an offline persistent member, whose session queues it; with no member
able to take it the message is dropped for that group.

What a member receives follows its own subscription: QoS min(publish, granted), its Subscription
Identifier; No Local is not allowed on a shared subscription (MQTT-3.8.3-4), and retained messages are
not sent when a shared subscription is made (4.8.2). Across nodes, every node holding members of a group
delivers one copy (the route table announces the inner filter): one member per group per node.
"""
from __future__ import annotations

from typing import Any

from .session import Session
from .trie import SubscriptionTrie

SHARED_PREFIX = "$share/"


def parse_shared(topic_filter: str) -> tuple[str, str] | None:
    """(group, filter) of a ``$share/<group>/<filter>`` filter, or None when it is not one.

    Raises:
        ValueError: a malformed shared filter: empty group or filter, or a wildcard in the group name
            (MQTT-4.8.2-1, -2).
    """
    if not topic_filter.startswith(SHARED_PREFIX):
        return None
    rest = topic_filter[len(SHARED_PREFIX):]
    group, sep, inner = rest.partition("/")
    if not sep or not group or not inner:
        raise ValueError(f"{topic_filter!r}: a shared subscription is $share/<group>/<filter> (4.8.2)")
    if "+" in group or "#" in group:
        raise ValueError(f"{topic_filter!r}: wildcard in a share name (MQTT-4.8.2-2)")
    return group, inner


class SharedSubscriptions:
    """The shared subscriptions of one broker.

    Args:
        sessions: the broker's client id -> :class:`Session` registry.
        give: ``give(session, topic, payload, qos, granted, props, sender, retain, sub_ids) -> bool``
            (:meth:`fanout.mqtt.delivery.Delivery.give5`).
    """

    def __init__(self, sessions: dict[str, Session], give: Any) -> None:
        self._sessions = sessions
        self._give = give
        self._trie = SubscriptionTrie()
        self.groups: dict[str, dict[str, int]] = {}  # shared filter -> {member client id: granted QoS}
        self._next: dict[str, int] = {}  # shared filter -> index of the member to try first

    def add(self, shared_filter: str, inner: str, client_id: str, qos: int) -> None:
        """Add (or update) a member of the group ``shared_filter`` whose filter is ``inner``."""
        members = self.groups.get(shared_filter)
        if members is None:
            members = self.groups[shared_filter] = {}
            self._next[shared_filter] = 0
        members[client_id] = qos
        self._trie.add(inner, shared_filter, qos)

    def remove(self, shared_filter: str, inner: str, client_id: str) -> bool:
        """Remove a member; the group goes with its last member. True when it was a member."""
        members = self.groups.get(shared_filter)
        if members is None or members.pop(client_id, None) is None:
            return False
        if not members:
            del self.groups[shared_filter]
            del self._next[shared_filter]
            self._trie.remove(inner, shared_filter)
        return True

    def remove_all(self, client_id: str, filters: Any) -> None:
        """Remove ``client_id`` from the groups among ``filters`` (its session's filters)."""
        for f in filters:
            parsed = parse_shared(f)
            if parsed is not None:
                self.remove(f, parsed[1], client_id)

    def inner_filters(self) -> list[str]:
        """The distinct filters of the groups (for the route table other nodes forward by)."""
        return list(self._trie.filters())

    def route(self, topic: str, payload: bytes, qos: int, props: Any, retain: bool) -> int:
        """Give a message to one member of each matching group.

        Returns:
            The number of groups that took it.
        """
        groups = self._trie.match(topic)
        if not groups:
            return 0
        taken = 0
        for shared_filter in groups:
            s, granted = self._pick(shared_filter)
            if s is not None:
                opts = s.opts.get(shared_filter) if s.opts else None
                ids = (opts.sub_id,) if opts is not None and opts.sub_id else ()
                if self._give(s, topic, payload, qos, granted, props, None, retain, ids):
                    taken += 1
        return taken

    def _pick(self, shared_filter: str) -> tuple[Session | None, int]:
        members = list(self.groups[shared_filter].items())
        n = len(members)
        start = self._next[shared_filter] % n
        order = members[start:] + members[:start]
        sessions = self._sessions
        fallback: tuple[int, Session, int] | None = None
        offline: tuple[int, Session, int] | None = None
        for i, (cid, granted) in enumerate(order):
            s = sessions.get(cid)
            if s is None:
                continue
            if s.conn is not None:
                if s.window_open():
                    self._next[shared_filter] = start + i + 1
                    return s, granted
                if fallback is None:
                    fallback = (i, s, granted)
            elif offline is None:
                offline = (i, s, granted)
        chosen = fallback or offline
        if chosen is None:
            return None, 0
        self._next[shared_filter] = start + chosen[0] + 1
        return chosen[1], chosen[2]


__all__ = ["SharedSubscriptions", "parse_shared", "SHARED_PREFIX"]
