"""The records that cross the connection node / dispatcher boundary on the hot path, defined once.

Strategy: every Ray call carries a batch (DESIGN.md "Rules") and its cost is dominated by pickling the
batch. Each record below is ONE ``typing.NamedTuple`` class: its fields are the layout, its docstring the
meaning, and its ``build`` static method the producers' builder. ``build`` returns the *wire form*, a plain
``tuple`` in field order, not an instance: measured here on 2,000 six-field records, a NamedTuple instance
costs 2.3 µs to pickle and 0.83 µs to unpickle against 0.44 and 0.22 µs for a tuple (C pickle calls
``__reduce_ex__`` per instance and the class's Python ``__new__`` to rebuild it), and 0.52 against 0.15 µs
to build: ~2.5 µs per delivery on a ~30 µs path. Consumers unpack the wire form with the full arity in
field order (``vin, generation, row_key, request_id, data_id, dup = send``), or read it with
``Record(*t)`` where speed does not matter; ``tests/unit/test_records.py`` builds every record with its
producer and consumes it with its consumer through :func:`pack_batch`/:func:`unpack_batch`.

ConnectionNode -> Dispatcher ``events(node_id, pack_batch(events))``, one call per dispatcher: the
``*Event`` records, whose first field ``kind`` (``EV_*``) says which.

Dispatcher -> ConnectionNode ``deliver(pack_batch(DeliverBatch))``, one call per node per tick: the
:class:`Delivery` orders, the blobs they name (each once), the :class:`Kick` of connections taken over
on another node and the MQTT 5 properties of the deliveries (:class:`DeliveryProps`, None without any);
the reply lists the :class:`DeliveryFailure` of the sends not handed to a session.

ConnectionNode -> Dispatcher ingest: ``put_blobs([BlobItem])`` and ``ingest([IngestItem])``, where an
ingest item carries the shard's VINs as ONE string joined by :data:`VIN_SEPARATOR` (a million VINs pickle
as one 18 MB string in milliseconds; a list of a million ``str`` takes ~20x longer).

ConnectionNode -> ConnectionNode ``forward(node_id, pack_batch([Forward]))``: publishes for a peer's subscribers.

Both hot calls carry ONE ``bytes`` argument made by :func:`pack_batch` (C ``pickle``): Ray serialises a
list of tuples through msgpack with a cloudpickle fallback per element, which cost ~10-20 % of each
actor's CPU under load; a ``bytes`` argument is copied as is. The receivers accept the unpacked form too
(:func:`unpack_batch` passes anything that is not bytes through).
"""
from __future__ import annotations

import pickle
from typing import Any, NamedTuple

EV_CONNECT = 0
EV_DISCONNECT = 1
EV_SUBSCRIBED = 2
EV_HEARTBEAT = 3
EV_ACK = 4
EV_FAILED = 5
EV_SYNC = 6

VIN_SEPARATOR = "\n"


# -- ConnectionNode -> Dispatcher: events ------------------------------------------------------------------

class ConnectEvent(NamedTuple):
    """A connection of ``client_id`` was accepted on the sending node."""

    kind: int  # EV_CONNECT
    client_id: str
    generation: int  # cluster-wide id of the connection (fanout.generations)
    session_present: bool  # a persistent session was resumed
    subscribed: bool  # the resumed session holds a filter covering the client's delivery topic
    inflight_key: bytes | None  # row key of the resumed session's unacked fanout message

    @staticmethod
    def build(client_id: str, generation: int, session_present: bool, subscribed: bool,
              inflight_key: bytes | None) -> tuple:
        return (EV_CONNECT, client_id, generation, session_present, subscribed, inflight_key)


class DisconnectEvent(NamedTuple):
    """The connection ``generation`` of ``client_id`` closed."""

    kind: int  # EV_DISCONNECT
    client_id: str
    generation: int

    @staticmethod
    def build(client_id: str, generation: int) -> tuple:
        return (EV_DISCONNECT, client_id, generation)


class SubscribedEvent(NamedTuple):
    """The "has a filter covering ``<prefix with VIN>/+``" boolean of a connection changed."""

    kind: int  # EV_SUBSCRIBED
    client_id: str
    generation: int
    subscribed: bool
    at_us: int | None  # the node's wall clock when it became true (rows written after it are sent), else None

    @staticmethod
    def build(client_id: str, generation: int, subscribed: bool, at_us: int | None) -> tuple:
        return (EV_SUBSCRIBED, client_id, generation, subscribed, at_us)


