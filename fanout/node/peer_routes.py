"""The inter-node route table: which peer nodes subscribe to what, and this node's announcements.

(Not the broker's own publish routing to local subscribers: that is :mod:`fanout.mqtt`.)

Strategy (one instance per ConnectionNode, Ray-free):

- Every node announces the *distinct* topic filters its clients subscribe to (not who subscribed: one
  ``agent/+/proxy/request/+`` stands for any number of vehicles). Announcements are diffs
  ``(added, removed)`` computed at most every ``interval_ms`` and only when a subscription changed (or on
  the periodic safety pass, which also catches sessions that expired without an event); a node that
  (re)starts sends its whole set with ``reset=True``.
- Per-vehicle delivery filters (``agent/<VIN>/proxy/request/+``, one per vehicle) are announced as the
  one filter with ``+`` in place of the VIN (:func:`delivery_route_generalizer`): a superset, so nothing
  a node needs is missed, while the route table stays the size of the distinct *kinds* of subscription
  instead of growing with the fleet on every node (100,000 vehicles over 6 listeners would otherwise be
  500,000 remote filters held and exchanged). A rare direct publish to one vehicle's delivery topic
  then reaches every node with vehicles, and each delivers it only to its local matches.
- The walk over the local filters that builds an announcement is O(filters); it is paced so that it
  takes at most ~5% of the event loop (a connection storm keeps the table dirty all the time).
- Remote filters live in a :class:`SubscriptionTrie` keyed by node id, so deciding where a publish goes
  is one trie match, the same matching (and ``$``-topic rules) the broker uses locally.
- A publish is forwarded at most once per node, with its MQTT 5 properties (User Properties, Content Type,
  Response Topic, Correlation Data, Message Expiry Interval) when it has them; retained publishes (set or clear) are mirrored to
  every peer whether or not it has a matching subscription, so a later subscriber anywhere gets them.
  ``$SYS/...`` is never forwarded: each node publishes its own statistics.
- MQTT 5 shared subscriptions are not announced as filters but as groups with member counts
  (``{"$share/g/f": n}``, the whole table when it changed, :meth:`PeerRoutes.group_announcement`); a
  peer's table goes to :attr:`PeerRoutes.on_groups` (the broker's ``SharedSubscriptions.set_remote``), and
  the publishing node places each message of a group on one node (:mod:`fanout.mqtt.shared`), queued here
  by :meth:`PeerRoutes.forward_shared` as a forward for those groups only.
- Forwards are queued per destination node and shipped by the actor in one call per node per tick.
  Forwarding between nodes is at-most-once for QoS 0 and best effort for QoS 1/2 (a node death loses
  what was in its queue), as in bridged Mosquitto clusters; fanout deliveries do not use this path.
"""
from __future__ import annotations

import time
from typing import Any, Callable, Iterable

import structlog

from fanout.mqtt.shared import forward_properties
from fanout.mqtt.trie import SubscriptionTrie
from fanout.records import Forward

log = structlog.get_logger(__name__)

ANNOUNCE_LOOP_SHARE = 0.05  # most of the event loop that building announcements may take


def delivery_route_generalizer(topic_prefix: str) -> Callable[[str], str]:
    """A function mapping a filter under ``topic_prefix`` (with its ``{VIN}`` level) to the same filter
    with ``+`` at the VIN level, and any other filter to itself. Every topic the original filter matches,
    the result matches too."""
    head, found, tail = topic_prefix.partition("{VIN}")
    n = len(head)
    if not found or (head and not head.endswith("/")) or (tail and not tail.startswith("/")):
        return lambda f: f  # no whole VIN level to widen

    def generalize(f: str) -> str:
        if not f.startswith(head):
            return f
        i = f.find("/", n)
        level = f[n:] if i < 0 else f[n:i]
        if "#" in level or level == "+":
            return f  # already as wide as it gets at that level ('#' is wider than '+')
        if i < 0:
            return head + "+" if not tail else f
        return head + "+" + f[i:] if f.startswith(tail, i) else f

    return generalize


