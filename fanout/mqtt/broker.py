"""The MQTT 3.1.1 broker core: events in, ``(connection, bytes)`` pairs out; never touches a socket.

Strategy: an I/O adapter (:mod:`fanout.mqtt.aio`, or a test) reports what happened -
:meth:`Broker.connection_made`, :meth:`Broker.data_received`, :meth:`Broker.connection_lost`,
:meth:`Broker.tick` (about once per second) - always passing ``now_ms`` from its monotonic clock. The
broker decodes, applies MQTT semantics and appends the bytes to send to ``conn.out``; the adapter calls
:meth:`Broker.flush` (scheduled through the ``on_output`` callback, once per loop iteration) and writes
each returned ``(connection, bytes)`` pair, closing the transport when ``conn.state >= CLOSED``.

What lives where: adapter entry points, packet dispatch, timeouts (a timing wheel, :mod:`deadlines`)
and SUBSCRIBE/UNSUBSCRIBE here; CONNECT, takeover, closes and the session registry in
:mod:`lifecycle`; the per-message publish flow and the embedding API in :mod:`routing`; per-client
state in :mod:`session`; packet order in :mod:`connection`; retained messages in :mod:`retained`;
``$SYS`` in :mod:`sys_stats`; the event types in :mod:`hooks`.

Decisions (see also the README):

- Takeover: a CONNECT with the client id of a live connection closes the *old* connection, and the
  old connection's will IS published - its network connection ended without a DISCONNECT
  (MQTT-3.1.2-8), as Mosquitto does. More than ``mqtt.takeover_limit`` takeovers of one client id within
  ``mqtt.takeover_window_ms`` refuse the newcomer with CONNACK 0x03 (server unavailable) and keep
  the current connection, which stops two devices sharing an id from flapping forever.
- Shutdown (:meth:`Broker.shutdown`): wills are NOT published by default. A clean stop is not a client
  failure; every local subscriber is disconnected in the same instant, so a will would reach nobody,
  and the in-memory retained store dies with the process; in a cluster a rolling restart would
  otherwise announce every vehicle as failed. ``publish_wills=True`` is available.
- A PUBLISH the ACL refuses is still acknowledged (QoS 1/2) but not delivered, counted and logged once
  per connection and topic.
- Authentication with a user name may take a PBKDF2 run (~0.3 s): with ``defer_auth`` the adapter runs
  it off the loop and calls :meth:`Broker.auth_done`; packets that arrive meanwhile are held.
"""
from __future__ import annotations

from typing import Any, Callable

import structlog

from .connection import CONNECTED, CONNECTING, ERROR, Connection
from .deadlines import DeadlineWheel
from .errors import ProtocolError
from .hooks import BrokerHooks, Subscribed, Unsubscribed
from .packets import (
    CONNACK_SERVER_UNAVAILABLE, PINGRESP_BYTES, SUBACK_FAILURE,
    Connack, Connect, Disconnect, Pingreq, Pingresp, Puback, Pubcomp, Publish, Pubrec, Pubrel, Suback, Subscribe,
    Unsuback, Unsubscribe,
)
from .codec import encode_suback, encode_unsuback
from .lifecycle import Lifecycle
from .retained import RetainedStore
from .routing import Routing
from .session import Session, SessionLimits
from .sys_stats import SysStats
from .topics import InvalidTopic, validate_topic_filter
from .trie import SubscriptionTrie

log = structlog.get_logger(__name__)

MAX_HELD_PACKETS = 1000  # packets held while an authentication runs before the client is dropped
AuthFn = Callable[[], Any]


