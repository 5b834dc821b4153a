"""The MQTT 5 properties a fanout delivery carries: taken from the platform's publishes at ingest, and built
for the broker core at delivery.

Ingest: a trigger's User Properties (a trace id, a campaign id) go, in order, to every delivery of its request,
and the Content Type of a blob's publish to every delivery of the blob. Both are stored through the replicated
write path (``reqprops``/``blobprops``, :mod:`storage.tables`), so a delivery after a restart or a failover
carries them too. The User Properties of one trigger are bounded (:data:`MAX_USER_PROPERTIES` pairs,
:data:`MAX_USER_PROPERTY_BYTES` bytes of names and values): over either, the trigger is refused as over a bound
(0x97 Quota exceeded for an MQTT 5 platform, field ``user_properties``). A 3.1.1 publish has none.

Delivery: a :class:`fanout.records.DeliveryProps` names, per request of one ``deliver`` batch, its ttl deadline
and its trigger's User Properties, and per blob its Content Type. Thousands of deliveries of a batch share a
few (request, blob) pairs, so each pair's :class:`fanout.mqtt.message5.MsgProps` is built once (its properties
encoded once) and handed to every delivery of the pair. A batch without properties carries None and costs
nothing here.

Clocks: the dispatcher's deadline is wall-clock ms; the broker keeps expiry deadlines on its own clock
(monotonic ms, ``broker.state.now``), so each deadline is moved by the difference of the two clocks, taken
once per batch. The broker then drops a message that expired before it could be sent (also a queued one, and
for an MQTT 3.1.1 vehicle too: its rows are not delivered after the ttl either) and sends an MQTT 5 vehicle
the interval left, in whole seconds rounded up.
"""
from __future__ import annotations

from typing import Any

from fanout.mqtt.message5 import MsgProps
from fanout.mqtt.properties import EMPTY_PROPERTIES, Properties
from fanout.trigger import TriggerError

MAX_USER_PROPERTIES = 32  # User Properties per trigger
MAX_USER_PROPERTY_BYTES = 4096  # UTF-8 bytes of the names and values of one trigger's User Properties

_UNSET = object()


def user_properties_of(properties: Any, request_id: str | None = None) -> tuple[tuple[str, str], ...]:
    """The User Properties of a trigger's publish (``IngestTicket.properties``; None for 3.1.1), in order.

    Raises:
        TriggerError: ``field="user_properties"``, ``over_limit``: more pairs or bytes than the bounds.
    """
    if properties is None or not properties.user_properties:
        return ()
    pairs = properties.user_properties
    if len(pairs) > MAX_USER_PROPERTIES:
        raise TriggerError("user_properties", f"{len(pairs)} user properties, at most {MAX_USER_PROPERTIES}",
                           request_id=request_id, over_limit=True)
    size = sum(len(name.encode()) + len(value.encode()) for name, value in pairs)
    if size > MAX_USER_PROPERTY_BYTES:
        raise TriggerError("user_properties", f"{size} bytes of user properties, at most {MAX_USER_PROPERTY_BYTES}",
                           request_id=request_id, over_limit=True)
    return pairs


def content_type_of(properties: Any) -> str | None:
    """The Content Type of a blob's publish (None without one, or for 3.1.1)."""
    return None if properties is None else properties.content_type


class BatchProps:
    """The :class:`MsgProps` of the deliveries of one batch, one per (request id, data id).

    Args:
        props: the batch's :class:`fanout.records.DeliveryProps` wire tuple.
        wall_now_ms: the wall clock now (the dispatcher's deadlines are on it).
        broker_now_ms: the broker's clock now.
    """

    __slots__ = ("_expires", "_users", "_types", "_offset", "_built")

    def __init__(self, props: tuple, wall_now_ms: int, broker_now_ms: int) -> None:
        self._expires, self._users, self._types = props
        self._offset = broker_now_ms - wall_now_ms
        self._built: dict[tuple[str, str], MsgProps | None] = {}

    def of(self, request_id: str, data_id: str) -> MsgProps | None:
        """The properties of a delivery of ``request_id``'s blob ``data_id`` (None: it has none)."""
        key = (request_id, data_id)
        got: Any = self._built.get(key, _UNSET)
        if got is _UNSET:
            got = self._built[key] = self._build(request_id, data_id)
        return got

    def _build(self, request_id: str, data_id: str) -> MsgProps | None:
        expires = self._expires.get(request_id)
        users = self._users.get(request_id, ())
        content_type = self._types.get(data_id)
        if expires is None and not users and content_type is None:
            return None
        props = (Properties(user_properties=users, content_type=content_type)
                 if users or content_type is not None else EMPTY_PROPERTIES)
        return MsgProps(props, None if expires is None else expires + self._offset)


__all__ = ["BatchProps", "MAX_USER_PROPERTIES", "MAX_USER_PROPERTY_BYTES", "content_type_of", "user_properties_of"]