class PeerRoutes:
    """Remote filters per peer node, the forward queues, and the announcement state of this node.

    Args:
        node_id: this node's id (never a destination).
        interval_ms: least time between two announcements.
        full_check_ms: period of the announcement pass that runs without a known change.
        generalize: maps a local filter to the (wider) filter announced for it (see the module docstring).
        max_queue_bytes: bound on the topic + payload bytes queued for one peer (they pile up while a call to
            that peer is in flight); a publish that does not fit is dropped for that peer and counted.
    """

    def __init__(self, node_id: str, *, interval_ms: int = 50, full_check_ms: int = 2000,
                 generalize: Callable[[str], str] | None = None, max_queue_bytes: int = 64 << 20) -> None:
        self.node_id = node_id
        self._generalize = generalize
        self._pace_ms = 0.0  # extra spacing so that building announcements stays under ANNOUNCE_LOOP_SHARE
        self._trie: SubscriptionTrie[str] = SubscriptionTrie()
        self._by_node: dict[str, set[str]] = {}
        self._peers: set[str] = set()
        self._out: dict[str, list[tuple]] = {}  # peer -> Forward tuples
        self._out_bytes: dict[str, int] = {}  # peer -> topic + payload bytes of its queue
        self._max_bytes = max_queue_bytes
        self._over: set[str] = set()  # peers whose queue is full now (logged once per episode)
        self.dropped = 0
        self._announced: set[str] = set()
        self._announced_groups: dict[str, int] | None = None  # None: every peer needs the whole table
        # called with (peer, {shared filter: member count}) on a peer's group table ({} when it is gone)
        self.on_groups: Callable[[str, dict[str, int]], None] | None = None
        # called with whether any peer is left whenever the peers change (NodeCore: the broker then makes a
        # LocalPublish per publish only while there is a node to forward to)
        self.on_peers: Callable[[bool], None] | None = None
        self._shared: Any = None  # the broker's SharedSubscriptions, once join_shared was called
        self._dirty = True
        self._reset_pending = True
        self._interval = interval_ms
        self._full_check = full_check_ms
        self._last_ms = -(1 << 62)
        self._last_full_ms = -(1 << 62)
        self.forwarded = 0

    # -- peers and their filters ----------------------------------------------------------------

    @property
    def peers(self) -> frozenset[str]:
        """Node ids of the other nodes."""
        return frozenset(self._peers)

    def set_peers(self, nodes: Iterable[str]) -> None:
        """Set the other nodes; forgets the filters of nodes no longer listed."""
        new = set(nodes) - {self.node_id}
        for gone in self._peers - new:
            self.remove_node(gone)
        if new - self._peers:
            self._reset_pending = True  # newcomers need the whole set
            self._announced_groups = None
            self._dirty = True
        self._peers = new
        if self.on_peers is not None:
            self.on_peers(bool(new))

    def remove_node(self, node: str) -> None:
        """Forget a peer (it died or left): its filters and queued forwards."""
        self._peers.discard(node)
        self._out.pop(node, None)
        self._out_bytes.pop(node, None)
        self._over.discard(node)
        if self._by_node.pop(node, None) is not None:
            self._trie.remove_all(node)
        if self.on_groups is not None:
            self.on_groups(node, {})
        if self.on_peers is not None:
            self.on_peers(bool(self._peers))

    def update(self, node: str, added: Iterable[str], removed: Iterable[str], reset: bool = False,
               groups: dict[str, int] | None = None) -> None:
        """Apply a peer's announcement.

        Args:
            node: the announcing node.
            added: filters it now has.
            removed: filters it no longer has.
            reset: ``added`` is its whole set (forget what it announced before).
            groups: its whole shared-group table ``{shared filter: member count}``, None when unchanged.
        """
        if node == self.node_id:
            return
        if groups is not None and self.on_groups is not None:
            self.on_groups(node, groups)
        have = self._by_node.setdefault(node, set())
        if reset:
            self._trie.remove_all(node)
            have.clear()
        for f in removed:
            if f in have:
                have.discard(f)
                self._trie.remove(f, node)
        for f in added:
            if f not in have:
                have.add(f)
                self._trie.add(f, node, 0)

    def join_shared(self, shared: Any, now_ms: Callable[[], int], wake: Callable[[], None]) -> None:
        """Serve the broker's MQTT 5 shared groups cluster-wide (:mod:`fanout.mqtt.shared`, rules 1-3): the
        peers' group tables go to ``shared.set_remote``, this node's go with :meth:`full_announcement`, and
        what the broker places on a peer is queued here (``wake`` when it was, ``now_ms`` is the broker's
        clock for the remaining Message Expiry Interval)."""
        self._shared = shared
        self.on_groups = shared.set_remote

        def send(node: str, groups: tuple[str, ...], topic: str, payload: bytes, qos: int, props: Any) -> None:
            if self.forward_shared(node, groups, topic, payload, qos, forward_properties(props, now_ms())):
                wake()

        shared.join_cluster(send)

    def shared_stats(self) -> dict[str, int]:
        """Group deliveries placed on peers, and those that arrived here for a group with no member left."""
        shared = self._shared
        return {"shared_placed_away": shared.sent_away if shared is not None else 0,
                "shared_orphaned": shared.orphaned if shared is not None else 0}

    def remote_filters(self, node: str) -> set[str]:
        """Filters announced by ``node`` (a copy)."""
        return set(self._by_node.get(node, ()))

    # -- forwarding -------------------------------------------------------------------------------

    def forward(self, topic: str, payload: bytes, qos: int, retain: bool, properties: Any = None) -> int:
        """Queue a local publish for the peers that need it.

        Args:
            properties: its MQTT 5 properties (``LocalPublish.properties``), None for a 3.1.1 publish; the peer
                passes them to ``publish_local`` (Message Expiry Interval counted again from there).

        Returns:
            How many nodes it was queued for.
        """
        if not self._peers or topic.startswith("$SYS/"):
            return 0
        if retain:
            targets: Iterable[str] = self._peers
        else:
            targets = self._trie.match(topic) if self._by_node else ()
        item = Forward.build(topic, payload, qos, retain, properties)
        size = len(topic) + len(payload)
        n = 0
        for node in targets:
            n += self._enqueue(node, item, size)
        self.forwarded += n
        return n

    def forward_shared(self, node: str, groups: tuple[str, ...], topic: str, payload: bytes, qos: int,
                       properties: Any = None) -> bool:
        """Queue a message for the shared ``groups`` this node placed on ``node`` (for them only).

        Returns:
            True when queued; False when ``node`` is no peer (any more) or its queue is full (counted in
            :attr:`dropped`): the message is lost for those groups, as a full queue loses a plain forward.
        """
        if node not in self._peers:
            self.dropped += 1
            return False
        item = Forward.build(topic, payload, qos, False, properties, groups, False)
        if self._enqueue(node, item, len(topic) + len(payload)):
            self.forwarded += 1
            return True
        return False

    def _enqueue(self, node: str, item: tuple, size: int) -> int:
        """Queue ``item`` for ``node`` within the byte bound; 1 when queued, 0 when dropped."""
        sizes = self._out_bytes
        queued = sizes.get(node, 0)
        if queued + size > self._max_bytes and queued:
            self._drop(node, queued)
            return 0
        sizes[node] = queued + size
        q = self._out.get(node)
        if q is None:
            self._out[node] = [item]
        else:
            q.append(item)
        return 1

    def _drop(self, node: str, queued: int) -> None:
        self.dropped += 1
        if node not in self._over:
            self._over.add(node)
            log.warning("forward queue full: publishes for this peer are dropped until its call returns",
                        peer=node, queued_bytes=queued, limit="fanout.max_forward_queue")

    def has_forwards(self) -> bool:
        """True when some forward is queued."""
        return bool(self._out)

    def take_forwards(self, busy: Iterable[str] = ()) -> dict[str, list[tuple]]:
        """Take the queued :class:`fanout.records.Forward` tuples of every node not in ``busy`` (their
        queues keep growing)."""
        busy = set(busy)
        if not busy:
            out, self._out = self._out, {}
            self._out_bytes.clear()
            self._over.clear()
            return out
        taken = {n: q for n, q in self._out.items() if n not in busy}
        for n in taken:
            del self._out[n]
            self._out_bytes.pop(n, None)
            self._over.discard(n)
        return taken

    # -- announcements of this node's filters -----------------------------------------------------------

    def mark_dirty(self) -> None:
        """A local subscription changed: announce soon."""
        self._dirty = True

    def announcement(self, now_ms: int, local_filters: Iterable[str] | None = None,
                     filters_fn: Callable[[], Iterable[str]] | None = None) -> tuple[list[str], list[str], bool] | None:
        """The diff to send to every peer now, or None.

        Args:
            now_ms: current time.
            local_filters: the node's current distinct filters (or give ``filters_fn`` to compute them only
                when an announcement is due).
            filters_fn: callable returning the current filters.

        Returns:
            ``(added, removed, reset)`` or None when nothing is due or nothing changed.
        """
        if not self._peers:
            return None
        full_due = now_ms - self._last_full_ms >= self._full_check
        if not (self._dirty or full_due) or now_ms - self._last_ms < max(self._interval, self._pace_ms):
            return None
        t0 = time.perf_counter()
        filters = local_filters if local_filters is not None else (filters_fn() if filters_fn else ())
        current = set(map(self._generalize, filters)) if self._generalize is not None else set(filters)
        self._pace_ms = (time.perf_counter() - t0) * 1000 / ANNOUNCE_LOOP_SHARE
        self._last_ms = now_ms
        self._dirty = False
        if full_due:
            self._last_full_ms = now_ms
        if self._reset_pending:
            self._reset_pending = False
            self._announced = current
            return sorted(current), [], True
        added = current - self._announced
        removed = self._announced - current
        if not added and not removed:
            return None
        self._announced = current
        return sorted(added), sorted(removed), False

    def full_announcement(self, now_ms: int, filters_fn: Callable[[], Iterable[str]]
                          ) -> tuple[list[str], list[str], bool, dict[str, int] | None] | None:
        """:meth:`announcement` plus the shared-group table: ``(added, removed, reset, groups)``, ``groups``
        None when unchanged (the arguments of a peer's :meth:`update`), or None when nothing is due."""
        ann = self.announcement(now_ms, filters_fn=filters_fn)
        groups = self.group_announcement(self._shared.local_counts()) if self._shared is not None else None
        if ann is None and groups is None:
            return None
        added, removed, reset = ann if ann is not None else ([], [], False)
        return added, removed, reset, groups

    def group_announcement(self, counts: dict[str, int]) -> dict[str, int] | None:
        """This node's shared-group table to send to every peer now (``counts``: its groups with members
        here), or None when the peers already have it. Groups are few: the whole table goes each time."""
        if not self._peers or counts == self._announced_groups:
            return None
        self._announced_groups = dict(counts)
        return self._announced_groups


__all__ = ["PeerRoutes", "delivery_route_generalizer"]
