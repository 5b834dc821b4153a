# Over 500 lines: the node's one hook object on the per-delivery path (broker events, deliveries, forwards, ingest, kicks); its policies live in the sibling modules.
"""NodeCore: the Ray-free fanout logic of one connection node, plugged into the broker core as its hooks.

Strategy: the broker core (:mod:`fanout.mqtt`) stays a plain MQTT broker; this class turns its event
batches into what the dispatchers need, and executes what they send back. Nothing here calls Ray: the
ConnectionNode actor moves the queued batches (:meth:`take_events` when :meth:`events_wait` says they are
due, :meth:`PeerRoutes.take_forwards`) and supplies a :class:`fanout.node.ingest_rounds.ShardLink`; unit
tests drive the same object with the in-memory broker.

- Events -> per-dispatcher queues, keyed ``crc32(client_id) % shards`` (the dispatcher that owns the
  VIN also owns the client id's takeover registry). Only what dispatch needs is reported: connect (with
  the resumed session's "subscribed" boolean and its unacked fanout row key), disconnect, changes of
  the "subscribed to a filter covering ``<prefix with VIN>/+``" boolean, heartbeats
  (``ecp/<VIN>/online|heartbeat`` from the client whose id is that VIN), PUBACKs of fanout messages
  (their tag is the ``ids`` row key) and drops. Everything else (publishes, pings, other subscriptions)
  never leaves the node.
- Generations: the broker numbers connections per node; :class:`fanout.generations.GenerationClock` maps each
  accepted connection to a cluster-wide id (incarnation + counter, no wall clock), kept in ``_live`` with
  the shard, so later events of the connection (which carry only the local number, or none) are
  translated by a dict lookup.
- Deliveries (:meth:`apply_deliveries`): one ``Broker.deliver`` per send, QoS 1, tag = row key,
  ``require_subscription`` on; a send for a connection that is not the live one (another generation) is
  refused as NOT_CONNECTED without touching the broker. Only failures are returned. A batch's MQTT 5
  properties (remaining expiry, User Properties, Content Type) go with each send (:mod:`fanout.node.delivery_props`).
- Ingest tickets queue up and run in rounds (:mod:`fanout.node.ingest_rounds`); the outcome of each ticket is applied
  in order: ``complete_publish`` (PUBACK after the durable write) or ``reject_publish`` (JSON error on
  ``$SDV-FANOUT/errors/<client_id>``, forwarded to the other nodes too, then close; an MQTT 5 publisher gets a
  negative PUBACK with the error's ``reason_code`` and keeps its connection).
- Local publishes (and wills) are queued for the peers whose announced filters match; retained ones are
  mirrored to every peer (:mod:`fanout.node.peer_routes`). MQTT 5 shared groups are announced with their
  member counts and each message of a group is placed on one node by the broker
  (:mod:`fanout.mqtt.shared`), which hands the peers' part to :meth:`PeerRoutes.forward_shared`.
"""
from __future__ import annotations

import json
import time
from typing import Any, Callable, Iterable, Sequence

import structlog

from fanout.generations import GenerationClock
from fanout.mqtt.auth import filter_covers
from fanout.mqtt.hooks import (
    BrokerHooks, ClientConnected, ClientDisconnected, Delivered, DeliveryDropped, DeliverStatus, Heartbeat,
    IngestTicket, LocalPublish, Subscribed, Unsubscribed,
)
from fanout.node.delivery_props import BatchProps
from fanout.node.delivery_topic import DEFAULT_TOPIC_PREFIX, DeliveryTopics
from fanout.node.event_batching import EventBatching
from fanout.node.ingest_rounds import IngestRounds, ShardLink
from fanout.node.topic_appends import FULL_BATCH, FULL_BATCH_RAY, AppendBatch, TopicAppends
from fanout.node.topic_groups import NodeGroups, durable_filters
from fanout.topics.matcher import DurableTopics
from fanout.request_control import Reply, replies_topic
from fanout.node.peer_routes import PeerRoutes, delivery_route_generalizer
from fanout.records import (
    EV_HEARTBEAT, AckEvent, ConnectEvent, DeliveryFailure, DisconnectEvent, FailedEvent, HeartbeatEvent,
    SubscribedEvent, SyncEvent,
)
from fanout.trigger import ERRORS_TOPIC_PREFIX
from storage.keys import VIN_RE, shard_of