class HeartbeatEvent(NamedTuple):
    """``ecp/<VIN>/online`` or ``ecp/<VIN>/heartbeat`` published by the vehicle itself (a dispatch trigger)."""

    kind: int  # EV_HEARTBEAT
    client_id: str
    generation: int

    @staticmethod
    def build(client_id: str, generation: int) -> tuple:
        return (EV_HEARTBEAT, client_id, generation)


class AckEvent(NamedTuple):
    """PUBACK of the fanout message tagged ``row_key`` (a dispatch trigger)."""

    kind: int  # EV_ACK
    client_id: str
    generation: int
    row_key: bytes

    @staticmethod
    def build(client_id: str, generation: int, row_key: bytes) -> tuple:
        return (EV_ACK, client_id, generation, row_key)


class FailedEvent(NamedTuple):
    """The node dropped the fanout message tagged ``row_key`` (its session queue was full), or it is
    ``too_large`` for the vehicle's MQTT 5 Maximum Packet Size (the row is then discarded)."""

    kind: int  # EV_FAILED
    client_id: str
    generation: int
    row_key: bytes
    too_large: bool

    @staticmethod
    def build(client_id: str, generation: int, row_key: bytes, too_large: bool = False) -> tuple:
        return (EV_FAILED, client_id, generation, row_key, too_large)


class SyncEvent(NamedTuple):
    """A live connection, resent after the dispatcher restarted or failed over; unlike a connect it is
    a dispatch trigger (rows may have arrived meanwhile)."""

    kind: int  # EV_SYNC
    client_id: str
    generation: int
    subscribed: bool
    inflight_key: bytes | None

    @staticmethod
    def build(client_id: str, generation: int, subscribed: bool, inflight_key: bytes | None) -> tuple:
        return (EV_SYNC, client_id, generation, subscribed, inflight_key)


EVENT_RECORDS: dict[int, type] = {
    EV_CONNECT: ConnectEvent, EV_DISCONNECT: DisconnectEvent, EV_SUBSCRIBED: SubscribedEvent,
    EV_HEARTBEAT: HeartbeatEvent, EV_ACK: AckEvent, EV_FAILED: FailedEvent, EV_SYNC: SyncEvent,
}


def read_event(event: tuple) -> Any:
    """The record instance of a wire-form event (for logs, tests and introspection, not the hot path)."""
    return EVENT_RECORDS[event[0]](*event)


# -- Dispatcher -> ConnectionNode: deliveries ---------------------------------------------------------------

class Delivery(NamedTuple):
    """Deliver row ``row_key`` to ``vin`` on its connection ``generation`` as QoS 1."""

    vin: str
    generation: int
    row_key: bytes  # the ids key; it is the message's tag, echoed back in the AckEvent
    request_id: str  # last level of the delivery topic
    data_id: str  # key into DeliverBatch.payloads
    dup: bool  # DUP=1: the row may have reached the vehicle before (fanout.dispatcher.machine)

    @staticmethod
    def build(vin: str, generation: int, row_key: bytes, request_id: str, data_id: str, dup: bool) -> tuple:
        return (vin, generation, row_key, request_id, data_id, dup)


class Kick(NamedTuple):
    """Close connection ``generation`` of ``client_id``: taken over on another node (None: any generation)."""

    client_id: str
    generation: int | None

    @staticmethod
    def build(client_id: str, generation: int | None) -> tuple:
        return (client_id, generation)


class DeliveryProps(NamedTuple):
    """The MQTT 5 properties of the deliveries of one :class:`DeliverBatch`, per request and per blob; only
    the requests and blobs of the batch that have any are listed (the batch carries None when none has)."""

    expires: dict  # {request_id: expires_ms}: wall-clock deadline of the request's ttl (Message Expiry Interval)
    user_properties: dict  # {request_id: ((name, value), ...)}: the trigger's User Properties, in order
    content_types: dict  # {data_id: content type}: the Content Type of the blob's PUBLISH

    @staticmethod
    def build(expires: dict, user_properties: dict, content_types: dict) -> tuple:
        return (expires, user_properties, content_types)


class DeliverBatch(NamedTuple):
    """The argument of one ``deliver`` call."""

    deliveries: list  # Delivery wire tuples, oldest first
    payloads: dict  # {data_id: blob}, each blob once
    kicks: list  # Kick wire tuples
    props: tuple | None  # DeliveryProps wire tuple, None when no delivery of the batch has a property

    @staticmethod
    def build(deliveries: list, payloads: dict, kicks: list, props: tuple | None = None) -> tuple:
        return (deliveries, payloads, kicks, props)


