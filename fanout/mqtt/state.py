"""The one state object of a broker, shared by the collaborators that make up :class:`Broker`.

Strategy: the broker's behaviour is split by concern into small classes (:mod:`lifecycle`: CONNECT,
takeover, closes, session expiry; :mod:`delivery`: routing and outbound messages; :mod:`inbound`:
client PUBLISH and ingest interception; :mod:`subscriptions`: SUBSCRIBE/UNSUBSCRIBE), each built over
the same :class:`BrokerState`. The state holds every registry and counter and the two output
primitives every concern needs (:meth:`BrokerState.write`, :meth:`BrokerState.emit`); it knows no
protocol rule. A collaborator that needs another one gets it in its constructor, so the dependencies
are explicit and point one way (``broker`` -> ``inbound`` -> ``lifecycle`` -> ``delivery`` -> ``state``;
``subscriptions`` -> ``delivery``), with no module importing the class it is part of.

Output: bytes for a connection are appended to ``conn.out``; the first append registers the connection in
``dirty`` (and the first registration of a flush cycle calls ``wake`` so the adapter schedules
:meth:`Broker.flush`). Events for the hooks go to ``events`` the same way (None without hooks: no event
is built at all).
"""
from __future__ import annotations

from typing import Any, Callable

from .backpressure import ReadPressure
from .caps import CapCounters
from .connack_hold import ConnackHolds
from .connection import Connection
from .deadlines import DeadlineWheel
from .hooks import BrokerHooks
from .retained import RetainedStore
from .session import QueueBudget, Session, SessionLimits
from .settings import MQTTSettings
from .trie import SubscriptionTrie