class Broker(Lifecycle, Routing):
    """One node's MQTT broker state.

    Args:
        config: the loaded :class:`fanout.config.Config` (``[mqtt]`` is used).
        acl: an :class:`fanout.mqtt.auth.AccessControl` (``authenticate``, ``can_publish``,
            ``can_subscribe``).
        hooks: embedding hooks (:class:`BrokerHooks`); None builds no events.
        now_ms: start time on the adapter's clock.
        defer_auth: ``(conn, fn)`` callback; when given, authentications of CONNECTs with a user name
            are handed to it, and it must arrange ``broker.auth_done(conn, fn(), now_ms)`` (or pass the
            exception instead of the result) later. None authenticates inline.
        on_output: called (no arguments) when output or events become pending; the adapter schedules
            :meth:`flush` from it.
        wheel_resolution_ms: granularity of connect-timeout and keepalive deadlines.
    """

    def __init__(self, config: Any, acl: Any, hooks: BrokerHooks | None = None, *, now_ms: int = 0,
                 defer_auth: Callable[[Connection, AuthFn], None] | None = None,
                 on_output: Callable[[], None] | None = None, wheel_resolution_ms: int = 1000) -> None:
        m = config.mqtt
        self.config = config
        self.acl = acl
        self.hooks = hooks
        self.limits = SessionLimits.from_config(m)
        self._max_packet = m.max_packet_size_bytes
        # Ingest triggers name up to fanout.max_batch VINs (~20 bytes each in JSON), far more than the
        # per-client limit; only authenticated platform/admin connections get the larger limit.
        self._max_platform_packet = max(m.max_packet_size_bytes, m.max_platform_packet_size_bytes)
        self._connect_timeout = m.connect_timeout_ms
        self._max_connections = m.max_connections
        self._max_sessions = m.max_sessions
        self._session_expiry = m.session_expiry_ms
        self._takeover_window = m.takeover_window_ms
        self._takeover_limit = m.takeover_limit
        self._defer_auth = defer_auth
        self._wake: Callable[[], None] = on_output or (lambda: None)
        self._log = log
        self._now = now_ms
        # registries
        self.sessions: dict[str, Session] = {}
        self.connections: set[Connection] = set()
        self.trie = SubscriptionTrie()
        self.retained = RetainedStore()
        self._offline: dict[str, None] = {}  # persistent sessions without connection, oldest first
        self._takeovers: dict[str, list[int]] = {}  # client id -> [window start, count]
        self._match_cache: dict[str, dict[str, int]] = {}
        self._wheel = DeadlineWheel(wheel_resolution_ms)
        self._dirty: list[Connection] = []
        self._drops_unreported: set[Session] = set()
        self._generation = 0
        # hooks, flattened for the hot path
        self._events: list[Any] | None = [] if hooks is not None else None
        self._hooked = hooks is not None
        self._ingest_prefix = hooks.ingest_prefix if hooks is not None and hooks.intercept_ingest else None
        self._hb_prefix = hooks.heartbeat_prefix if hooks is not None and hooks.heartbeat_prefix else None
        self._forward = bool(hooks is not None and hooks.forward_publishes)
        self._error_prefix = (hooks.ingest_prefix if hooks is not None else BrokerHooks.ingest_prefix) + "errors/"
        # counters ($SYS)
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
        self.sys = SysStats(self, m.sys_interval_ms, now_ms)
        self._handlers: dict[type, Callable[[Connection, Any], None]] = {
            Publish: self._on_publish, Puback: self._on_puback, Pubrec: self._on_pubrec,
            Pubrel: self._on_pubrel, Pubcomp: self._on_pubcomp, Subscribe: self._on_subscribe,
            Unsubscribe: self._on_unsubscribe, Pingreq: self._on_pingreq, Disconnect: self._on_disconnect,
            Connect: self._on_second_connect,
            # server-to-client packets from a client are protocol violations (section 2.2.1)
            Connack: self._on_bad_packet, Suback: self._on_bad_packet, Unsuback: self._on_bad_packet,
            Pingresp: self._on_bad_packet,
        }

    @property
    def sessions_offline(self) -> int:
        """Persistent sessions without a live connection."""
        return len(self._offline)

    def set_output_callback(self, fn: Callable[[], None]) -> None:
        """Set the callable invoked when output or events become pending."""
        self._wake = fn

    # -- adapter entry points ----------------------------------------------------------------

    def connection_made(self, now_ms: int, peer: Any = None) -> Connection:
        """A network connection was accepted; returns its :class:`Connection` (set ``.transport``)."""
        self._now = now_ms
        conn = Connection(self._max_packet, now_ms, peer)
        self.connections.add(conn)
        self._wheel.schedule(conn, now_ms + self._connect_timeout)
        return conn

    def data_received(self, conn: Connection, data: bytes, now_ms: int) -> None:
        """Bytes arrived on ``conn``: decode and handle every complete packet."""
        self._now = now_ms
        conn.last_rx_ms = now_ms
        self.bytes_received += len(data)
        if conn.state is CONNECTED and conn.held is None:
            # Fast path: the reader directly (Connection.receive_data adds a frame and an order check
            # whose only remaining rule, "no second CONNECT", the handler table enforces here).
            try:
                packets = conn.reader.feed(data)
            except ProtocolError as exc:
                conn.state = ERROR
                self._dispatch(conn, exc.packets)
                self._protocol_error(conn, exc)
                return
            self.msgs_received += len(packets)
            handlers = self._handlers
            for p in packets:
                handlers[p.__class__](conn, p)
                if conn.state is not CONNECTED:
                    return
            return
        try:
            packets = conn.receive_data(data)
        except ProtocolError as exc:
            self._dispatch(conn, exc.packets)
            self._protocol_error(conn, exc)
            return
        self._dispatch(conn, packets)

    def _dispatch(self, conn: Connection, packets: list[Any]) -> None:
        """Slow path: packets while CONNECTING (or before a protocol error); held while auth runs."""
        self.msgs_received += len(packets)
        handlers = self._handlers
        for i, p in enumerate(packets):
            if conn.close_reason is not None:
                return
            if conn.held is not None:
                conn.held.extend(packets[i:])
                if len(conn.held) > MAX_HELD_PACKETS:
                    self._protocol_error(conn, ProtocolError("too many packets before CONNACK"))
                return
            if p.__class__ is Connect and conn.session is None:
                self._on_connect(conn, p)
            else:
                handlers[p.__class__](conn, p)  # a CONNECT here is a second one: protocol error

    def connection_lost(self, conn: Connection, now_ms: int, reason: str = "connection lost") -> None:
        """The network connection ended (peer closed, reset, or the adapter closed it)."""
        self._now = now_ms
        if conn.close_reason is None:
            self._close(conn, reason, will=True)
        self.connections.discard(conn)

    def tick(self, now_ms: int) -> None:
        """Periodic work (call about once per second): timeouts, keepalive, $SYS, expiry, drop logs."""
        self._now = now_ms
        wheel = self._wheel
        for conn in wheel.due(now_ms):
            state = conn.state
            if state is CONNECTING:
                deadline = conn.created_ms + self._connect_timeout
                if conn.held is not None:
                    wheel.schedule(conn, now_ms + self._connect_timeout)  # authentication still running
                elif now_ms >= deadline:
                    log.info("mqtt connect timeout", peer=conn.peer, timeout_ms=self._connect_timeout)
                    self._close(conn, "connect timeout", will=False)
                else:
                    wheel.schedule(conn, deadline)
            elif state is CONNECTED and conn.keepalive_ms:
                deadline = conn.last_rx_ms + conn.keepalive_ms
                if now_ms >= deadline:
                    self._close(conn, "keepalive timeout", will=True)
                else:
                    wheel.schedule(conn, deadline)
        changed = self.sys.due(now_ms)
        if changed:
            for topic, payload in changed.items():
                self._route(topic, payload, 0, True)  # local only: every node has its own $SYS tree
        if self._session_expiry and self._offline:
            self._expire_sessions(now_ms)
        if self._drops_unreported:
            for s in self._drops_unreported:
                log.warning("mqtt session queue full, messages dropped", client_id=s.client_id,
                            dropped=s.dropped_unreported, dropped_total=s.dropped,
                            policy="oldest" if self.limits.drop_oldest else "newest", limit=self.limits.max_queued)
                s.dropped_unreported = 0
            self._drops_unreported.clear()
        if self._takeovers:
            window = self._takeover_window
            for cid in [c for c, w in self._takeovers.items() if now_ms - w[0] >= window]:
                del self._takeovers[cid]

    def flush(self) -> list[tuple[Connection, bytes]]:
        """Take the pending output and deliver pending events to the hooks.

        Returns:
            ``(connection, bytes)`` per connection with output or a close pending; write the bytes,
            then close the transport when ``connection.state >= CLOSED``.
        """
        dirty = self._dirty
        result: list[tuple[Connection, bytes]] = []
        if dirty:
            self._dirty = []
            sent = 0
            for conn in dirty:
                out = conn.out
                if out:
                    data = out[0] if len(out) == 1 else b"".join(out)
                    out.clear()
                    sent += len(data)
                else:
                    data = b""
                result.append((conn, data))
            self.bytes_sent += sent
        events = self._events
        if events:
            self._events = []
            try:
                self.hooks.on_events(events)  # type: ignore[union-attr]
            except Exception:  # a failing hook must not lose the output collected above
                log.exception("mqtt hooks.on_events failed", events=len(events))
        return result

    def auth_done(self, conn: Connection, result: Any, now_ms: int) -> None:
        """Finish a deferred authentication (see ``defer_auth``).

        Args:
            conn: the connection whose CONNECT was being authenticated.
            result: the ``authenticate`` result (Principal or CONNACK code) or the exception it raised.
            now_ms: current time.
        """
        self._now = now_ms
        held = conn.held
        conn.held = None
        if held is None or conn.state is not CONNECTING:
            return
        if isinstance(result, BaseException):
            log.error("mqtt authentication failed", client_id=conn.client_id, error=repr(result))
            result = CONNACK_SERVER_UNAVAILABLE
        self._finish_connect(conn, held[0], result)
        if conn.state is CONNECTED and len(held) > 1:
            self.msgs_received -= len(held) - 1  # counted when they arrived
            self._dispatch(conn, held[1:])

    # -- SUBSCRIBE / UNSUBSCRIBE / PINGREQ / DISCONNECT --------------------------------------

    def _on_subscribe(self, conn: Connection, p: Subscribe) -> None:
        s: Session = conn.session
        cid = s.client_id
        codes = []
        granted = []
        for topic_filter, qos in p.topics:
            try:
                validate_topic_filter(topic_filter)
            except InvalidTopic as exc:
                codes.append(SUBACK_FAILURE)
                log.info("mqtt subscribe refused", client_id=cid, topic_filter=topic_filter, reason=str(exc))
                continue
            if not self.acl.can_subscribe(conn.principal, topic_filter):
                codes.append(SUBACK_FAILURE)
                log.info("mqtt subscribe refused", client_id=cid, topic_filter=topic_filter, reason="not authorised")
                continue
            self.trie.add(topic_filter, cid, qos)  # MQTT-3.8.4-3: replaces an identical filter
            if topic_filter not in s.subs:
                self.subscription_count += 1
            s.subs[topic_filter] = qos
            codes.append(qos)
            granted.append((topic_filter, qos))
        if granted:
            self._match_cache.clear()
        self._write(conn, encode_suback(p.packet_id, codes))  # MQTT-3.8.4-1, MQTT-3.9.3-1
        for topic_filter, qos in granted:
            self._replay_retained(s, topic_filter, qos)
        if granted:
            self._emit(Subscribed(cid, conn.generation, tuple(granted)))

    def _on_unsubscribe(self, conn: Connection, p: Unsubscribe) -> None:
        s: Session = conn.session
        removed = []
        for topic_filter in p.topics:
            if s.subs.pop(topic_filter, None) is not None:
                self.trie.remove(topic_filter, s.client_id)
                self.subscription_count -= 1
                removed.append(topic_filter)
        if removed:
            self._match_cache.clear()
            self._emit(Unsubscribed(s.client_id, conn.generation, tuple(removed)))
        self._write(conn, encode_unsuback(p.packet_id))  # MQTT-3.10.4-4/5: even when nothing matched

    def _on_pingreq(self, conn: Connection, p: Pingreq) -> None:
        self._write(conn, PINGRESP_BYTES)  # MQTT-3.12.4-1

    def _on_disconnect(self, conn: Connection, p: Disconnect) -> None:
        self._close(conn, "disconnect", will=False)  # MQTT-3.14.4-3: discard the will

    # -- queries -----------------------------------------------------------------------------

    def route_filters(self) -> list[str]:
        """Distinct topic filters subscribed on this node (the route table other nodes forward by)."""
        return list(self.trie.filters())

    def session_of(self, client_id: str) -> Session | None:
        """The session of ``client_id`` (live or offline), or None."""
        return self.sessions.get(client_id)


__all__ = ["Broker"]
