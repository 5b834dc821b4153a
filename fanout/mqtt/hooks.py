"""Hooks that let the fanout layer (the Ray ``ConnectionNode``) embed the broker core.

Strategy: the broker stays a plain MQTT broker; the embedding layer subclasses :class:`BrokerHooks` and
receives *batches* of small frozen event objects, never one call per message (an actor call costs
milliseconds, a delivery must cost microseconds). The broker appends events to a list while it processes
input and hands the whole list to :meth:`BrokerHooks.on_events` when its output is flushed (once per
event-loop iteration in the asyncio adapter). The calls going the other way are methods of
:class:`fanout.mqtt.broker.Broker`:

- ``complete_publish(client_id, packet_id, generation)`` / ``reject_publish(...)`` for a deferred
  acknowledgement of an intercepted ``$SDV-FANOUT/...`` publish (:class:`IngestTicket`);
- ``deliver(client_id, topic, payload, qos, tag)`` -> :class:`DeliverStatus`, acknowledged later by a
  :class:`Delivered` event carrying the tag;
- ``publish_local(topic, payload, qos, retain)`` for messages forwarded from other nodes;
- ``route_filters()`` (distinct subscription filters) and ``kick(client_id, reason)`` (takeover on
  another node).

Without hooks (``hooks=None``) the broker builds no events at all.
"""
from __future__ import annotations

from dataclasses import dataclass
from enum import IntEnum
from typing import Any, Hashable

from .packets import unchecked


class DeliverStatus(IntEnum):
    """Result of :meth:`Broker.deliver`."""

    SENT = 0  # written to the connection (QoS 1/2: now in flight, a Delivered event follows its ack)
    QUEUED = 1  # connected, but the inflight window is full: queued in the session, sent in order
    NOT_CONNECTED = 2  # no live connection for that client id: nothing was done
    NOT_SUBSCRIBED = 3  # connected, but no subscription of the client matches the topic
    DROPPED = 4  # the session queue was full and its policy (offline_drop = newest) dropped this one
    TOO_LARGE = 5  # over the MQTT 5 client's Maximum Packet Size: not sent, and never will be on this connection


@dataclass(frozen=True, slots=True)
class ClientConnected:
    """A CONNECT was accepted (after the CONNACK was queued).

    Attributes:
        client_id: the client identifier (the assigned one for a zero-length id).
        generation: a number unique per accepted connection in this broker (increasing); pass it back
            to :meth:`Broker.complete_publish` to ignore tickets of an older connection.
        session_present: True when a persistent session was resumed.
        username: authenticated user name, None for anonymous clients.
        role: ``platform``, ``vehicle``, ``client`` or ``admin``.
        resent_tags: tags of messages given to :meth:`Broker.deliver` that were unacknowledged and have
            just been resent with DUP=1 (QoS 1/2) on this resumed session.
        queued_tags: tags still waiting in the session queue (sent as the inflight window frees).
        vehicle: the principal IS the vehicle its client id names (``Principal.vehicle``); only such a
            connection may be served fanout messages.
    """

    client_id: str
    generation: int
    session_present: bool
    username: str | None
    role: str
    resent_tags: tuple[Hashable, ...] = ()
    queued_tags: tuple[Hashable, ...] = ()
    vehicle: bool = False


@dataclass(frozen=True, slots=True)
class ClientDisconnected:
    """A connection whose CONNECT had been accepted is gone.

    Attributes:
        client_id: the client identifier.
        generation: the generation from the matching :class:`ClientConnected`.
        reason: ``disconnect`` (client sent DISCONNECT), ``connection lost``, ``keepalive timeout``,
            ``takeover``, ``protocol error: ...``, ``rejected``, ``kicked: ...``, ``shutdown``.
        will_published: whether the will message was published.
        session_kept: True when the persistent session stays (offline queueing continues).
        unacked_tags: tags of delivered-but-unacknowledged or queued messages still held by the kept
            session (empty when the session was discarded).
    """

    client_id: str
    generation: int
    reason: str
    will_published: bool
    session_kept: bool
    unacked_tags: tuple[Hashable, ...] = ()


