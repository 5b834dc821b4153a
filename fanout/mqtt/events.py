"""The events the broker core hands its hooks (:meth:`fanout.mqtt.hooks.BrokerHooks.on_events`), one class each.

Strategy: plain classes with an ``__init__`` of their own, compiled with the hot path
(:mod:`fanout.native`): the broker builds one per delivery acknowledgement, heartbeat, durable append and presence
change, and a compiled constructor is a C call where a frozen dataclass's (or the ``packets.unchecked`` builder
they had before) is interpreted code setting each field in turn; mypyc keeps a dataclass's generated ``__init__``
interpreted. Values, not records to mutate: equal when of the same class with equal fields, hashable, a
dataclass-like ``repr`` (:class:`_Event`); nothing assigns to an event after the broker built it.
:mod:`fanout.mqtt.hooks` re-exports every class for embeddings and tests; the broker's own compiled modules import
them from here, which is what lets mypyc build them with a direct native call.
"""
from __future__ import annotations

from typing import Any, ClassVar, Hashable


class _Event:
    """Value semantics over ``FIELDS`` (each subclass's attributes, in constructor order).

    No ``__slots__``: mypyc lays out a native class's attributes itself and takes ``__slots__`` out of the class
    body, so ``FIELDS`` is the one list of names; the Python sources (``FANOUT_NATIVE=0``) then carry a ``__dict__``.
    """

    FIELDS: ClassVar[tuple[str, ...]] = ()

    def values(self) -> tuple:
        """The fields' values, in ``FIELDS`` order."""
        return tuple([getattr(self, name) for name in self.FIELDS])

    def __eq__(self, other: object) -> bool:
        return type(other) is type(self) and isinstance(other, _Event) and self.values() == other.values()

    def __hash__(self) -> int:
        return hash((type(self).__name__, self.values()))

    def __repr__(self) -> str:
        shown = ", ".join([f"{name}={getattr(self, name)!r}" for name in self.FIELDS])
        return f"{type(self).__name__}({shown})"

    def __reduce__(self) -> tuple:
        # pickle and copy rebuild through __init__: a compiled class's default reduce calls it without arguments
        return (type(self), self.values())


class ClientConnected(_Event):
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

    FIELDS: ClassVar[tuple[str, ...]] = ("client_id", "generation", "session_present", "username", "role",
                                         "resent_tags", "queued_tags", "vehicle")

    def __init__(self, client_id: str, generation: int, session_present: bool, username: str | None, role: str,
                 resent_tags: tuple[Hashable, ...] = (), queued_tags: tuple[Hashable, ...] = (),
                 vehicle: bool = False) -> None:
        self.client_id = client_id
        self.generation = generation
        self.session_present = session_present
        self.username = username
        self.role = role
        self.resent_tags = resent_tags
        self.queued_tags = queued_tags
        self.vehicle = vehicle


class ClientDisconnected(_Event):
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

    FIELDS: ClassVar[tuple[str, ...]] = ("client_id", "generation", "reason", "will_published", "session_kept",
                                         "unacked_tags")

    def __init__(self, client_id: str, generation: int, reason: str, will_published: bool, session_kept: bool,
                 unacked_tags: tuple[Hashable, ...] = ()) -> None:
        self.client_id = client_id
        self.generation = generation
        self.reason = reason
        self.will_published = will_published
        self.session_kept = session_kept
        self.unacked_tags = unacked_tags


class Subscribed(_Event):
    """Filters granted by one SUBSCRIBE (refused ones, SUBACK 0x80, are not listed); ``user_properties``:
    the MQTT 5 SUBSCRIBE's User Properties ((name, value) pairs)."""

    FIELDS: ClassVar[tuple[str, ...]] = ("client_id", "generation", "filters", "user_properties")

    def __init__(self, client_id: str, generation: int, filters: tuple[tuple[str, int], ...],
                 user_properties: tuple[tuple[str, str], ...] = ()) -> None:
        self.client_id = client_id
        self.generation = generation
        self.filters = filters
        self.user_properties = user_properties


