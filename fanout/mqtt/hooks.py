"""Hooks that let the fanout layer (the Ray ``ConnectionNode``) embed the broker core.

Strategy: the broker stays a plain MQTT broker; the embedding layer subclasses :class:`BrokerHooks` and receives
*batches* of small event objects (:mod:`fanout.mqtt.events`), never one call per message (an actor call costs
milliseconds, a delivery must cost microseconds). The broker appends events to a list while it processes input
and hands the whole list to :meth:`BrokerHooks.on_events` when its output is flushed (once per event-loop
iteration in the asyncio adapter). The calls going the other way are methods of
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

from enum import IntEnum
from typing import Any

from .events import (ClientConnected, ClientDisconnected, Delivered, DeliveryDropped, Heartbeat, IngestTicket,
                     LocalPublish, Subscribed, Unsubscribed)


class DeliverStatus(IntEnum):
    """Result of :meth:`Broker.deliver`."""

    SENT = 0  # written to the connection (QoS 1/2: now in flight, a Delivered event follows its ack)
    QUEUED = 1  # connected, but the inflight window is full: queued in the session, sent in order
    NOT_CONNECTED = 2  # no live connection for that client id: nothing was done
    NOT_SUBSCRIBED = 3  # connected, but no subscription of the client matches the topic
    DROPPED = 4  # the session queue was full and its policy (offline_drop = newest) dropped this one
    TOO_LARGE = 5  # over the MQTT 5 client's Maximum Packet Size: not sent, and never will be on this connection


Event = Any  # one of the classes of fanout.mqtt.events (re-exported here)

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
]
