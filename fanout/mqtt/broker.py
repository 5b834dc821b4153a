"""The MQTT 3.1.1 broker core: events in, ``(connection, bytes)`` pairs out; never touches a socket.

Strategy: an I/O adapter (:mod:`fanout.mqtt.aio`, or a test) reports what happened -
:meth:`Broker.connection_made`, :meth:`Broker.data_received`, :meth:`Broker.connection_lost`,
:meth:`Broker.tick` (about once per second) - always passing ``now_ms`` from its monotonic clock. The
broker decodes, applies MQTT semantics and appends the bytes to send to ``conn.out``; the adapter calls
:meth:`Broker.flush` (scheduled through the ``on_output`` callback, once per loop iteration) and writes
each returned ``(connection, bytes)`` pair, closing the transport when ``conn.state >= CLOSED``.

What lives where: connection lifecycle, CONNECT (auth, takeover, sessions), SUBSCRIBE/UNSUBSCRIBE,
timeouts and shutdown here; the per-message publish flow and the embedding API in :mod:`routing`;
per-client state in :mod:`session`; packet order in :mod:`connection`; retained messages in
:mod:`retained`; ``$SYS`` in :mod:`sys_stats`; the event types in :mod:`hooks`.

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

import functools
import secrets
from typing import Any, Callable

import structlog

from .connection import CLOSED, CONNECTED, CONNECTING, ERROR, Connection
from .deadlines import DeadlineWheel
from .errors import ProtocolError, UnsupportedProtocol
from .hooks import BrokerHooks, ClientConnected, ClientDisconnected, Subscribed, Unsubscribed
from .packets import (
    CONNACK_ID_REJECTED, CONNACK_NOT_AUTHORIZED, CONNACK_SERVER_UNAVAILABLE, PINGRESP_BYTES, SUBACK_FAILURE,
    Connack, Connect, Disconnect, Pingreq, Pingresp, Puback, Pubcomp, Publish, Pubrec, Pubrel, Suback, Subscribe,
    Unsuback, Unsubscribe,
)
from .codec import encode_connack, encode_suback, encode_unsuback
from .retained import RetainedStore
from .routing import Routing
from .session import Session, SessionLimits
from .sys_stats import SysStats
from .topics import InvalidTopic, validate_topic_filter
from .trie import SubscriptionTrie

log = structlog.get_logger(__name__)

MAX_HELD_PACKETS = 1000  # packets held while an authentication runs before the client is dropped
AuthFn = Callable[[], Any]


class Broker(Routing):
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
                self._publish_internal(topic, payload, 0, True)
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
            self.hooks.on_events(events)  # type: ignore[union-attr]
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

    # -- CONNECT -----------------------------------------------------------------------------

    def _on_connect(self, conn: Connection, p: Connect) -> None:
        cid = p.client_id
        if not cid:
            if not p.clean_session:
                self._refuse(conn, CONNACK_ID_REJECTED, "zero-length client id needs clean session (MQTT-3.1.3-8)")
                return
            cid = "auto-" + secrets.token_hex(8)  # MQTT-3.1.3-6: assign a unique id
            while cid in self.sessions:
                cid = "auto-" + secrets.token_hex(8)
        conn.client_id = cid
        if self.clients_connected >= self._max_connections:
            self._refuse(conn, CONNACK_SERVER_UNAVAILABLE, "mqtt.max_connections reached")
            return
        if self._defer_auth is not None and p.username is not None:
            conn.held = [p]
            self._defer_auth(conn, functools.partial(self.acl.authenticate, cid, p.username, p.password))
            return
        self._finish_connect(conn, p, self.acl.authenticate(cid, p.username, p.password))

    def _finish_connect(self, conn: Connection, p: Connect, result: Any) -> None:
        cid: str = conn.client_id  # type: ignore[assignment]
        if isinstance(result, int):
            self._refuse(conn, result, "authentication")
            return
        principal = result
        if p.will is not None and not self.acl.can_publish(principal, p.will.topic):
            self._refuse(conn, CONNACK_NOT_AUTHORIZED, "will topic not authorised")
            return
        old = self.sessions.get(cid)
        if old is not None and old.conn is not None:
            if self._takeover_throttled(cid):
                log.warning("mqtt takeover throttled", client_id=cid, limit=self._takeover_limit,
                            window_ms=self._takeover_window, peer=conn.peer)
                self._refuse(conn, CONNACK_SERVER_UNAVAILABLE, "takeover throttled")
                return
            self._close(old.conn, "takeover", will=True)
            old = self.sessions.get(cid)  # a clean session ended with its connection
        if old is not None and p.clean_session:
            self._discard_session(old)  # MQTT-3.1.2-6
            old = None
        present = old is not None
        if present:
            s = old
            del self._offline[cid]
        else:
            if len(self.sessions) >= self._max_sessions and not self._evict_oldest_offline():
                self._refuse(conn, CONNACK_SERVER_UNAVAILABLE, "mqtt.max_sessions reached")
                return
            s = Session(cid, p.clean_session, self.limits)
            self.sessions[cid] = s
        self._generation += 1
        conn.generation = self._generation
        conn.session = s
        conn.principal = principal
        conn.will = p.will
        conn.keepalive_ms = p.keepalive * 1500  # MQTT-3.1.2-24: 1.5 x keep alive
        s.conn = conn
        self.clients_connected += 1
        if self.clients_connected > self.clients_maximum:
            self.clients_maximum = self.clients_connected
        conn.state = CONNECTED
        self._write(conn, encode_connack(present, 0))  # MQTT-3.2.2-2/3: session present flag
        if conn.keepalive_ms:
            self._wheel.schedule(conn, self._now + conn.keepalive_ms)
        else:
            self._wheel.cancel(conn)
        resent: tuple[Any, ...] = ()
        queued: tuple[Any, ...] = ()
        if present:
            if self._events is not None:
                resent, queued = s.tags()
            self._resume(s)
        self._emit(ClientConnected(cid, conn.generation, present, principal.username, principal.role, resent, queued))
        log.info("mqtt client connected", client_id=cid, peer=conn.peer, username=principal.username,
                 role=principal.role, clean_session=p.clean_session, session_present=present,
                 keepalive=p.keepalive, generation=conn.generation)

    def _refuse(self, conn: Connection, code: int, reason: str) -> None:
        """CONNACK with a non-zero return code, then close (MQTT-3.2.2-5)."""
        self._write(conn, encode_connack(False, code))
        self._close(conn, reason, will=False)
        log.info("mqtt connect refused", client_id=conn.client_id, peer=conn.peer, return_code=code, reason=reason)

    def _takeover_throttled(self, cid: str) -> bool:
        now = self._now
        w = self._takeovers.get(cid)
        if w is None or now - w[0] >= self._takeover_window:
            self._takeovers[cid] = [now, 1]
            return False
        w[1] += 1
        return w[1] > self._takeover_limit

    # -- closing -----------------------------------------------------------------------------

    def _release(self, conn: Connection) -> None:
        """Bookkeeping common to every close: forget the deadline, ask the adapter to close."""
        self._wheel.cancel(conn)
        self.connections.discard(conn)
        if not conn.out:
            if not self._dirty:
                self._wake()
            self._dirty.append(conn)

    def _on_second_connect(self, conn: Connection, p: Connect) -> None:
        self._protocol_error(conn, ProtocolError("second CONNECT on one connection (MQTT-3.1.0-2)"))

    def _on_bad_packet(self, conn: Connection, p: Any) -> None:
        self._protocol_error(conn, ProtocolError(f"{type(p).__name__} is a server-to-client packet (section 2.2.1)"))

    def _protocol_error(self, conn: Connection, exc: ProtocolError) -> None:
        self.protocol_errors += 1
        if conn.close_reason is not None:
            return
        if isinstance(exc, UnsupportedProtocol) and not conn.connect_seen:
            self._refuse(conn, exc.return_code, str(exc))  # MQTT-3.1.2-2: CONNACK 0x01, then close
            return
        log.warning("mqtt protocol error", client_id=conn.client_id, peer=conn.peer, reason=str(exc))
        self._close(conn, f"protocol error: {exc}", will=True, error=True)  # MQTT-4.8.0-1

    def _close(self, conn: Connection, reason: str, *, will: bool, error: bool = False) -> None:
        """Close ``conn``: detach its session (discarded if clean), publish the will if asked."""
        if not conn.close(reason, error=error):
            return
        self._release(conn)
        s = conn.session
        if s is None:
            return  # never got a CONNACK 0
        self.clients_connected -= 1
        w = conn.will
        conn.will = None
        kept = False
        tags: tuple[Any, ...] = ()
        if s.conn is conn:
            s.conn = None
            if s.clean:
                self._discard_session(s)
            else:
                kept = True
                s.disconnected_ms = self._now
                self._offline[s.client_id] = None
                if self._events is not None:
                    a, b = s.tags()
                    tags = a + b
        published = bool(will and w is not None)
        if published:
            self._publish_internal(w.topic, w.payload, w.qos, w.retain, s.client_id)  # MQTT-3.1.2-8
        self._emit(ClientDisconnected(s.client_id, conn.generation, reason, published, kept, tags))
        log.info("mqtt client disconnected", client_id=s.client_id, peer=conn.peer, reason=reason,
                 will_published=published, session_kept=kept, generation=conn.generation)

    def _discard_session(self, s: Session) -> None:
        cid = s.client_id
        if self.sessions.get(cid) is s:
            del self.sessions[cid]
        self._offline.pop(cid, None)
        if s.subs:
            self.subscription_count -= len(s.subs)
            self.trie.remove_all(cid)
            self._match_cache.clear()
        self._drops_unreported.discard(s)
        s.clear_messages()

    def _expire_sessions(self, now_ms: int) -> None:
        expiry = self._session_expiry
        expired = []
        for cid in self._offline:
            if now_ms - self.sessions[cid].disconnected_ms < expiry:
                break
            expired.append(cid)
        for cid in expired:
            s = self.sessions[cid]
            log.info("mqtt session expired", client_id=cid, queued=s.queued_count(), inflight=len(s.inflight))
            self._discard_session(s)

    def _evict_oldest_offline(self) -> bool:
        for cid in self._offline:
            log.warning("mqtt session evicted", client_id=cid, reason="mqtt.max_sessions reached")
            self._discard_session(self.sessions[cid])
            return True
        return False

    def kick(self, client_id: str, reason: str = "kicked", *, will: bool = True) -> bool:
        """Close the live connection of ``client_id`` (e.g. taken over on another node).

        Returns:
            True when a live connection was closed.
        """
        s = self.sessions.get(client_id)
        if s is None or s.conn is None:
            return False
        self._close(s.conn, reason, will=will)
        return True

    def shutdown(self, *, publish_wills: bool = False, reason: str = "shutdown") -> int:
        """Close every connection (clean stop). Wills are not published unless asked (module docstring).

        Returns:
            The number of connections closed.
        """
        conns = [c for c in self.connections if c.close_reason is None]
        for conn in conns:
            self._close(conn, reason, will=publish_wills)
        return len(conns)

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