class DeliveryFailure(NamedTuple):
    """A delivery the node did not hand to the connection's session (the reply of ``deliver``)."""

    vin: str
    generation: int
    row_key: bytes
    status: int  # fanout.mqtt.hooks.DeliverStatus: NOT_CONNECTED, NOT_SUBSCRIBED or DROPPED

    @staticmethod
    def build(vin: str, generation: int, row_key: bytes, status: int) -> tuple:
        return (vin, generation, row_key, status)


# -- ConnectionNode -> Dispatcher: ingest -------------------------------------------------------------------

class BlobItem(NamedTuple):
    """One data blob to store on a shard (``put_blobs``)."""

    data_id: str
    blob: bytes
    ts_ms: int
    content_type: str | None  # the MQTT 5 Content Type of the blob's publish, sent with its deliveries

    @staticmethod
    def build(data_id: str, blob: bytes, ts_ms: int, content_type: str | None = None) -> tuple:
        return (data_id, blob, ts_ms, content_type)


CONFLICT_PREFIX = "conflict: "  # an ingest result (error string) for a request id re-used with another data id


class IngestItem(NamedTuple):
    """One trigger's part on a shard (``ingest``); its result is ``{"vins": n}`` or an error string
    (:data:`CONFLICT_PREFIX` + reason for a conflicting re-use of its request id)."""

    request_id: str
    data_id: str
    joined_vins: str  # the shard's VINs, join_vins()
    ts_ms: int  # row time: orders each vehicle's queue
    ttl_ms: int  # the trigger's time to live (0: none): rows not delivered by ts_ms + ttl_ms expire
    user_properties: tuple  # the trigger's MQTT 5 User Properties ((name, value), ...), sent with its deliveries

    @staticmethod
    def build(request_id: str, data_id: str, joined_vins: str, ts_ms: int, ttl_ms: int = 0,
              user_properties: tuple = ()) -> tuple:
        return (request_id, data_id, joined_vins, ts_ms, ttl_ms, user_properties)


# -- ConnectionNode -> ConnectionNode -------------------------------------------------------------------------

class Forward(NamedTuple):
    """A local publish forwarded to a peer node, delivered there to local subscribers only.

    ``properties``: its MQTT 5 properties (``fanout.mqtt.properties.Properties``), None for a 3.1.1 publish.
    ``groups``: the MQTT 5 shared groups (``$share/...`` filters) the sending node placed on the receiver:
    only those of its groups get it (``fanout.mqtt.shared``). ``plain``: False for a forward to those
    groups only (the ordinary subscribers get the message through its plain forward, if any).
    """

    topic: str
    payload: bytes
    qos: int
    retain: bool
    properties: Any
    groups: tuple[str, ...] = ()
    plain: bool = True

    @staticmethod
    def build(topic: str, payload: bytes, qos: int, retain: bool, properties: Any = None,
              groups: tuple[str, ...] = (), plain: bool = True) -> tuple:
        return (topic, payload, qos, retain, properties, groups, plain)


WIRE_RECORDS: tuple[type, ...] = (
    *EVENT_RECORDS.values(), Delivery, Kick, DeliveryProps, DeliverBatch, DeliveryFailure, BlobItem, IngestItem, Forward,
)


# -- packing ------------------------------------------------------------------------------------------------

def join_vins(vins: list[str]) -> str:
    """One string for a VIN list (VINs never contain the separator; see ``storage.keys.VIN_RE``)."""
    return VIN_SEPARATOR.join(vins)


def split_vins(joined: str) -> list[str]:
    """Inverse of :func:`join_vins` (an empty string is an empty list)."""
    return joined.split(VIN_SEPARATOR) if joined else []


def pack_batch(obj: object) -> bytes:
    """One ``bytes`` for a hot-path batch (tuples of str/bytes/int/bool/None; pickled at C speed)."""
    return pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)


def unpack_batch(data: object) -> Any:
    """Inverse of :func:`pack_batch`; anything that is not bytes is returned unchanged."""
    if isinstance(data, (bytes, bytearray, memoryview)):
        return pickle.loads(data)
    return data


__all__ = [
    "EV_CONNECT", "EV_DISCONNECT", "EV_SUBSCRIBED", "EV_HEARTBEAT", "EV_ACK", "EV_FAILED", "EV_SYNC",
    "ConnectEvent", "DisconnectEvent", "SubscribedEvent", "HeartbeatEvent", "AckEvent", "FailedEvent", "SyncEvent",
    "EVENT_RECORDS", "read_event", "Delivery", "Kick", "DeliveryProps", "DeliverBatch", "DeliveryFailure", "BlobItem", "IngestItem",
    "CONFLICT_PREFIX",
    "Forward", "WIRE_RECORDS", "VIN_SEPARATOR", "join_vins", "split_vins", "pack_batch", "unpack_batch",
]
