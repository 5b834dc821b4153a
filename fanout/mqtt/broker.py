"""The MQTT 3.1.1 and 5.0 broker core: events in, ``(connection, bytes)`` pairs out; never touches a socket.

Strategy: an I/O adapter (:mod:`fanout.mqtt.aio`, or a test) reports what happened -
:meth:`Broker.connection_made`, :meth:`Broker.data_received`, :meth:`Broker.connection_lost`,
:meth:`Broker.tick` (about once per second) - always passing ``now_ms`` from its monotonic clock. The
broker decodes, applies MQTT semantics and appends the bytes to send to ``conn.out``; the adapter calls
:meth:`Broker.flush` (scheduled through the ``on_output`` callback, once per loop iteration) and writes
each returned ``(connection, bytes)`` pair, closing the transport when ``conn.state >= CLOSED``.

What lives where: :class:`Broker` is a thin facade - adapter entry points, packet dispatch by class,
the periodic sweep and flush - over collaborators that share one :class:`~fanout.mqtt.state.BrokerState`:
CONNECT, takeover, closes, session registry and deadlines in :mod:`lifecycle`; routing, outbound
delivery and the clients' acks in :mod:`delivery`; client PUBLISH and ingest interception in
:mod:`inbound`; SUBSCRIBE/UNSUBSCRIBE in :mod:`subscriptions`. Per-client state in :mod:`session`;
packet order in :mod:`connection`; retained messages in :mod:`retained`; ``$SYS`` in :mod:`sys_stats`;
the event types in :mod:`hooks`; the settings in :mod:`settings`. MQTT 5: a level-5 CONNECT switches the
connection's reader to the MQTT 5 packet classes, dispatched here to :mod:`inbound5` (PUBLISH, topic
aliases, reason codes), :mod:`subscriptions5` (options, identifiers, ``$share``), :mod:`lifecycle`
(CONNACK properties from :mod:`link5`, DISCONNECT codes, will delay in :mod:`wills`, session expiry in
:mod:`expiry`); what a message carries is in :mod:`message5`, its MQTT 5 recipients are served by
:mod:`fanout5`, shared subscriptions live in :mod:`shared`.

Decisions (see also docs/mqtt.md):

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
  it off the loop (and stops reading that socket) and calls :meth:`Broker.auth_done`. Nothing is decoded
  from a connection before its CONNECT is accepted: the bytes after the CONNECT stay in its reader, at
  most ``max_connect_size`` + one read (``MAX_READ_BYTES``) of them, and are decoded under the packet size
  limit of the authenticated role once the CONNACK is written.
- An embedding with a cluster-wide client id registry can hold CONNACKs until it registered the
  connection (:meth:`Broker.hold_connacks`, :mod:`connack_hold`): meanwhile nothing more is decoded
  from the client and nothing is written to it.
"""
from __future__ import annotations

from typing import Any, Callable, cast

import structlog

from .connack_hold import HoldGate
from .connection import CLOSED, CONNECTED, CONNECTING, ERROR, Connection
from .delivery import Delivery
from .errors import NotConnectFirst, PacketTooLarge, ProtocolError
from .hooks import DeliverStatus
from .inbound import Inbound
from .inbound5 import Inbound5
from .lifecycle import Lifecycle
from .packets import (
    CONNACK_SERVER_UNAVAILABLE, PINGRESP_BYTES, Connack, Connect, Disconnect, Pingreq, Pingresp, Puback, Pubcomp,
    Publish, Pubrec, Pubrel, Suback, Subscribe, Unsuback, Unsubscribe,
)
from .packets5 import (
    Auth5, Connack5, Connect5, Disconnect5, Puback5, Pubcomp5, Publish5, Pubrec5, Pubrel5, Suback5, Subscribe5,
    Unsuback5, Unsubscribe5,
)
from .session import Session
from .settings import MQTTSettings
from .state import BrokerState
from .shared import SharedSubscriptions
from .subscriptions import Subscriptions
from .subscriptions5 import Subscriptions5
from .sys_stats import SysStats

log = structlog.get_logger(__name__)