log = structlog.get_logger(__name__)

_NOT_CONNECTED = DeliverStatus.NOT_CONNECTED
_FAILED_MIN = DeliverStatus.NOT_CONNECTED  # NOT_CONNECTED, NOT_SUBSCRIBED, DROPPED
_HEARTBEAT_SUFFIXES = ("/online", "/heartbeat")



def _is_fanout_message(m: Any) -> bool:
    return type(m.tag) is bytes  # fanout deliveries are tagged with their row key

def _reports_to_dispatchers(client_id: str, principal: Any) -> bool:
    """Whether a connection is a vehicle for the dispatchers: its principal IS the vehicle its client id
    names (``principal.vehicle``; a ClientConnected event carries the same flag), and the id is a VIN."""
    return bool(principal.vehicle) and VIN_RE.fullmatch(client_id) is not None


class NodeCore:
    """Hooks of one node's broker (what :class:`~fanout.mqtt.hooks.BrokerHooks` describes); see the module
    docstring. Not a subclass of BrokerHooks: a compiled class (``make native``) cannot extend an interpreted
    one, and the broker asks only for the attributes and methods below.

    Args:
        config: loaded config (``fanout.topic_prefix``, ingest limits).
        node_id: this node's id, as the dispatchers and peers know it.
        link: dispatcher calls for ingest rounds (its ``shards`` is the dispatcher count).
        on_pending: called (no arguments) when events, tickets or forwards become pending; the actor
            schedules its next flush from it.
        clock_us: wall clock in microseconds (subscription times, row timestamps); tests inject one.
        incarnation: first incarnation of the generation clock (tests pin it; default random).
    """

    intercept_ingest = True
    forward_publishes = True
    append_durable = True  # durable_topic: an instance attribute, DurableTopics.matches

    def __init__(self, config: Any, node_id: str, link: ShardLink, *, on_pending: Callable[[], None] | None = None,
                 clock_us: Callable[[], int] | None = None, incarnation: int | None = None,
                 hold_connacks: bool = False) -> None:
        self.node_id = node_id
        self.ingest_prefix: str = BrokerHooks.ingest_prefix  # set here: mypyc keeps only literal class defaults
        self.heartbeat_prefix: str = BrokerHooks.heartbeat_prefix
        self.broker: Any = None
        self.shards = int(link.shards)
        self._prefix: str = config.fanout.topic_prefix if config is not None else DEFAULT_TOPIC_PREFIX
        self.topics = DeliveryTopics(self._prefix)
        self._gens = GenerationClock(incarnation)
        self._wall_us = clock_us or (lambda: time.time_ns() // 1000)  # subscription times (EV_SUBSCRIBED)
        wall = (lambda: clock_us() // 1000) if clock_us is not None else (lambda: time.time_ns() // 1_000_000)
        self.ingest = IngestRounds(config, link, wall_ms=wall)
        self._link = link
        self.durable = (DurableTopics(self.shards, config.topics, config.mqtt.match_cache_entries) if config is not None
                        else DurableTopics(self.shards))
        # asked by the broker per publish (BrokerHooks.durable_topic)
        self.durable_topic: Callable[[str], bool] = self.durable.matches
        if config is None:
            self.appends = TopicAppends(self.durable, full_batch=FULL_BATCH)
        else:
            self.appends = TopicAppends(self.durable, config.fanout.max_pending_appends,
                                        config.fanout.max_pending_append_bytes,
                                        full_batch=FULL_BATCH if config.cluster.direct_channels else FULL_BATCH_RAY)
        self.routes = PeerRoutes(node_id, generalize=delivery_route_generalizer(self._prefix),
                                 max_queue_bytes=config.fanout.max_forward_queue_bytes if config is not None else 64 << 20)
        self._wake = on_pending or (lambda: None)
        # client id -> (local generation, global generation, shard, is_vin)
        self._live: dict[str, tuple[int, int, int, bool]] = {}
        self._cover: dict[str, set[str]] = {}  # client id -> its filters covering the delivery filter
        self._out: list[list[tuple]] = [[] for _ in range(self.shards)]
        self._pending_shards: set[int] = set()
        # A queued event other than a PUBACK or heartbeat (those are the bulk, and wait for a fuller batch).
        self.urgent_events = False
        self.acks_queued = False  # a PUBACK (not only heartbeats) waits: the shorter bulk wait applies
        self.batching = EventBatching()
        self._tickets: list[IngestTicket] = []
        self.delivered = 0
        self.deliver_failures = 0
        self._hold_connacks = hold_connacks
        # (client id, broker generation) of vehicle connects whose CONNACK waits: queued, then in the
        # events call in flight, per shard (see events_done)
        self._registering: dict[int, list[tuple[str, int]]] = {}
        self._registering_sent: dict[int, list[tuple[str, int]]] = {}
        self.groups = NodeGroups(self.shards, self._emit, **({"max_groups_per_client": config.fanout.topic_groups_per_client,
                                 "max_window": config.fanout.topic_group_inflight} if config is not None else {}),
                                 filters=durable_filters(config.topics if config is not None else ()))

    def attach(self, broker: Any) -> None:
        """Give the edge its broker (created with this object as ``hooks``).

        With ``hold_connacks``, a vehicle's CONNACK waits until the events call carrying its connect
        returned (:meth:`events_done`): the takeover registry then orders a client id's connects on two
        nodes as the client made them (:mod:`fanout.mqtt.connack_hold` says why that needs the hold).
        """
        self.broker = broker
        # A LocalPublish per publish only while some peer may want it: on a single node it was an event
        # object and a PeerRoutes.forward call per heartbeat for nothing (issue 16)
        self.routes.on_peers = self._peers_changed
        self._peers_changed(bool(self.routes.peers))
        if self._hold_connacks:
            broker.hold_connacks(_reports_to_dispatchers)
        if broker.state.shared is not None:  # MQTT 5 shared groups: one member per message cluster-wide
            self.routes.join_shared(broker.state.shared, lambda: broker.state.now, self._wake)

    def _peers_changed(self, any_peer: bool) -> None:
        self.broker.state.forward = any_peer  # set as routes.on_peers by attach(), once the broker is known

    def claims_shared(self, group: str, inner: str) -> bool:
        """A durable topic's ``$share`` subscription is a consumer group (:mod:`fanout.node.topic_groups`)."""
        return self.groups.claims(group, inner)

    def route_announcement(self, now_ms: int) -> tuple[list[str], list[str], bool, dict[str, int] | None] | None:
        """What to announce to every peer now (:meth:`PeerRoutes.full_announcement`)."""
        return self.routes.full_announcement(now_ms, self.broker.route_filters)

    def events_done(self, shard: int) -> int:
        """The events call taken for ``shard`` returned (or failed for good): the CONNACKs of the
        vehicle connects it carried go out. Returns how many were released."""
        sent = self._registering_sent.pop(shard, None)
        if not sent or self.broker is None:
            return 0
        release = self.broker.release_connack
        return sum(1 for cid, generation in sent if release(cid, generation))

    # -- broker events ---------------------------------------------------------------------------------

    def on_events(self, events: list[Any]) -> None:
        """Translate one broker event batch (called from ``Broker.flush``, in the loop thread)."""
        live = self._live
        out = self._out
        pending = self._pending_shards
        ack = AckEvent.build
        woke = False
        for e in events:
            t = type(e)
            if t is Delivered:
                entry = live.get(e.client_id)
                if entry is not None and type(e.tag) is bytes:
                    sh = entry[2]
                    out[sh].append(ack(e.client_id, entry[1], e.tag))
                    pending.add(sh)
                    self.delivered += 1
                    self.acks_queued = True
                elif entry is not None and type(e.tag) is tuple:
                    self.groups.delivered(e.client_id, entry[1], e.tag)
                    self.acks_queued = True  # a group member's PUBACK commits: the shorter bulk wait applies
            elif t is Heartbeat:
                self._heartbeat(e)
            elif t is LocalPublish:
                if self.routes.forward(e.topic, e.payload, e.qos, e.retain, e.properties):
                    woke = True
            elif t is IngestTicket:
                if e.routed:
                    self._append(e)
                else:
                    self._tickets.append(e)
                woke = True
            elif t is ClientConnected:
                self._connected(e)
            elif t is ClientDisconnected:
                self._disconnected(e)
            elif t is Subscribed:
                self._subscribed(e)
            elif t is Unsubscribed:
                self._unsubscribed(e)
            elif t is DeliveryDropped:
                entry = live.get(e.client_id)
                if entry is not None and type(e.tag) is bytes:
                    self._emit(entry[2], FailedEvent.build(e.client_id, entry[1], e.tag, e.too_large))
                elif entry is not None and type(e.tag) is tuple:
                    self.groups.dropped(e.client_id, entry[1], e.tag, e.too_large)
        if woke or pending:
            self._wake()

    def _emit(self, shard: int, event: tuple) -> None:
        self._out[shard].append(event)
        self._pending_shards.add(shard)
        if event[0] != EV_HEARTBEAT:
            self.urgent_events = True  # presence changes (connect, subscribe, drop) ship at the next tick

    def _covering(self, client_id: str, filters: Any) -> set[str]:
        target = self.topics.filter(client_id)
        return {f for f in filters if filter_covers(f, target)}

    def _connected(self, e: ClientConnected) -> None:
        cid = e.client_id
        gen = self._gens.next()
        shard = shard_of(cid, self.shards)
        # (a) of the trust model: a connection is a vehicle for the dispatchers only when its principal IS the
        # vehicle its client id names (role vehicle, or anonymous in development mode), not because its id
        # looks like a VIN. Other connections never reach the dispatchers: no rows, no takeover registry (so
        # a client squatting a VIN on another node cannot kick the vehicle; takeover stays node-local).
        is_vin = _reports_to_dispatchers(cid, e)  # the event carries the principal's vehicle flag
        self._live[cid] = (e.generation, gen, shard, is_vin)
        self.groups.connected(cid, gen, self.broker.session_of(cid) if e.session_present and self.broker else None)
        if not is_vin:
            self._cover.pop(cid, None)
            return
        subscribed = False
        key: bytes | None = None
        self._cover.pop(cid, None)
        if is_vin and e.session_present:
            s = self.broker.session_of(cid) if self.broker is not None else None
            cover = self._covering(cid, s.subs) if s is not None else set()
            if cover:
                self._cover[cid] = cover
                subscribed = True
            key = next((tag for tag in (*e.resent_tags, *e.queued_tags) if type(tag) is bytes), None)
        self._emit(shard, ConnectEvent.build(cid, gen, e.session_present, subscribed, key))
        if self._hold_connacks:
            self._registering.setdefault(shard, []).append((cid, e.generation))

    def _disconnected(self, e: ClientDisconnected) -> None:
        cid = e.client_id
        entry = self._live.get(cid)
        if entry is None or entry[0] != e.generation:
            return  # an older connection of a client id that already reconnected here
        del self._live[cid]
        self._cover.pop(cid, None)
        self.groups.disconnected(cid, entry[1], self.broker.session_of(cid) if self.broker is not None else None)
        if not e.session_kept:
            self.routes.mark_dirty()
        if entry[3]:
            self._emit(entry[2], DisconnectEvent.build(cid, entry[1]))

    def _subscribed(self, e: Subscribed) -> None:
        self.routes.mark_dirty()
        entry = self._live.get(e.client_id)
        if entry is not None and entry[0] == e.generation:
            self._group_subscribed(e, entry[1])
        if entry is None or entry[0] != e.generation or not entry[3]:
            return
        new = self._covering(e.client_id, (f for f, _q in e.filters))
        if not new:
            return
        have = self._cover.get(e.client_id)
        if have:
            have.update(new)
            return
        self._cover[e.client_id] = new
        self._emit(entry[2], SubscribedEvent.build(e.client_id, entry[1], True, self._wall_us()))

    def _unsubscribed(self, e: Unsubscribed) -> None:
        self.routes.mark_dirty()
        entry = self._live.get(e.client_id)
        if entry is not None and entry[0] == e.generation:
            self.groups.unsubscribed(e.client_id, entry[1], e.filters)
        have = self._cover.get(e.client_id)
        if entry is None or entry[0] != e.generation or not have:
            return
        have.difference_update(e.filters)
        if not have:
            del self._cover[e.client_id]
            self._emit(entry[2], SubscribedEvent.build(e.client_id, entry[1], False, None))

    def _group_subscribed(self, e: Subscribed, generation: int) -> None:
        s = self.broker.session_of(e.client_id) if self.broker is not None else None
        self.groups.subscribed(e.client_id, generation, e.filters, e.user_properties, self.groups.window(s))

    def deliver_groups(self, sends: Sequence[tuple]) -> int:
        """Consumer-group sends of a dispatcher's ``deliver`` call (:meth:`NodeGroups.deliver`)."""
        if self.broker is None:
            for cid, gen, topic, group, partition, offset, *_rest in sends:
                self.groups.dropped(cid, gen, (topic, group, partition, offset), False)
            return 0
        n = self.groups.deliver(self.broker, self.generation_of, sends)
        if self._pending_shards:
            self._wake()  # failed sends became events
        return n

    def _heartbeat(self, e: Heartbeat) -> None:
        cid = e.client_id
        topic = e.topic  # ecp/<VIN>/online or ecp/<VIN>/heartbeat, published by <VIN> itself
        n = len(cid)
        if topic[4:4 + n] != cid or topic[4 + n:] not in _HEARTBEAT_SUFFIXES:
            return
        entry = self._live.get(cid)
        if entry is not None and entry[0] == e.generation and entry[3]:
            self._emit(entry[2], HeartbeatEvent.build(cid, entry[1]))

    # -- queues the actor ships -------------------------------------------------------------------------

    def has_events(self) -> bool:
        """True when some dispatcher has events waiting."""
        return bool(self._pending_shards)

    def pending_events(self) -> int:
        """How many events wait, over every dispatcher."""
        out = self._out
        return sum(len(out[s]) for s in self._pending_shards)

    def events_wait(self, now_s: float) -> float | None:
        """When the queued events are due (:mod:`fanout.node.event_batching`).

        Args:
            now_s: current time (the actor's loop clock).

        Returns:
            None when no event waits, 0.0 when they are due (:meth:`take_events` now), else the seconds
            until they are.
        """
        if not self._pending_shards:
            return None
        return self.batching.wait(now_s, self.urgent_events, self.pending_events, not self.acks_queued)

    def take_events(self, busy: set[int] | frozenset[int] = frozenset(),
                    now_s: float | None = None) -> dict[int, list[tuple]]:
        """Take the queued events of every shard not in ``busy`` (a busy shard keeps accumulating).

        Args:
            busy: shards whose previous batch is still being applied.
            now_s: current time, when the caller follows :meth:`events_wait` (events left behind for a
                busy shard then count as waiting since now).
        """
        taken: dict[int, list[tuple]] = {}
        for shard in list(self._pending_shards):
            if shard in busy:
                continue
            taken[shard] = self._out[shard]
            self._out[shard] = []
            registering = self._registering.pop(shard, None)
            if registering:
                self._registering_sent.setdefault(shard, []).extend(registering)
            self._pending_shards.discard(shard)
        if not self._pending_shards:
            self.urgent_events = False
            self.acks_queued = False
        self.batching.shipped(now_s, bool(self._pending_shards))
        return taken

    def sync_events(self, shard: int) -> list[tuple]:
        """Sync events describing every live connection of ``shard`` (a dispatcher restarted).

        They are put in front of that shard's queue; the queued events that follow are newer.
        """
        sync: list[tuple] = []
        for cid, (_lg, gen, sh, is_vin) in self._live.items():
            if sh != shard or not is_vin:
                continue  # only vehicles are known to the dispatchers (see _connected)
            subscribed = bool(self._cover.get(cid)) if is_vin else False
            key = None
            s = self.broker.session_of(cid) if (is_vin and self.broker is not None) else None
            if s is not None:
                inflight, queued = s.tags()
                key = next((t for t in (*inflight, *queued) if type(t) is bytes), None)
            sync.append(SyncEvent.build(cid, gen, subscribed, key))
        sync.extend(self.groups.sync_joins())  # the consumer-group members it served (fanout.node.topic_groups)
        self._out[shard][:0] = sync
        if self._out[shard]:
            self._pending_shards.add(shard)
            self.urgent_events = self.urgent_events or bool(sync)  # presence: not behind the heartbeat wait
        return sync

    # -- deliveries and kicks from dispatchers ---------------------------------------------------------------

    def apply_deliveries(self, sends: Sequence[tuple], payloads: dict[str, bytes],
                         kicks: Sequence[tuple] = (), props: tuple | None = None) -> list[tuple]:
        """Execute one dispatcher batch.

        Args:
            sends: :class:`fanout.records.Delivery` tuples.
            payloads: ``{data_id: blob}`` for the sends.
            kicks: :class:`fanout.records.Kick` tuples: connections to close (taken over on another node).
            props: the batch's :class:`fanout.records.DeliveryProps` (MQTT 5 properties of its deliveries:
                remaining expiry, the trigger's User Properties, the blob's Content Type), or None.

        Returns:
            A :class:`fanout.records.DeliveryFailure` for every send that was not handed to the session
            (NOT_CONNECTED, NOT_SUBSCRIBED, DROPPED).
        """
        failure = DeliveryFailure.build
        if self.broker is None:  # not started: nothing is connected here yet
            return [failure(vin, gen, key, _NOT_CONNECTED) for vin, gen, key, _rid, _did, _dup in sends]
        if kicks:
            self.kick(kicks)
        deliver = self.broker.deliver
        live = self._live
        cover = self._cover
        topics = self.topics
        head, tail, simple = topics.head, topics.tail, topics.simple
        failures: list[tuple] = []
        props_of = None if props is None else BatchProps(props, self._wall_us() // 1000, self.broker.state.now).of
        for vin, gen, key, request_id, data_id, dup in sends:
            entry = live.get(vin)
            if entry is None or entry[1] != gen or not entry[3]:  # only to the vehicle itself (trust model (a))
                failures.append(failure(vin, gen, key, _NOT_CONNECTED))
                continue
            # The covering filters let the broker skip matching the topic against every filter.
            topic = f"{head}{vin}{tail}{request_id}" if simple else topics.topic(vin, request_id)
            status = deliver(vin, topic, payloads[data_id], 1, key, covering=cover.get(vin), dup=dup,
                             props=None if props_of is None else props_of(request_id, data_id), unique=True)
            if status >= _FAILED_MIN:
                failures.append(failure(vin, gen, key, int(status)))
        self.deliver_failures += len(failures)
        return failures

    def apply_forwards(self, messages: Iterable[tuple]) -> int:
        """Publishes forwarded by a peer (:class:`fanout.records.Forward` tuples), delivered to this node's
        subscribers only (never forwarded again), and to the shared groups the peer placed here only.

        Returns:
            How many local deliveries they made.
        """
        if self.broker is None:
            return 0
        publish = self.broker.publish_local
        return sum(publish(topic, payload, qos, retain, properties=props, groups=groups, plain=plain)
                   for topic, payload, qos, retain, props, groups, plain in messages)

    def kick(self, kicks: Iterable[tuple[str, int | None]]) -> int:
        """Close connections taken over on another node, and drop the fanout messages their sessions keep.

        A dispatcher's kick ``(client_id, generation)`` says the client id now connects on another node: if
        ``generation`` is live here it is closed; unless a newer connection is live here, the fanout
        messages of the session left behind (kept if persistent) are dropped, since their rows are now
        dispatched to the other connection (an acknowledged one would otherwise come again, with DUP=0
        if it was still queued, should the vehicle come back here).

        Args:
            kicks: :class:`fanout.records.Kick` tuples; ``None`` closes whatever is live and drops nothing
                (an operator's kick, not a takeover).

        Returns:
            How many connections were closed.
        """
        n = 0
        for cid, gen in kicks:
            entry = self._live.get(cid)
            if entry is not None and (gen is None or entry[1] == gen):
                if self.broker.kick(cid, "kicked: taken over on another node"):
                    n += 1
                entry = None
            if entry is None and gen is not None and self.broker is not None:
                self._drop_fanout_messages(cid)
        return n

    def _drop_fanout_messages(self, client_id: str) -> int:
        """Remove the messages tagged with a row key from the offline session of ``client_id``."""
        s = self.broker.session_of(client_id)
        if s is None or s.conn is not None:
            return 0
        n = s.drop_where(_is_fanout_message)
        if n:
            log.info("fanout messages of a session left behind dropped", client_id=client_id, messages=n)
        return n

    # -- ingest ---------------------------------------------------------------------------------------

    def has_tickets(self) -> bool:
        """True when intercepted publishes wait for an ingest round."""
        return bool(self._tickets)

    async def process_ingest(self) -> int:
        """Run ingest rounds until no ticket waits; acknowledge or reject each ticket in order.

        Returns:
            The number of tickets processed.
        """
        done = 0
        while self._tickets:
            tickets, self._tickets = self._tickets, []
            outcomes = await self.ingest.run(tickets)
            for t, outcome in zip(tickets, outcomes):
                if outcome is None:
                    self.broker.complete_publish(t.client_id, t.packet_id, t.generation)
                elif isinstance(outcome, Reply):  # a request status or cancel: acknowledged, then answered
                    self.broker.complete_publish(t.client_id, t.packet_id, t.generation)
                    self.broker.publish_local(replies_topic(t.client_id), outcome.payload(), 1)  # the asker is here
                elif isinstance(outcome, dict):  # else "skip"
                    self._reject(t, outcome)
            done += len(tickets)
        return done

    def _reject(self, t: IngestTicket, error: dict[str, Any]) -> None:
        # MQTT 5 (t.properties set): a negative PUBACK with error["reason_code"], no errors topic to forward
        if self.broker.reject_publish(t.client_id, t.packet_id, error, t.generation) and t.properties is None:
            body = {"client_id": t.client_id, "packet_id": t.packet_id, **error}
            payload = json.dumps(body, separators=(",", ":")).encode()
            if self.routes.forward(ERRORS_TOPIC_PREFIX + t.client_id, payload, 1, False):
                self._wake()

    # -- durable topics (fanout.node.topic_appends) ----------------------------------------------------

    def _append(self, ticket: IngestTicket) -> None:
        error = self.appends.add(ticket)
        if error is not None:
            self._reject(ticket, self._for_protocol(ticket, error))
        elif self.appends.settled_waiting:
            self._settle(self.appends.take_settled())

    def set_durable_topics(self, specs: Iterable[Any]) -> bool:
        """The cluster's durable topics (``storage.topics.TopicSpec``) changed; returns True when they did."""
        specs = list(specs)
        self.groups.set_filters(durable_filters(specs))  # their $share subscriptions are consumer groups
        return self.durable.set_specs(specs)

    async def append(self, batch: AppendBatch) -> int:
        """Make one shard's batch durable (one ``topic_append`` call), then acknowledge or refuse its tickets.

        Returns:
            The number of tickets settled.
        """
        failure: BaseException | None = None
        try:
            await self._link.topic_append(batch.shard, batch.items)  # type: ignore[attr-defined]
        except Exception as exc:  # dispatcher gone, store full: refused, never acknowledged
            failure = exc
        return self._settle(self.appends.done(batch, failure))

    def _settle(self, settled: list[tuple[IngestTicket, dict | None]]) -> int:
        for t, error in settled:
            if error is None:
                self.broker.complete_publish(t.client_id, t.packet_id, t.generation)
            else:
                self._reject(t, self._for_protocol(t, error))
        return len(settled)

    @staticmethod
    def _for_protocol(t: IngestTicket, error: dict) -> dict:
        """A 3.1.1 publisher's error body has no MQTT 5 reason code (as ingest's)."""
        return error if t.properties is not None else {k: v for k, v in error.items() if k != "reason_code"}

    # -- introspection -------------------------------------------------------------------------------

    def generation_of(self, client_id: str) -> int | None:
        """Cluster-wide generation of the live connection of ``client_id`` on this node, or None."""
        entry = self._live.get(client_id)
        return None if entry is None else entry[1]

    def stats(self) -> dict[str, Any]:
        """Counters for ``fanout status``."""
        b = self.broker
        return {
            "connections": b.clients_connected if b is not None else 0,
            "sessions": len(b.sessions) if b is not None else 0,
            "subscribed_vehicles": len(self._cover),
            "live_connections": len(self._live),
            "queued_events": self.pending_events(),
            "known_data_ids": self.ingest.known_data_ids,
            "acks": self.delivered,
            "deliver_failures": self.deliver_failures,
            "triggers": self.ingest.triggers_ok,
            "blobs": self.ingest.blobs_ok,
            "rejected": self.ingest.rejected,
            "forwarded": self.routes.forwarded,
            "forwards_dropped": self.routes.dropped,
            **self.appends.stats(),
            **self.groups.stats(),
            **self.routes.shared_stats(),
            "peers": sorted(self.routes.peers),
        }


__all__ = ["NodeCore"]
