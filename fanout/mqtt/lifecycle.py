"""Connection and session lifecycle of the broker core: CONNECT (authentication, takeover, session
resume), refusals, every kind of close (DISCONNECT, lost socket, keepalive, protocol error, takeover,
shutdown), session discard and expiry.

Strategy: these paths run once per connection, not per message, so they favour clarity and log every
decision (connect, refusal with its return code, disconnect with its reason, takeover throttling,
evictions). Rules enforced, with the statement they implement:

- zero-length client id only with clean session, else CONNACK 0x02 (MQTT-3.1.3-7/8); a unique id is
  assigned (MQTT-3.1.3-6);
- authentication result 4/5 -> CONNACK 4/5; a will topic the principal may not publish, or over the
  topic length/level bounds -> 5;
- outside development mode a session is bound to the principal that made it: a CONNECT by another
  principal with its client id is refused with 0x02, except that a vehicle evicts a squatter of its VIN
  (the trust model, :mod:`principals`); a certificate's CN is authenticated inline, as are logins answered
  from memory; PBKDF2 logins go through the failed-login limits and the bounded pool (:mod:`login_guard`);
- takeover closes the OLD connection and publishes its will (MQTT-3.1.4-2, MQTT-3.1.2-8); more than
  ``takeover_limit`` takeovers of one id within ``takeover_window_ms`` (by its owner: others are refused
  before) refuse the newcomer with 0x03;
- clean session discards any previous session (MQTT-3.1.2-6); otherwise it is resumed with session
  present = 1 (MQTT-3.2.2-2), unacknowledged messages resent with DUP=1, PUBRELs resent, then the queue;
- a clean session ends with its connection; a persistent one stays, queueing QoS 1/2, until
  ``session_expiry_ms`` (or eviction by ``max_sessions``);
- the will is published when the connection ends without DISCONNECT (MQTT-3.1.2-8) and discarded on
  DISCONNECT (MQTT-3.14.4-3); not on a clean broker shutdown unless asked (see :mod:`broker`).

Also here: the periodic part of that work (:meth:`Lifecycle.sweep`: connect timeouts and keepalive through
the deadline wheel, session expiry, forgetting old takeover windows).
"""
from __future__ import annotations

import functools
import secrets
from logging import INFO
from typing import Any, Callable

import structlog

from .codec import encode_connack, encode_connack5
from .connection import CONNECTED, CONNECTING, Connection
from .delivery import Delivery
from .errors import ProtocolError, UnsupportedProtocol
from .expiry import SessionExpiry
from .events import ClientConnected, ClientDisconnected
from .link5 import CONNACK_CODE_5, NEVER_EXPIRES, Link5, connack_properties, keepalive_s, refusal5, session_expiry_s
from .log_level import enabled as log_enabled
from .login_guard import peer_host
from .message5 import message_props
from .principals import may_evict
from .packets import (
    CONNACK_BAD_CREDENTIALS, CONNACK_ID_REJECTED, CONNACK_NOT_AUTHORIZED, CONNACK_SERVER_UNAVAILABLE, Connect,
)
from .packets5 import Connack5, Connect5, Disconnect5
from .reason_codes import CONNACK_REASON_CODES
from .reason_codes import ReasonCode as RC
from .session import Session
from .state import BrokerState
from .topics import over_limits
from .wills import DelayedWills

log = structlog.get_logger(__name__)