@dataclass(frozen=True, slots=True)
class Subscribed:
    """Filters granted by one SUBSCRIBE (refused ones, SUBACK 0x80, are not listed); ``user_properties``:
    the MQTT 5 SUBSCRIBE's User Properties ((name, value) pairs)."""

    client_id: str
    generation: int
    filters: tuple[tuple[str, int], ...]
    user_properties: tuple[tuple[str, str], ...] = ()


@dataclass(frozen=True, slots=True)
class Unsubscribed:
    """Filters removed by one UNSUBSCRIBE (only those the client had)."""

    client_id: str
    generation: int
    filters: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class Heartbeat:
    """An accepted PUBLISH on a topic under :attr:`BrokerHooks.heartbeat_prefix` (``ecp/<VIN>/...``)."""

    client_id: str
    generation: int
    topic: str
    payload: bytes


@dataclass(frozen=True, slots=True)
class Delivered:
    """A message given to :meth:`Broker.deliver` with a tag was acknowledged.

    ``qos`` is the QoS it was delivered at: 1 (PUBACK received), 2 (PUBCOMP received) or 0 (the
    client's subscription granted QoS 0, so the message counts as delivered when written).
    """

    client_id: str
    tag: Hashable
    qos: int


@dataclass(frozen=True, slots=True)
class DeliveryDropped:
    """A tagged message given to :meth:`Broker.deliver` was dropped: by a full session queue, expired, or
    ``too_large`` for the client's Maximum Packet Size (MQTT 5; it will never fit that connection)."""

    client_id: str
    tag: Hashable
    too_large: bool = False


@dataclass(frozen=True, slots=True)
class IngestTicket:
    """An intercepted PUBLISH under :attr:`BrokerHooks.ingest_prefix` awaiting a durable write.

    The broker has neither routed nor acknowledged it. Call
    ``broker.complete_publish(t.client_id, t.packet_id, t.generation)`` once the write is durable
    (sends PUBACK for QoS 1, PUBREC for QoS 2, nothing for QoS 0), or
    ``broker.reject_publish(t.client_id, t.packet_id, error, t.generation)``.

    ``properties``: the MQTT 5 properties of the PUBLISH (``fanout.mqtt.properties.Properties``: Message
    Expiry Interval, User Properties, Content Type, ...), None from a 3.1.1 client.
    """

    client_id: str
    generation: int
    packet_id: int | None
    topic: str
    payload: bytes
    qos: int
    retain: bool
    dup: bool
    properties: Any = None
    routed: bool = False  # a publish on a durable topic (BrokerHooks.durable_topic): already routed live


@dataclass(frozen=True, slots=True)
class LocalPublish:
    """A PUBLISH accepted from a local client (or a will), for forwarding to other nodes.

    Only emitted when :attr:`BrokerHooks.forward_publishes` is True. ``properties``: the MQTT 5 properties
    to forward with it (``fanout.mqtt.properties.Properties``, Message Expiry Interval as received, no Topic
    Alias), None for a 3.1.1 publish; pass them to the other node's ``publish_local(..., properties=...)``.
    """

    client_id: str | None
    topic: str
    payload: bytes
    qos: int
    retain: bool
    properties: Any = None


Event = Any  # one of the dataclasses above

# Constructors of the events the broker makes per message (a delivery's PUBACK, a heartbeat, a durable append, a
# forwarded publish) and per connection (connect, subscribe, disconnect), every field positional. A frozen
# dataclass's ``__init__`` sets each field through ``object.__setattr__``: ~0.55 against ~0.3 us for a Delivered
# (the broker's own values need no checks).
new_delivered = unchecked(Delivered)
new_heartbeat = unchecked(Heartbeat)
new_ingest_ticket = unchecked(IngestTicket)
new_local_publish = unchecked(LocalPublish)
new_client_connected = unchecked(ClientConnected)
new_client_disconnected = unchecked(ClientDisconnected)
new_subscribed = unchecked(Subscribed)


