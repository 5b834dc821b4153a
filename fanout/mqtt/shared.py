"""MQTT 5 shared subscriptions: ``$share/<group>/<filter>`` (section 4.8.2), on one node and across nodes.

Strategy: each (group, filter) pair is one *group* holding its members (client id -> granted QoS, in
subscription order). The groups' filters live in a :class:`SubscriptionTrie` of their own, keyed by the
whole shared filter string, so a topic finds its groups the way ordinary subscriptions are found and an
ordinary match never sees them. Each matching message goes to ONE member of each group: round-robin,
starting after the member served last, preferring a connected member whose window is open, then any
connected member, then (QoS > 0) an offline persistent member, whose session queues it; with no member
able to take it the message is dropped for that group.

What a member receives follows its own subscription: QoS min(publish, granted), its Subscription
Identifier; No Local is not allowed on a shared subscription (MQTT-3.8.3-4), and retained messages are
not sent when a shared subscription is made (4.8.2).

Across nodes (a cluster installs :meth:`SharedSubscriptions.join_cluster`): one member per group per
message *cluster-wide*. Rule 1: each node announces its groups with their member counts
(:meth:`local_counts`); the others keep them (:meth:`set_remote`) and the trie holds every group known
anywhere. Rule 2: the node where a message enters (a client's publish, a will, an error message: any
:meth:`route` without ``serve``) picks ONE node per matching group, itself included, by smooth weighted
round-robin over the member counts (each member gets its share, whichever node holds it), serves the groups
it picked for itself and hands the others to ``send(node, groups, ...)``, one call per node. Rule 3: a
message forwarded by another node (``serve`` = the groups it picked this node for) is given to those groups
only, never re-picked or forwarded again. Race: a member that left between the announcement (every ~50 ms)
and the message's arrival: the receiving node gives it to another local member of the group; with none
left, the message is dropped for that group and counted in :attr:`orphaned` (MQTT 5 leaves the choice of
the member to the server, and forwarding between nodes is best effort as in a bridge; a QoS 1/2 message is
not re-routed to a third node). ``$SYS/...`` is local to each node and never picks a peer.
"""
from __future__ import annotations

from typing import Any, Callable, Iterable

from .message5 import MsgProps
from .properties import Properties
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


def forward_properties(msg: MsgProps | None, now_ms: int) -> Properties | None:
    """The wire properties of a routed message for another node's ``publish_local`` (the Message Expiry
    Interval is what remains of it now), None when it has none."""
    if msg is None:
        return None
    if msg.expires_ms is None:
        return msg.props
    return msg.props.replace(message_expiry_interval=msg.remaining_s(now_ms))