class Unsubscribed(_Event):
    """Filters removed by one UNSUBSCRIBE (only those the client had)."""

    FIELDS: ClassVar[tuple[str, ...]] = ("client_id", "generation", "filters")

    def __init__(self, client_id: str, generation: int, filters: tuple[str, ...]) -> None:
        self.client_id = client_id
        self.generation = generation
        self.filters = filters


class Heartbeat(_Event):
    """An accepted PUBLISH on a topic under :attr:`BrokerHooks.heartbeat_prefix` (``ecp/<VIN>/...``)."""

    FIELDS: ClassVar[tuple[str, ...]] = ("client_id", "generation", "topic", "payload")

    def __init__(self, client_id: str, generation: int, topic: str, payload: bytes) -> None:
        self.client_id = client_id
        self.generation = generation
        self.topic = topic
        self.payload = payload


class Delivered(_Event):
    """A message given to :meth:`Broker.deliver` with a tag was acknowledged.

    ``qos`` is the QoS it was delivered at: 1 (PUBACK received), 2 (PUBCOMP received) or 0 (the
    client's subscription granted QoS 0, so the message counts as delivered when written).
    """

    FIELDS: ClassVar[tuple[str, ...]] = ("client_id", "tag", "qos")

    def __init__(self, client_id: str, tag: Hashable, qos: int) -> None:
        self.client_id = client_id
        self.tag = tag
        self.qos = qos


class DeliveryDropped(_Event):
    """A tagged message given to :meth:`Broker.deliver` was dropped: by a full session queue, expired, or
    ``too_large`` for the client's Maximum Packet Size (MQTT 5; it will never fit that connection)."""

    FIELDS: ClassVar[tuple[str, ...]] = ("client_id", "tag", "too_large")

    def __init__(self, client_id: str, tag: Hashable, too_large: bool = False) -> None:
        self.client_id = client_id
        self.tag = tag
        self.too_large = too_large


class IngestTicket(_Event):
    """An intercepted PUBLISH under :attr:`BrokerHooks.ingest_prefix` awaiting a durable write.

    The broker has neither routed nor acknowledged it. Call
    ``broker.complete_publish(t.client_id, t.packet_id, t.generation)`` once the write is durable
    (sends PUBACK for QoS 1, PUBREC for QoS 2, nothing for QoS 0), or
    ``broker.reject_publish(t.client_id, t.packet_id, error, t.generation)``.

    ``properties``: the MQTT 5 properties of the PUBLISH (``fanout.mqtt.properties.Properties``: Message
    Expiry Interval, User Properties, Content Type, ...), None from a 3.1.1 client.
    """

    FIELDS: ClassVar[tuple[str, ...]] = ("client_id", "generation", "packet_id", "topic", "payload", "qos", "retain",
                                         "dup", "properties", "routed")

    def __init__(self, client_id: str, generation: int, packet_id: int | None, topic: str, payload: bytes, qos: int,
                 retain: bool, dup: bool, properties: Any = None, routed: bool = False) -> None:
        self.client_id = client_id
        self.generation = generation
        self.packet_id = packet_id
        self.topic = topic
        self.payload = payload
        self.qos = qos
        self.retain = retain
        self.dup = dup
        self.properties = properties
        self.routed = routed  # a publish on a durable topic (BrokerHooks.durable_topic): already routed live


class LocalPublish(_Event):
    """A PUBLISH accepted from a local client (or a will), for forwarding to other nodes.

    Only emitted when :attr:`BrokerHooks.forward_publishes` is True. ``properties``: the MQTT 5 properties
    to forward with it (``fanout.mqtt.properties.Properties``, Message Expiry Interval as received, no Topic
    Alias), None for a 3.1.1 publish; pass them to the other node's ``publish_local(..., properties=...)``.
    """

    FIELDS: ClassVar[tuple[str, ...]] = ("client_id", "topic", "payload", "qos", "retain", "properties")

    def __init__(self, client_id: str | None, topic: str, payload: bytes, qos: int, retain: bool,
                 properties: Any = None) -> None:
        self.client_id = client_id
        self.topic = topic
        self.payload = payload
        self.qos = qos
        self.retain = retain
        self.properties = properties


__all__ = ["ClientConnected", "ClientDisconnected", "Subscribed", "Unsubscribed", "Heartbeat", "Delivered",
           "DeliveryDropped", "IngestTicket", "LocalPublish"]