class BrokerHooks:
    """No-op hooks; subclass and override what the embedding layer needs.

    Attributes:
        intercept_ingest: when True, PUBLISH packets whose topic starts with :attr:`ingest_prefix`
            become :class:`IngestTicket` events (not routed, acknowledged later); when False they are
            routed like any other topic (the ACL still decides who may publish there).
        ingest_prefix: topic prefix of ingest publishes.
        heartbeat_prefix: topic prefix whose publishes also produce a :class:`Heartbeat` event.
        forward_publishes: emit a :class:`LocalPublish` per accepted publish (cluster forwarding). The
            embedding may switch it at run time through ``BrokerState.forward`` (a cluster node does so with
            its peers: alone, it has nobody to forward to).
        append_durable: ask :meth:`durable_topic` about every accepted publish outside the ingest prefix; a
            durable one is routed as usual but acknowledged only later, through an :class:`IngestTicket` with
            ``routed=True`` (``complete_publish`` / ``reject_publish``), once the embedding appended it.
    """

    intercept_ingest: bool = False
    ingest_prefix: str = "$SDV-FANOUT/"
    heartbeat_prefix: str = "ecp/"
    forward_publishes: bool = False
    append_durable: bool = False

    def durable_topic(self, topic: str) -> bool:
        """Whether a publish on ``topic`` goes to a durable topic's log (only asked with :attr:`append_durable`)."""
        return False

    def claims_shared(self, group: str, inner: str) -> bool:
        """True when the embedding serves the shared subscription ``$share/<group>/<inner>`` itself (a durable
        topic's consumer group): the broker grants it (ACL and bounds on ``inner``) and reports it in
        :class:`Subscribed`, but routes it no live message; the embedding delivers with
        ``deliver(..., require_subscription=False)``. Asked for MQTT 3.1.1 and 5 SUBSCRIBEs."""
        return False

    def on_events(self, events: list[Event]) -> None:
        """Receive a batch of events in the order they happened.

        Called from :meth:`Broker.flush` (in the event loop thread); must not block. The list is the
        caller's to keep.

        Args:
            events: :class:`ClientConnected`, :class:`ClientDisconnected`, :class:`Subscribed`,
                :class:`Unsubscribed`, :class:`Heartbeat`, :class:`Delivered`, :class:`DeliveryDropped`,
                :class:`IngestTicket`,
                :class:`LocalPublish` instances.
        """


class RecordingHooks(BrokerHooks):
    """Hooks that keep every event in :attr:`events` (tests and simple embeddings)."""

    def __init__(self, *, intercept_ingest: bool = False, forward_publishes: bool = False) -> None:
        self.intercept_ingest = intercept_ingest
        self.forward_publishes = forward_publishes
        self.events: list[Event] = []

    def on_events(self, events: list[Event]) -> None:
        self.events.extend(events)

    def take(self, kind: type | None = None) -> list[Event]:
        """Return and forget the recorded events (only those of ``kind`` when given; others stay)."""
        if kind is None:
            out, self.events = self.events, []
            return out
        out = [e for e in self.events if type(e) is kind]
        self.events = [e for e in self.events if type(e) is not kind]
        return out


__all__ = [
    "BrokerHooks", "RecordingHooks", "DeliverStatus", "ClientConnected", "ClientDisconnected", "Subscribed",
    "Unsubscribed", "Heartbeat", "Delivered", "DeliveryDropped", "IngestTicket", "LocalPublish", "Event",
    "new_delivered", "new_heartbeat", "new_ingest_ticket", "new_local_publish", "new_client_connected",
    "new_client_disconnected", "new_subscribed",
]