class BrokerState:
    """Registries, output buffers, hook switches and ``$SYS`` counters of one broker.

    Args:
        settings: the broker's :class:`MQTTSettings`.
        acl: the access-control object (``authenticate``, ``can_publish``, ``can_subscribe``).
        hooks: embedding hooks, or None (then no event is built).
        now_ms: start time on the adapter's clock.
        wake: called when output or events become pending.
        wheel_resolution_ms: granularity of connect-timeout and keepalive deadlines.

    Attributes:
        limits: the bounds every session applies (:class:`SessionLimits`).
        queue_budget: the node-wide bound on queued bytes, shared by every session.
        pressure: the read back-pressure that keeps the queues of connected sessions under that bound.
        sessions: client id -> :class:`Session` (live and offline).
        connections: live connections (accepted, not yet lost).
        trie: subscriptions (filter -> client id -> granted QoS).
        retained: the retained messages.
        offline: client ids of persistent sessions without a connection, oldest disconnect first.
        match_cache: topic -> {client id: granted QoS}, cleared on every subscription change; at most
            ``settings.match_cache_entries`` (see :meth:`fanout.mqtt.delivery.Delivery.match`).
        wheel: connect-timeout and keepalive deadlines.
        dirty: connections with output (or a close) pending for the next flush.
        events: hook events pending for the next flush (None without hooks).
        drops_unreported: sessions whose queue dropped messages since the last log line.
        now: the latest time the adapter reported.
        hooked, ingest_prefix, heartbeat_prefix, forward, error_prefix, durable: the hooks' switches, flattened
            for the per-message path.
        clients_connected ... protocol_errors, v5_connected, expired_dropped, too_large_dropped: ``$SYS``
            counters (see :mod:`sys_stats`).
        shared: the MQTT 5 shared subscriptions.
        caps: hits of the bounds that protect the broker from its clients (see :mod:`caps`).
        holds: connections whose CONNACK waits for the embedding's registration (:mod:`connack_hold`).
    """

    __slots__ = (
        "settings", "acl", "hooks", "limits", "queue_budget", "pressure", "sessions", "connections", "trie", "retained", "offline",
        "match_cache", "wheel", "dirty", "events", "wake", "drops_unreported", "now",
        "hooked", "ingest_prefix", "heartbeat_prefix", "forward", "error_prefix", "durable",
        "clients_connected", "clients_maximum", "msgs_received", "msgs_sent", "pub_received", "pub_sent",
        "pub_dropped", "pub_denied", "bytes_received", "bytes_sent", "subscription_count", "acks_unknown",
        "protocol_errors", "deliveries_denied", "caps", "v5_connected", "expired_dropped", "too_large_dropped",
        "shared", "holds",
    )

    def __init__(self, settings: MQTTSettings, acl: Any, hooks: Any, *, now_ms: int,
                 wake: Callable[[], None], wheel_resolution_ms: int) -> None:
        self.settings = settings
        self.acl = acl
        self.hooks = hooks
        self.limits = SessionLimits.from_settings(settings)
        self.queue_budget = QueueBudget.from_settings(settings)
        self.pressure = ReadPressure.from_settings(self.queue_budget, settings, lambda: self.wake())
        self.sessions: dict[str, Session] = {}
        self.connections: set[Connection] = set()
        self.trie: SubscriptionTrie = SubscriptionTrie()
        self.retained = RetainedStore(settings.max_retained_messages, settings.max_retained_bytes)
        self.offline: dict[str, None] = {}
        self.match_cache: dict[str, dict[str, int]] = {}
        self.wheel = DeadlineWheel(wheel_resolution_ms)
        self.dirty: list[Connection] = []
        self.events: list[Any] | None = [] if hooks is not None else None
        self.wake = wake
        self.drops_unreported: set[Session] = set()
        self.now = now_ms
        self.hooked = hooks is not None
        self.ingest_prefix = hooks.ingest_prefix if hooks is not None and hooks.intercept_ingest else None
        self.heartbeat_prefix = hooks.heartbeat_prefix if hooks is not None and hooks.heartbeat_prefix else None
        self.forward = bool(hooks is not None and hooks.forward_publishes)
        self.durable = hooks.durable_topic if hooks is not None and hooks.append_durable else None
        self.error_prefix = (hooks.ingest_prefix if hooks is not None else BrokerHooks.ingest_prefix) + "errors/"
        self.clients_connected = 0
        self.clients_maximum = 0
        self.msgs_received = 0
        self.msgs_sent = 0
        self.pub_received = 0
        self.pub_sent = 0
        self.pub_dropped = 0
        self.pub_denied = 0
        self.bytes_received = 0
        self.bytes_sent = 0
        self.subscription_count = 0
        self.acks_unknown = 0
        self.protocol_errors = 0
        self.deliveries_denied = 0  # messages the ACL at delivery kept from a matching subscriber
        self.caps = CapCounters()
        self.holds = ConnackHolds()
        self.v5_connected = 0  # MQTT 5 clients among clients_connected
        self.expired_dropped = 0  # MQTT 5 messages not delivered: their Message Expiry Interval passed
        self.too_large_dropped = 0  # MQTT 5 messages not sent: over the receiver's Maximum Packet Size
        self.shared: Any = None  # MQTT 5 shared subscriptions (fanout.mqtt.shared.SharedSubscriptions)

    @property
    def sessions_offline(self) -> int:
        """Persistent sessions without a live connection."""
        return len(self.offline)

    def write(self, conn: Connection, data: bytes) -> None:
        """Queue one encoded packet for ``conn`` (written at the next flush)."""
        out = conn.out
        if not out:
            dirty = self.dirty
            if not dirty:
                self.wake()
            dirty.append(conn)
        out.append(data)
        self.msgs_sent += 1

    def want_flush(self, conn: Connection) -> None:
        """Make the next flush report ``conn`` even without output (the adapter then sees it closed)."""
        if not conn.out:
            if not self.dirty:
                self.wake()
            self.dirty.append(conn)

    def emit(self, event: Any) -> None:
        """Queue one hook event (a no-op without hooks)."""
        events = self.events
        if events is not None:
            if not events and not self.dirty:
                self.wake()
            events.append(event)


__all__ = ["BrokerState"]
