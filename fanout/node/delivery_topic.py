"""The delivery topic of a fanout row: ``<topic_prefix with {VIN} replaced>/<request_id>``.

The prefix comes from config (``fanout.topic_prefix``, default :data:`DEFAULT_TOPIC_PREFIX`). A vehicle
receives its rows only while it holds a subscription covering its *delivery filter*
``<prefix with VIN>/+``.
"""
from __future__ import annotations

DEFAULT_TOPIC_PREFIX = "agent/{VIN}/proxy/request"
VIN_PLACEHOLDER = "{VIN}"


class DeliveryTopics:
    """Delivery topics and filters for one prefix.

    The hot path builds ``f"{head}{vin}{tail}{request_id}"`` inline when :attr:`simple` (one ``{VIN}`` in
    the prefix); :meth:`topic` is the general form.

    Args:
        prefix: the topic prefix, ``{VIN}`` standing for the vehicle's level.
    """

    __slots__ = ("prefix", "head", "tail", "simple")

    def __init__(self, prefix: str = DEFAULT_TOPIC_PREFIX) -> None:
        self.prefix = prefix
        head, sep, rest = prefix.partition(VIN_PLACEHOLDER)
        self.head = head
        self.tail = rest + "/"
        self.simple = bool(sep) and VIN_PLACEHOLDER not in rest  # else: str.replace per send

    def topic(self, vin: str, request_id: str) -> str:
        """e.g. ``agent/VIN1/proxy/request/r1``."""
        if self.simple:
            return f"{self.head}{vin}{self.tail}{request_id}"
        return f"{self.prefix.replace(VIN_PLACEHOLDER, vin)}/{request_id}"

    def filter(self, vin: str) -> str:
        """The delivery filter of ``vin``, e.g. ``agent/VIN1/proxy/request/+``."""
        return f"{self.prefix.replace(VIN_PLACEHOLDER, vin)}/+"


__all__ = ["DeliveryTopics", "DEFAULT_TOPIC_PREFIX", "VIN_PLACEHOLDER"]
