"""Counting and logging of the bounds the broker enforces against what clients send.

Strategy: every bound that protects the broker's memory from a client (DESIGN.md: "every buffer, queue and
table a client can grow has a configured bound, counted in ``$SYS`` when hit") has a name in :data:`CAPS`,
mapped to the setting that sizes it. :meth:`CapCounters.hit` counts the hit (published as
``$SYS/broker/limits/<name>``) and logs the first hit of each name per sweep with its details;
:meth:`CapCounters.report`, called once per sweep, logs how many more hits each name had since. A client
hammering one bound therefore costs a counter increment per hit and one log line per second, not a log
line per packet.
"""
from __future__ import annotations

from typing import Any

import structlog

log = structlog.get_logger(__name__)

# name -> the setting that sizes the bound
CAPS: dict[str, str] = {
    "first_packet": "MQTT-3.1.0-1 (the first packet must be CONNECT)",
    "connect_size": "mqtt.max_connect_size",
    "pre_auth_bytes": "mqtt.max_connect_size",
    "topic_levels": "mqtt.max_topic_levels",
    "topic_length": "mqtt.max_topic_length",
    "subscriptions": "mqtt.max_subscriptions_per_client",
    "session_bytes": "mqtt.max_session_bytes",
    "queued_bytes": "mqtt.max_queued_bytes",
    "offline_queued_bytes": "mqtt.offline_queued_fraction",
    "write_buffer": "mqtt.max_write_buffer",
    "retained_messages": "mqtt.max_retained_messages",
    "retained_bytes": "mqtt.max_retained_bytes",
    "tls_handshakes": "mqtt.max_tls_handshakes",
}


class CapCounters:
    """Hits per bound since start, and the rate-limited log of them."""

    __slots__ = ("hits", "_unlogged")

    def __init__(self) -> None:
        self.hits: dict[str, int] = dict.fromkeys(CAPS, 0)
        self._unlogged: dict[str, int] = {}

    def hit(self, name: str, **details: Any) -> None:
        """Count one hit of the bound ``name`` (a key of :data:`CAPS`); log it if it is the first this sweep."""
        self.hits[name] += 1
        n = self._unlogged.get(name)
        if n is None:
            self._unlogged[name] = 0
            log.warning("mqtt limit reached", limit=name, setting=CAPS[name], **details)
        else:
            self._unlogged[name] = n + 1

    def report(self) -> None:
        """Log the hits not logged since the last call (one line per bound), and start a new sweep."""
        for name, n in self._unlogged.items():
            if n:
                log.warning("mqtt limit reached again", limit=name, setting=CAPS[name], times=n, total=self.hits[name])
        self._unlogged.clear()


__all__ = ["CapCounters", "CAPS"]