class SharedSubscriptions:
    """The shared subscriptions of one broker (and, in a cluster, the groups of the other nodes).

    Args:
        sessions: the broker's client id -> :class:`Session` registry.
        give: ``give(session, topic, payload, qos, granted, props, sender, retain, sub_ids) -> bool``
            (:meth:`fanout.mqtt.delivery.Delivery.give5`).
    """

    def __init__(self, sessions: dict[str, Session], give: Any,
                 may_read: Callable[[Session, str], bool] | None = None) -> None:
        self._sessions = sessions
        self._give = give
        self._may_read = may_read  # the ACL at delivery: a member that may not read the topic is passed over
        self._trie = SubscriptionTrie()
        # shared filter -> {member client id: granted QoS}: every group known here; a group only other
        # nodes have members of has an empty dict (it is in the trie so that a publish here finds it)
        self.groups: dict[str, dict[str, int]] = {}
        self._next: dict[str, int] = {}  # shared filter -> index of the member to try first
        self._inner: dict[str, str] = {}  # shared filter -> its inner filter (the trie's key)
        self._remote: dict[str, dict[str, int]] = {}  # shared filter -> {peer node: its member count}
        self._remote_of: dict[str, dict[str, int]] = {}  # peer node -> {shared filter: member count}
        self._credit: dict[str, dict[str | None, int]] = {}  # shared filter -> node (None = here) -> credit
        self._send: Callable[..., Any] | None = None
        self.orphaned = 0  # forwarded to this node for a group it no longer has a member of (dropped)
        self.sent_away = 0  # group deliveries placed on another node

    def join_cluster(self, send: Callable[..., Any]) -> None:
        """Place each message's groups cluster-wide (module docstring, rules 1-3).

        Args:
            send: ``send(node, groups, topic, payload, qos, props)``: deliver the message to ``groups`` (a
                tuple of shared filters) on ``node``; ``props`` is the :class:`MsgProps` or None.
        """
        self._send = send

    def _ensure(self, shared_filter: str, inner: str) -> dict[str, int]:
        members = self.groups.get(shared_filter)
        if members is None:
            members = self.groups[shared_filter] = {}
            self._next[shared_filter] = 0
            self._inner[shared_filter] = inner
            self._trie.add(inner, shared_filter, 0)
        return members

    def _drop_if_unused(self, shared_filter: str) -> None:
        if not self.groups.get(shared_filter) and shared_filter not in self._remote:
            del self.groups[shared_filter]
            del self._next[shared_filter]
            self._credit.pop(shared_filter, None)
            self._trie.remove(self._inner.pop(shared_filter), shared_filter)

    def add(self, shared_filter: str, inner: str, client_id: str, qos: int) -> None:
        """Add (or update) a member of the group ``shared_filter`` whose filter is ``inner``."""
        self._ensure(shared_filter, inner)[client_id] = qos

    def remove(self, shared_filter: str, inner: str, client_id: str) -> bool:
        """Remove a member; the group goes with its last member (anywhere). True when it was a member."""
        members = self.groups.get(shared_filter)
        if members is None or members.pop(client_id, None) is None:
            return False
        if not members:
            self._drop_if_unused(shared_filter)
        return True

    def remove_all(self, client_id: str, filters: Any) -> None:
        """Remove ``client_id`` from the groups among ``filters`` (its session's filters)."""
        for f in filters:
            parsed = parse_shared(f)
            if parsed is not None:
                self.remove(f, parsed[1], client_id)

    # -- the other nodes' groups ----------------------------------------------------------------------

    def local_counts(self) -> dict[str, int]:
        """``{shared filter: member count}`` of the groups with members on this node (its announcement)."""
        return {f: len(m) for f, m in self.groups.items() if m}

    def set_remote(self, node: str, counts: dict[str, int]) -> None:
        """Replace what ``node`` holds: ``{shared filter: member count}`` (``{}`` forgets the node)."""
        old = self._remote_of.pop(node, {})
        for f in old.keys() - counts.keys():
            per_node = self._remote[f]
            del per_node[node]
            credit = self._credit.get(f)
            if credit is not None:
                credit.pop(node, None)
            if not per_node:
                del self._remote[f]
                self._drop_if_unused(f)
        kept: dict[str, int] = {}
        for f, n in counts.items():
            parsed = parse_shared(f) if n > 0 else None
            if parsed is None:
                continue
            self._ensure(f, parsed[1])
            self._remote.setdefault(f, {})[node] = n
            kept[f] = n
        if kept:
            self._remote_of[node] = kept

    # -- routing ------------------------------------------------------------------------------------

    def route(self, topic: str, payload: bytes, qos: int, props: Any, retain: bool,
              serve: Iterable[str] | None = None) -> int:
        """Give a message to one member of each matching group (this node's part of it in a cluster).

        Args:
            serve: None for a message entering here (rule 2); for a message forwarded by another node, the
                groups it placed here (rule 3).

        Returns:
            The number of groups that took it (here or placed on another node).
        """
        if serve is not None:
            taken = 0
            for shared_filter in serve:
                if self.groups.get(shared_filter):
                    taken += self._give_one(shared_filter, topic, payload, qos, props, retain)
                else:
                    self.orphaned += 1
            return taken
        groups = self._trie.match(topic)
        if not groups:
            return 0
        taken = 0
        remote = self._remote
        away: dict[str, list[str]] | None = None
        for shared_filter in groups:
            node = self._place(shared_filter) if shared_filter in remote and self._send is not None \
                and not topic.startswith("$SYS/") else None
            if node is None:
                if self.groups[shared_filter]:
                    taken += self._give_one(shared_filter, topic, payload, qos, props, retain)
            elif away is None:
                away = {node: [shared_filter]}
            else:
                away.setdefault(node, []).append(shared_filter)
        if away is not None:
            send = self._send
            for node, placed in away.items():
                send(node, tuple(placed), topic, payload, qos, props)  # type: ignore[misc]
                taken += len(placed)
                self.sent_away += len(placed)
        return taken

    def _place(self, shared_filter: str) -> str | None:
        """The node that serves ``shared_filter`` this time (None = here): smooth weighted round-robin over
        the member counts (each node gains its count, the chosen one pays the total), so over any run of
        messages each node's share follows its member count and the nodes interleave."""
        credit = self._credit.get(shared_filter)
        if credit is None:
            credit = self._credit[shared_filter] = {}
        local = len(self.groups[shared_filter])
        best: str | None = None
        best_credit = None
        total = 0
        if local:
            total = local
            best_credit = credit[None] = credit.get(None, 0) + local
        for node, n in self._remote[shared_filter].items():
            c = credit[node] = credit.get(node, 0) + n
            total += n
            if best_credit is None or c > best_credit:
                best, best_credit = node, c
        credit[best] -= total
        return best

    def _give_one(self, shared_filter: str, topic: str, payload: bytes, qos: int, props: Any, retain: bool) -> int:
        s, granted = self._pick(shared_filter, topic)
        if s is None:
            return 0
        opts = s.opts.get(shared_filter) if s.opts else None
        ids = (opts.sub_id,) if opts is not None and opts.sub_id else ()
        return 1 if self._give(s, topic, payload, qos, granted, props, None, retain, ids) else 0

    def _pick(self, shared_filter: str, topic: str) -> tuple[Session | None, int]:
        members = list(self.groups[shared_filter].items())
        n = len(members)
        start = self._next[shared_filter] % n
        order = members[start:] + members[:start]
        sessions = self._sessions
        may_read = self._may_read
        fallback: tuple[int, Session, int] | None = None
        offline: tuple[int, Session, int] | None = None
        for i, (cid, granted) in enumerate(order):
            s = sessions.get(cid)
            if s is None or (may_read is not None and not may_read(s, topic)):
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


__all__ = ["SharedSubscriptions", "parse_shared", "forward_properties", "SHARED_PREFIX"]