class Lifecycle:
    """CONNECT, takeover, every close, the session registry and the deadlines, over one :class:`BrokerState`.

    Args:
        state: the broker's shared state.
        delivery: sends what a resumed session holds and the wills of closed connections.
        defer_auth: ``(conn, fn)`` callback that runs authentications with a user name off the loop and
            later calls :meth:`Broker.auth_done`; None authenticates inline.
    """

    def __init__(self, state: BrokerState, delivery: Delivery,
                 defer_auth: Callable[[Connection, Callable[[], Any]], None] | None = None) -> None:
        self._st = state
        self._delivery = delivery
        self._defer_auth = defer_auth
        s = state.settings
        self._max_packet = s.max_packet_size_bytes
        self._max_connect = s.max_connect_size_bytes
        # Ingest triggers name up to fanout.max_batch VINs (~20 bytes each in JSON), far more than the
        # per-client limit; only authenticated platform/admin connections get the larger limit.
        self._max_platform_packet = max(s.max_packet_size_bytes, s.max_platform_packet_size_bytes)
        self._connect_timeout = s.connect_timeout_ms
        self._max_connections = s.max_connections
        self._max_sessions = s.max_sessions
        self._session_expiry = s.session_expiry_ms
        self._takeover_window = s.takeover_window_ms
        self._takeover_limit = s.takeover_limit
        self._takeovers: dict[str, list[int]] = {}  # client id -> [window start, count]
        # development mode (loopback, no users) keeps today's behaviour: sessions are not bound to principals
        self._dev_mode = bool(getattr(state.acl, "dev_mode", False))
        self._guard = getattr(state.acl, "guard", None)  # failed-login limits and the PBKDF2 pool
        self._cached = getattr(state.acl, "authenticate_cached", lambda *a: None)
        self._generation = 0
        self.wills = DelayedWills()  # MQTT 5 wills with a Will Delay Interval, after their connection ended
        self._expiry = SessionExpiry(state, s.session_expiry_ms)
        self.shared_available = True  # set by the broker: shared subscriptions are offered (CONNACK)

    def connection_made(self, now_ms: int, peer: Any) -> Connection:
        """Register a new network connection and start its connect timeout."""
        conn = Connection(self._max_packet, now_ms, peer, max_connect_size=self._max_connect)
        self._st.connections.add(conn)
        self._st.wheel.schedule(conn, now_ms + self._connect_timeout)
        return conn

    # -- CONNECT -----------------------------------------------------------------------------

    def on_connect(self, conn: Connection, p: Connect | Connect5) -> None:
        st = self._st
        cid = p.client_id
        v5 = p.__class__ is Connect5
        if v5:
            expiry, _ = session_expiry_s(p, self._session_expiry)  # type: ignore[arg-type]
            conn.v5 = Link5(p.properties, st.settings.topic_alias_maximum, expiry,  # type: ignore[union-attr]
                            st.settings.send_topic_aliases)
            if p.properties.authentication_method is not None:  # type: ignore[union-attr]
                self.refuse(conn, CONNACK_NOT_AUTHORIZED, "extended authentication is not offered",
                            rc5=RC.BAD_AUTHENTICATION_METHOD)
                return
        if not cid:
            if not v5 and not p.clean_session:  # type: ignore[union-attr]
                self.refuse(conn, CONNACK_ID_REJECTED, "zero-length client id needs clean session (MQTT-3.1.3-8)")
                return
            cid = "auto-" + secrets.token_hex(8)  # MQTT-3.1.3-6: assign a unique id
            while cid in st.sessions:
                cid = "auto-" + secrets.token_hex(8)
        conn.client_id = cid
        if st.clients_connected >= self._max_connections:
            self.refuse(conn, CONNACK_SERVER_UNAVAILABLE, "mqtt.max_connections reached", rc5=RC.QUOTA_EXCEEDED)
            return
        cert_cn = getattr(conn.peer, "cert_cn", None)  # set by a TLS listener for a verified client certificate
        if cert_cn is not None:
            self.finish_connect(conn, p, st.acl.authenticate(cid, p.username, p.password, cert_cn))
            return
        if self._defer_auth is not None and p.username is not None:
            cached = self._cached(cid, p.username, p.password)
            if cached is not None:  # answered from memory: no thread hop (login_guard)
                self.finish_connect(conn, p, cached)
                return
            guard = self._guard
            if guard is not None:
                refused = guard.admit(peer_host(conn.peer), st.now)
                if refused is not None:  # counted in $SYS and warned once per window, not logged per connect
                    self.refuse(conn, CONNACK_SERVER_UNAVAILABLE, refused, logged=False)
                    return
            conn.pending_connect = p  # the broker decodes nothing more from it until auth_done
            self._defer_auth(conn, functools.partial(st.acl.authenticate, cid, p.username, p.password))
            return
        self.finish_connect(conn, p, st.acl.authenticate(cid, p.username, p.password))

    def auth_answered(self) -> None:
        """A deferred authentication came back (whether or not its connection is still there)."""
        if self._guard is not None:
            self._guard.done()

    def finish_connect(self, conn: Connection, p: Connect | Connect5, result: Any) -> None:
        """Accept or refuse ``conn`` once its authentication ``result`` (Principal or CONNACK code) is known."""
        st = self._st
        cid: str = conn.client_id  # type: ignore[assignment]
        link = conn.v5
        # MQTT 5: Clean Start discards a previous session; Session Expiry 0 ends it with the connection
        clean_start = p.clean_session if link is None else p.clean_start  # type: ignore[union-attr]
        ends_with_connection = clean_start if link is None else link.session_expiry_s == 0
        if isinstance(result, int):
            if result == CONNACK_BAD_CREDENTIALS and self._guard is not None:
                self._guard.failed(peer_host(conn.peer), st.now)
            self.refuse(conn, result, "authentication")
            return
        principal = result
        if p.will is not None:
            over = over_limits(p.will.topic, st.settings.max_topic_levels, st.settings.max_topic_length_bytes)
            if over is not None:
                st.caps.hit(over, client_id=cid, peer=conn.peer, will_topic_length=len(p.will.topic))
                self.refuse(conn, CONNACK_NOT_AUTHORIZED, "will topic over the topic limits")
                return
        if p.will is not None and not st.acl.can_publish(principal, p.will.topic):
            self.refuse(conn, CONNACK_NOT_AUTHORIZED, "will topic not authorised")
            return
        old = st.sessions.get(cid)
        if old is not None and old.principal is not None and old.principal.owner != principal.owner \
                and not self._dev_mode:
            if not may_evict(principal, old.principal):
                self.refuse(conn, CONNACK_ID_REJECTED, "client id bound to another principal")
                return
            log.warning("mqtt session evicted", client_id=cid, reason="client id claimed by its vehicle",
                        owner_username=old.principal.username, owner_role=old.principal.role, peer=conn.peer)
            if old.conn is not None:
                self.close(old.conn, "evicted: client id claimed by its vehicle", will=False, rc5=RC.SESSION_TAKEN_OVER)
            old = st.sessions.get(cid)
            if old is not None:
                self.discard_session(old)
                old = None
        if old is not None and old.conn is not None:
            if self._takeover_throttled(cid):
                log.warning("mqtt takeover throttled", client_id=cid, limit=self._takeover_limit,
                            window_ms=self._takeover_window, peer=conn.peer)
                self.refuse(conn, CONNACK_SERVER_UNAVAILABLE, "takeover throttled", rc5=RC.CONNECTION_RATE_EXCEEDED)
                return
            self.close(old.conn, "takeover", will=True, rc5=RC.SESSION_TAKEN_OVER)
            old = st.sessions.get(cid)  # a clean session ended with its connection
        if self.wills.cancel(cid):  # MQTT-3.1.3-9: reconnected within the Will Delay Interval
            log.info("mqtt delayed will cancelled", client_id=cid)
        if old is not None and clean_start:
            self.discard_session(old)  # MQTT-3.1.2-6
            old = None
        present = old is not None
        if old is not None:
            s = old
            del st.offline[cid]
            if s.principal != principal:  # same owner, other login (certificate vs password): rights may differ
                s.principal = principal
                st.match_cache.clear()  # routed recipients are filtered by each session's principal
        else:
            if len(st.sessions) >= self._max_sessions and not self._evict_oldest_offline():
                self.refuse(conn, CONNACK_SERVER_UNAVAILABLE, "mqtt.max_sessions reached", rc5=RC.QUOTA_EXCEEDED)
                return
            s = Session(cid, ends_with_connection, st.limits, st.queue_budget, principal)
            st.sessions[cid] = s
        if link is not None:
            s.clean = ends_with_connection
            s.expiry_ms = None if ends_with_connection else self._expiry_ms(link.session_expiry_s)
            if s.opts is None:
                s.opts = {}  # its messages take the MQTT 5 delivery path
            s.inflight_cap = min(st.limits.max_inflight, link.receive_maximum)  # MQTT-3.3.4-9
        else:
            s.expiry_ms = None
            s.inflight_cap = st.limits.max_inflight
        self._generation += 1
        conn.generation = self._generation
        conn.session = s
        conn.principal = principal
        if principal.role in ("platform", "admin"):
            conn.max_packet_size = self._max_platform_packet  # from the bytes after the CONNECT on
        conn.will = p.will
        keepalive = p.keepalive
        if link is None:
            connack = encode_connack(present, 0)  # MQTT-3.2.2-2/3: session present flag
        else:
            keepalive, announce = keepalive_s(p, st.settings.max_keepalive_ms)  # type: ignore[arg-type]
            props = connack_properties(
                settings=st.settings, link=link, assigned_id=cid if not p.client_id else None,
                expiry_changed=link.session_expiry_s != (p.properties.session_expiry_interval or 0),  # type: ignore[union-attr]
                keepalive=keepalive if announce else None, max_packet=conn.max_packet_size,
                shared_available=self.shared_available)
            connack = encode_connack5(present, 0, props)
            st.v5_connected += 1
        conn.keepalive_ms = keepalive * 1500  # MQTT-3.1.2-24: 1.5 x keep alive
        s.attach(conn)
        st.clients_connected += 1
        if st.clients_connected > st.clients_maximum:
            st.clients_maximum = st.clients_connected
        conn.accepted()
        gate = st.holds.gate
        if gate is not None and gate(cid, principal):
            st.holds.hold(conn, st.now)  # the CONNACK waits for the cluster's registration (connack_hold)
        st.write(conn, connack)
        if conn.keepalive_ms:
            st.wheel.schedule(conn, st.now + conn.keepalive_ms)
        else:
            st.wheel.cancel(conn)
        resent: tuple[Any, ...] = ()
        queued: tuple[Any, ...] = ()
        if present:
            if st.events is not None:
                resent, queued = s.tags()
            self._delivery.resume(s)
        st.emit(ClientConnected(cid, conn.generation, present, principal.username, principal.role, resent, queued,
                                principal.vehicle))
        if log_enabled(INFO):  # filtered out, the call alone costs ~3 µs per connect (fanout.mqtt.log_level)
            log.info("mqtt client connected", client_id=cid, peer=conn.peer, username=principal.username,
                     role=principal.role, clean_session=clean_start, session_present=present,
                     keepalive=keepalive, generation=conn.generation, protocol=5 if link is not None else 4)

    def _expiry_ms(self, seconds: int) -> int:
        return -1 if seconds == NEVER_EXPIRES else seconds * 1000  # -1: never

    def refuse(self, conn: Connection, code: int, reason: str, *, logged: bool = True, rc5: int | None = None) -> None:
        """CONNACK with a non-zero return code, then close (MQTT-3.2.2-5); an MQTT 5 client gets ``rc5``
        (default: the reason code of ``code``)."""
        if conn.v5 is None:
            self._st.write(conn, encode_connack(False, code))
        else:
            self._st.write(conn, refusal5(conn, Connack5, rc5 if rc5 is not None else CONNACK_CODE_5[code], reason))
        self.close(conn, reason, will=False)
        if logged:
            log.info("mqtt connect refused", client_id=conn.client_id, peer=conn.peer, return_code=code, reason=reason)

    def _takeover_throttled(self, cid: str) -> bool:
        now = self._st.now
        w = self._takeovers.get(cid)
        if w is None or now - w[0] >= self._takeover_window:
            self._takeovers[cid] = [now, 1]
            return False
        w[1] += 1
        return w[1] > self._takeover_limit

    # -- closing -----------------------------------------------------------------------------

    def on_second_connect(self, conn: Connection, p: Connect) -> None:
        self.protocol_error(conn, ProtocolError("second CONNECT on one connection (MQTT-3.1.0-2)"))

    def on_auth(self, conn: Connection, p: Any) -> None:
        self.protocol_error(conn, ProtocolError("AUTH without an Authentication Method in CONNECT (4.12)"))

    def on_bad_packet(self, conn: Connection, p: Any) -> None:
        self.protocol_error(conn, ProtocolError(f"{type(p).__name__} is a server-to-client packet (section 2.2.1)"))

    def on_disconnect(self, conn: Connection, p: Any) -> None:
        self.close(conn, "disconnect", will=False)  # MQTT-3.14.4-3: discard the will

    def on_disconnect5(self, conn: Connection, p: Disconnect5) -> None:
        """DISCONNECT from an MQTT 5 client: 0x04 publishes the will; a Session Expiry Interval replaces
        the CONNECT's (from 0 to non-zero is a protocol error, MQTT-3.14.2-2)."""
        link = conn.v5
        expiry = p.properties.session_expiry_interval
        if expiry is not None:
            if link.session_expiry_s == 0 and expiry != 0:
                self.protocol_error(conn, ProtocolError(
                    "DISCONNECT sets a Session Expiry Interval on a session that had 0 (MQTT-3.14.2-2)"))
                return
            cap = self._session_expiry
            if cap and (expiry == NEVER_EXPIRES or expiry * 1000 > cap):
                expiry = cap // 1000
            link.session_expiry_s = expiry
            s = conn.session
            s.clean = expiry == 0
            s.expiry_ms = None if expiry == 0 else self._expiry_ms(expiry)
        link.disconnected = True  # no server DISCONNECT after the client's (MQTT-3.14.4-1)
        with_will = p.reason_code == RC.DISCONNECT_WITH_WILL_MESSAGE
        self.close(conn, "disconnect with will" if with_will else "disconnect", will=with_will)

    def protocol_error(self, conn: Connection, exc: ProtocolError) -> None:
        """Close ``conn`` for a protocol violation (CONNACK 0x01 first for an unsupported protocol)."""
        self._st.protocol_errors += 1
        if conn.close_reason is not None:
            return
        if isinstance(exc, UnsupportedProtocol) and not conn.connect_seen:
            self.refuse(conn, exc.return_code, str(exc))  # MQTT-3.1.2-2: CONNACK 0x01, then close
            return
        if not conn.connect_seen and getattr(exc, "connect_level", 0) == 5:
            # a level-5 CONNECT that does not decode: CONNACK with the reason code, then close (4.13)
            code = exc.reason_code if exc.reason_code in CONNACK_REASON_CODES else RC.PROTOCOL_ERROR
            self._st.write(conn, encode_connack5(False, code))
        log.warning("mqtt protocol error", client_id=conn.client_id, peer=conn.peer, reason=str(exc))
        self.close(conn, f"protocol error: {exc}", will=True, error=True, rc5=exc.reason_code)  # MQTT-4.8.0-1

    def close(self, conn: Connection, reason: str, *, will: bool, error: bool = False, rc5: int | None = None) -> None:
        """Close ``conn``: detach its session (discarded if clean), publish the will if asked.

        ``rc5``: the reason code of the DISCONNECT an accepted MQTT 5 client gets first (section 4.13).
        """
        if conn.close_reason is None and rc5 is not None and conn.v5 is not None and conn.session is not None \
                and not conn.v5.disconnected:
            self._st.write(conn, refusal5(conn, Disconnect5, rc5, reason))
        if not conn.close(reason, error=error):
            return
        st = self._st
        st.wheel.cancel(conn)
        st.connections.discard(conn)
        st.want_flush(conn)  # the adapter closes the transport at the next flush
        s = conn.session
        if s is None:
            return  # never got a CONNACK 0
        st.clients_connected -= 1
        if conn.v5 is not None:
            st.v5_connected -= 1
        w = conn.will
        conn.will = None
        kept = False
        tags: tuple[Any, ...] = ()
        if s.conn is conn:
            self._delivery.detach(s)
            if s.clean:
                self.discard_session(s)
            else:
                kept = True
                s.disconnected_ms = st.now
                st.offline[s.client_id] = None
                self._expiry.went_offline(s, st.now)
                if st.events is not None:
                    a, b = s.tags()
                    tags = a + b
        published = bool(will and w is not None)
        if published:
            delay = getattr(w.properties, "will_delay_interval", None) if hasattr(w, "properties") else None
            if delay and kept:
                self.wills.add(s.client_id, st.now + delay * 1000, w)  # 3.1.3.2.2: published later, or never
            else:
                self.publish_will(s.client_id, w)  # MQTT-3.1.2-8
        st.emit(ClientDisconnected(s.client_id, conn.generation, reason, published, kept, tags))
        if log_enabled(INFO):
            log.info("mqtt client disconnected", client_id=s.client_id, peer=conn.peer, reason=reason,
                     will_published=published, session_kept=kept, generation=conn.generation)

    def publish_will(self, client_id: str, w: Any) -> None:
        """Publish a will (3.1.1 ``Will`` or MQTT 5 ``Will5`` with its properties)."""
        props = message_props(w.properties, self._st.now) if hasattr(w, "properties") else None
        self._delivery.publish_internal(w.topic, w.payload, w.qos, w.retain, client_id, props=props)

    def discard_session(self, s: Session) -> None:
        """Forget a session: registry, offline list, subscriptions, held messages; a delayed will is
        published now (the session ends before its delay, 3.1.3.2.2)."""
        st = self._st
        cid = s.client_id
        if self.wills:
            w = self.wills.take(cid)
            if w is not None:
                self.publish_will(cid, w)
        if st.sessions.get(cid) is s:
            del st.sessions[cid]
        st.offline.pop(cid, None)
        if s.subs:
            st.subscription_count -= len(s.subs)
            st.trie.remove_all(cid)
            if s.opts is not None and st.shared is not None and st.shared.groups:
                st.shared.remove_all(cid, s.subs)
            st.match_cache.clear()
        st.drops_unreported.discard(s)
        s.clear_messages()

    def _evict_oldest_offline(self) -> bool:
        st = self._st
        for cid in st.offline:
            log.warning("mqtt session evicted", client_id=cid, reason="mqtt.max_sessions reached")
            self.discard_session(st.sessions[cid])
            return True
        return False

    def kick(self, client_id: str, reason: str = "kicked", *, will: bool = True) -> bool:
        """Close the live connection of ``client_id`` (e.g. taken over on another node).

        Returns:
            True when a live connection was closed.
        """
        s = self._st.sessions.get(client_id)
        if s is None or s.conn is None:
            return False
        self.close(s.conn, reason, will=will, rc5=RC.SESSION_TAKEN_OVER)
        return True

    def shutdown(self, *, publish_wills: bool = False, reason: str = "shutdown") -> int:
        """Close every connection (clean stop). Wills are not published unless asked (see :mod:`broker`).

        Returns:
            The number of connections closed.
        """
        conns = [c for c in self._st.connections if c.close_reason is None]
        for conn in conns:
            self.close(conn, reason, will=publish_wills, rc5=RC.SERVER_SHUTTING_DOWN)
        return len(conns)

    # -- periodic ----------------------------------------------------------------------------

    def check_deadlines(self, now_ms: int) -> None:
        """Close connections past their connect timeout or keepalive (each looked at when its bucket is due)."""
        wheel = self._st.wheel
        for conn in wheel.due(now_ms):
            state = conn.state
            if state is CONNECTING:
                deadline = conn.created_ms + self._connect_timeout
                if conn.pending_connect is not None:
                    wheel.schedule(conn, now_ms + self._connect_timeout)  # authentication still running
                elif now_ms >= deadline:
                    log.info("mqtt connect timeout", peer=conn.peer, timeout_ms=self._connect_timeout)
                    self.close(conn, "connect timeout", will=False)
                else:
                    wheel.schedule(conn, deadline)
            elif state is CONNECTED and conn.keepalive_ms:
                deadline = conn.last_rx_ms + conn.keepalive_ms
                if now_ms >= deadline:
                    self.close(conn, "keepalive timeout", will=True, rc5=RC.KEEP_ALIVE_TIMEOUT)
                else:
                    wheel.schedule(conn, deadline)

    def expire_sessions(self, now_ms: int) -> None:
        """Drop expired offline sessions (:mod:`expiry`); publish delayed wills that are due."""
        for cid, w in self.wills.due(now_ms):
            self.publish_will(cid, w)
        for s in self._expiry.expired(now_ms):
            if self._st.sessions.get(s.client_id) is s:
                log.info("mqtt session expired", client_id=s.client_id, queued=s.queued_count(),
                         inflight=len(s.inflight))
                self.discard_session(s)

    def forget_takeovers(self, now_ms: int) -> None:
        """Forget takeover windows that have ended."""
        if self._takeovers:
            window = self._takeover_window
            for cid in [c for c, w in self._takeovers.items() if now_ms - w[0] >= window]:
                del self._takeovers[cid]


__all__ = ["Lifecycle"]