MAX_READ_BYTES = 256 * 1024  # the most asyncio's transports hand over per read (selector_events.max_size)
AuthFn = Callable[[], Any]


class Broker:
    """One node's MQTT broker.

    Args:
        settings: the MQTT settings (``fanout.config.mqtt_settings(config)``).
        acl: an :class:`fanout.mqtt.auth.AccessControl` (``authenticate``, ``can_publish``,
            ``can_subscribe``).
        hooks: embedding hooks: a :class:`~fanout.mqtt.hooks.BrokerHooks`, or an object with its attributes and
            methods (the node's compiled ``NodeCore``); None builds no events.
        now_ms: start time on the adapter's clock.
        defer_auth: ``(conn, fn)`` callback; when given, authentications of CONNECTs with a user name
            are handed to it, and it must arrange ``broker.auth_done(conn, fn(), now_ms)`` (or pass the
            exception instead of the result) later. None authenticates inline.
        on_output: called (no arguments) when output or events become pending; the adapter schedules
            :meth:`flush` from it.
        wheel_resolution_ms: granularity of connect-timeout and keepalive deadlines.

    The embedding API (see :mod:`hooks`) is bound in the constructor straight to the collaborator that
    implements each call, because :meth:`deliver` runs once per fanout delivery and a forwarding method
    would add a Python call to it: :meth:`Delivery.deliver` (``deliver``), :meth:`Delivery.publish_local`
    (``publish_local``), :meth:`Inbound.complete_publish` (``complete_publish``),
    :meth:`Inbound.reject_publish` (``reject_publish``), :meth:`Lifecycle.kick` (``kick``),
    :meth:`Lifecycle.shutdown` (``shutdown``) and :meth:`Subscriptions.route_filters` (``route_filters``).
    """

    deliver: Callable[..., DeliverStatus]
    publish_local: Callable[..., int]
    complete_publish: Callable[..., bool]
    reject_publish: Callable[..., bool]
    kick: Callable[..., bool]
    shutdown: Callable[..., int]
    route_filters: Callable[[], list[str]]

    # $SYS counters of the shared state, read-only. Spelled out: a property made by a helper at class level is a
    # default attribute value to mypyc, which it drops (make native).
    @property
    def clients_connected(self) -> int:
        return self.state.clients_connected

    @property
    def clients_maximum(self) -> int:
        return self.state.clients_maximum

    @property
    def msgs_received(self) -> int:
        return self.state.msgs_received

    @property
    def msgs_sent(self) -> int:
        return self.state.msgs_sent

    @property
    def pub_received(self) -> int:
        return self.state.pub_received

    @property
    def pub_sent(self) -> int:
        return self.state.pub_sent

    @property
    def pub_dropped(self) -> int:
        return self.state.pub_dropped

    @property
    def pub_denied(self) -> int:
        return self.state.pub_denied

    @property
    def bytes_received(self) -> int:
        return self.state.bytes_received

    @property
    def bytes_sent(self) -> int:
        return self.state.bytes_sent

    @property
    def subscription_count(self) -> int:
        return self.state.subscription_count

    @property
    def acks_unknown(self) -> int:
        return self.state.acks_unknown

    @property
    def protocol_errors(self) -> int:
        return self.state.protocol_errors

    @property
    def sessions_offline(self) -> int:
        return self.state.sessions_offline

    def __init__(self, settings: MQTTSettings, acl: Any, hooks: Any = None, *, now_ms: int = 0,
                 defer_auth: Callable[[Connection, AuthFn], None] | None = None,
                 on_output: Callable[[], None] | None = None, wheel_resolution_ms: int = 1000) -> None:
        st = self.state = BrokerState(settings, acl, hooks, now_ms=now_ms, wake=on_output or (lambda: None),
                                      wheel_resolution_ms=wheel_resolution_ms)
        self.settings = settings
        self.acl = acl
        self.hooks = hooks
        self.limits = st.limits
        self.sessions: dict[str, Session] = st.sessions
        self.connections: set[Connection] = st.connections
        self.trie = st.trie
        self.retained = st.retained
        self.sys = SysStats(st, settings.sys_interval_ms, now_ms)
        # bytes a connection may send after its CONNECT before the CONNACK: what one read brought with it
        self._max_pre_auth = settings.max_connect_size_bytes + MAX_READ_BYTES
        self._budget = st.queue_budget
        self.pressure = self._pressure = st.pressure  # the adapter checks pressure.changes after each read
        delivery = self._delivery = Delivery(st)
        lifecycle = self._lifecycle = Lifecycle(st, delivery, defer_auth)
        inbound = self._inbound = Inbound(st, delivery, lifecycle)
        subscriptions = Subscriptions(st, delivery)
        st.shared = SharedSubscriptions(st.sessions, delivery.give5, delivery.may_read)
        inbound5 = Inbound5(st, delivery, lifecycle, inbound)
        subscriptions5 = Subscriptions5(st, delivery, subscriptions)
        self.deliver = delivery.deliver
        self.publish_local = delivery.publish_local
        self.complete_publish = inbound.complete_publish
        self.reject_publish = inbound.reject_publish
        self.kick = lifecycle.kick
        self.shutdown = lifecycle.shutdown
        self.route_filters = subscriptions.route_filters
        bad = lifecycle.on_bad_packet  # server-to-client packets from a client violate section 2.2.1
        self._handlers: dict[type, Callable[[Connection, Any], None]] = {
            Publish: inbound.on_publish, Pubrel: inbound.on_pubrel, Puback: delivery.on_puback,
            Pubrec: delivery.on_pubrec, Pubcomp: delivery.on_pubcomp, Subscribe: subscriptions.on_subscribe,
            Unsubscribe: subscriptions.on_unsubscribe, Pingreq: self._on_pingreq,
            Disconnect: lifecycle.on_disconnect, Connect: lifecycle.on_second_connect,
            Connack: bad, Suback: bad, Unsuback: bad, Pingresp: bad,
            # MQTT 5 (a level-5 CONNECT switches the connection's reader to these classes)
            Publish5: inbound5.on_publish, Pubrel5: inbound.on_pubrel, Puback5: delivery.on_puback,
            Pubrec5: inbound5.on_pubrec, Pubcomp5: delivery.on_pubcomp, Subscribe5: subscriptions5.on_subscribe,
            Unsubscribe5: subscriptions5.on_unsubscribe, Disconnect5: lifecycle.on_disconnect5,
            Connect5: lifecycle.on_second_connect, Connack5: bad, Suback5: bad, Unsuback5: bad,
            Auth5: lifecycle.on_auth,
        }

    def set_output_callback(self, fn: Callable[[], None]) -> None:
        """Set the callable invoked when output or events become pending."""
        self.state.wake = fn

    # -- adapter entry points ----------------------------------------------------------------

    def connection_made(self, now_ms: int, peer: Any = None) -> Connection:
        """A network connection was accepted; returns its :class:`Connection` (set ``.transport``)."""
        self.state.now = now_ms
        return self._lifecycle.connection_made(now_ms, peer)

    def data_received(self, conn: Connection, data: bytes, now_ms: int) -> None:
        """Bytes arrived on ``conn``: decode and handle every complete packet."""
        st = self.state
        st.now = now_ms
        conn.last_rx_ms = now_ms
        st.bytes_received += len(data)
        if conn.state is CONNECTED and conn.held_output is None:
            # Fast path: the reader directly (Connection.receive_data adds a frame and an order check
            # whose only remaining rule, "no second CONNECT", the handler table enforces here).
            try:
                packets = conn.reader.feed(data)
            except ProtocolError as exc:
                conn.state = ERROR
                self._dispatch(conn, exc.packets)
                self._lifecycle.protocol_error(conn, exc)
                return
            st.msgs_received += len(packets)
            handlers = self._handlers
            for p in packets:
                handlers[p.__class__](conn, p)
                if conn.state is not CONNECTED:
                    return
            pressure = self._pressure
            if self._budget.online_bytes > pressure.high_bytes:
                pressure.after_read(conn, packets, now_ms)  # back-pressure: stop reading from publishers
            return
        # Slow path: CONNECTING (at most the CONNECT comes out), closed (nothing does), or a CONNACK held.
        if conn.held_output is not None and conn.state is CONNECTED:
            conn.reader.hold(data)  # decoded once the CONNACK is out: no reply may overtake it
            if conn.reader.buffered > self._max_pre_auth:
                st.caps.hit("pre_auth_bytes", client_id=conn.client_id, peer=conn.peer, buffered=conn.reader.buffered)
                self._lifecycle.protocol_error(conn, ProtocolError(
                    f"more than {self._max_pre_auth} bytes sent before CONNACK"))
            return
        try:
            packets = conn.receive_data(data)
        except ProtocolError as exc:
            if conn.state is not CONNECTED and not conn.connect_seen:
                if isinstance(exc, NotConnectFirst):
                    st.caps.hit("first_packet", peer=conn.peer, reason=str(exc))
                elif isinstance(exc, PacketTooLarge):
                    st.caps.hit("connect_size", peer=conn.peer, reason=str(exc))
            self._lifecycle.protocol_error(conn, exc)
            return
        if packets:
            st.msgs_received += 1
            self._lifecycle.on_connect(conn, cast("Connect | Connect5", packets[0]))  # the reader returns CONNECT first
            if conn.state is CONNECTED and conn.reader.buffered:
                self.data_received(conn, b"", now_ms)  # what followed the CONNECT, under the connected limits
        if conn.pending_connect is not None and conn.reader.buffered > self._max_pre_auth:
            st.caps.hit("pre_auth_bytes", client_id=conn.client_id, peer=conn.peer, buffered=conn.reader.buffered)
            self._lifecycle.protocol_error(conn, ProtocolError(
                f"more than {self._max_pre_auth} bytes sent before CONNACK"))

    def _dispatch(self, conn: Connection, packets: list[Any]) -> None:
        """The packets decoded before a protocol error on a connected connection."""
        self.state.msgs_received += len(packets)
        handlers = self._handlers
        for p in packets:
            if conn.close_reason is not None:
                return
            handlers[p.__class__](conn, p)  # a CONNECT here is a second one: protocol error

    def connection_lost(self, conn: Connection, now_ms: int, reason: str = "connection lost") -> None:
        """The network connection ended (peer closed, reset, or the adapter closed it)."""
        self.state.now = now_ms
        if conn.close_reason is None:
            self._lifecycle.close(conn, reason, will=True)
        self.state.connections.discard(conn)

    def tick(self, now_ms: int) -> None:
        """Periodic work (call about once per second): timeouts, keepalive, $SYS, expiry, drop logs."""
        st = self.state
        st.now = now_ms
        lifecycle = self._lifecycle
        lifecycle.check_deadlines(now_ms)
        changed = self.sys.due(now_ms)
        if changed:
            route = self._delivery.route
            for topic, payload in changed.items():
                route(topic, payload, 0, True)  # local only: every node has its own $SYS tree
        lifecycle.expire_sessions(now_ms)
        if st.drops_unreported:
            self._delivery.report_drops()
        pressure = st.pressure
        if pressure.engaged:
            pressure.relieve(now_ms)  # queues freed without output (a session dropped) end an episode too
        if pressure.paused:
            pressure.tick(now_ms)
        lifecycle.forget_takeovers(now_ms)
        holds = st.holds
        if len(holds):
            for conn in holds.overdue(now_ms):
                holds.released_late += 1
                log.warning("mqtt connack released without registration", client_id=conn.client_id,
                            held_ms=holds.max_hold_ms, peer=conn.peer)
                self._release(conn)

    def flush(self) -> list[tuple[Connection, bytes]]:
        """Take the pending output and deliver pending events to the hooks.

        Returns:
            ``(connection, bytes)`` per connection with output or a close pending; write the bytes,
            then close the transport when ``connection.state >= CLOSED``.
        """
        st = self.state
        if self._pressure.engaged:
            self._pressure.relieve(st.now)  # the acknowledgements handled since the last flush may end it
        dirty = st.dirty
        result: list[tuple[Connection, bytes]] = []
        if dirty:
            st.dirty = []
            sent = 0
            for conn in dirty:
                out = conn.out
                held = conn.held_output
                if held is not None:
                    if conn.state < CLOSED:
                        held.extend(out)  # the CONNACK and what follows it wait for release_connack
                        out.clear()
                        continue
                    conn.held_output = None  # closed before its CONNACK went out: nothing of it is sent
                    out.clear()
                if out:
                    data = out[0] if len(out) == 1 else b"".join(out)
                    out.clear()
                    sent += len(data)
                else:
                    data = b""
                result.append((conn, data))
            st.bytes_sent += sent
        events = st.events
        if events:
            st.events = []
            try:
                self.hooks.on_events(events)
            except Exception:  # a failing hook must not lose the output collected above
                log.exception("mqtt hooks.on_events failed", events=len(events))
        return result

    def read_changes(self) -> dict[Connection, bool] | None:
        """The back-pressure decisions since the last call (:mod:`backpressure`), after a flush: connection ->
        True (stop reading from it) or False (read again); None when there are none."""
        pressure = self._pressure
        return pressure.take() if pressure.changes else None

    def auth_done(self, conn: Connection, result: Any, now_ms: int) -> None:
        """Finish a deferred authentication (see ``defer_auth``).

        Args:
            conn: the connection whose CONNECT was being authenticated.
            result: the ``authenticate`` result (Principal or CONNACK code) or the exception it raised.
            now_ms: current time.
        """
        self.state.now = now_ms
        self._lifecycle.auth_answered()
        connect = conn.pending_connect
        conn.pending_connect = None
        if connect is None or conn.state is not CONNECTING:
            return
        if isinstance(result, BaseException):
            log.error("mqtt authentication failed", client_id=conn.client_id, error=repr(result))
            result = CONNACK_SERVER_UNAVAILABLE
        self._lifecycle.finish_connect(conn, connect, result)
        if conn.state is CONNECTED and conn.reader.buffered:
            self.data_received(conn, b"", now_ms)  # the bytes that followed the CONNECT

    def hold_connacks(self, gate: HoldGate | None) -> None:
        """Hold the CONNACK of each accepted connection for which ``gate(client_id, principal)`` is true
        until :meth:`release_connack` (see :mod:`connack_hold`); None holds nothing (the default)."""
        self.state.holds.gate = gate

    def release_connack(self, client_id: str, generation: int) -> bool:
        """Write the held CONNACK (and what followed it) of connection ``generation`` of ``client_id``,
        then decode what the client sent meanwhile. False when that connection is gone or not held."""
        s = self.state.sessions.get(client_id)
        conn = s.conn if s is not None else None
        if conn is None or conn.generation != generation or conn.held_output is None:
            return False
        self._release(conn)
        return True

    def _release(self, conn: Connection) -> None:
        st = self.state
        held = st.holds.release(conn)
        if held:
            if not conn.out:
                st.want_flush(conn)
            conn.out[:0] = held
        if conn.state is CONNECTED and conn.reader.buffered:
            self.data_received(conn, b"", st.now)

    def write_buffer_full(self, conn: Connection, buffered: int) -> None:
        """The adapter holds more than ``max_write_buffer_bytes`` unwritten for ``conn`` (a client that does
        not read): close it as a failed client (its will is published, a persistent session stays with what
        it holds, within ``max_session_bytes``). The adapter then drops the transport and its buffer.

        Args:
            conn: the connection.
            buffered: bytes waiting in the adapter's write buffer.
        """
        if conn.close_reason is not None:
            return
        self.state.caps.hit("write_buffer", client_id=conn.client_id, peer=conn.peer, buffered=buffered)
        self._lifecycle.close(conn, "write buffer full", will=True)

    def _on_pingreq(self, conn: Connection, p: Pingreq) -> None:
        self.state.write(conn, PINGRESP_BYTES)  # MQTT-3.12.4-1

    # -- queries -----------------------------------------------------------------------------

    def session_of(self, client_id: str) -> Session | None:
        """The session of ``client_id`` (live or offline), or None."""
        return self.state.sessions.get(client_id)


__all__ = ["Broker"]
