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
from typing import Any, Callable

import structlog

from .codec import encode_connack
from .connection import CONNECTED, CONNECTING, Connection
from .delivery import Delivery
from .errors import ProtocolError, UnsupportedProtocol
from .hooks import ClientConnected, ClientDisconnected
from .login_guard import peer_host
from .principals import may_evict
from .packets import (
    CONNACK_BAD_CREDENTIALS, CONNACK_ID_REJECTED, CONNACK_NOT_AUTHORIZED, CONNACK_SERVER_UNAVAILABLE, Connect,
)
from .session import Session
from .state import BrokerState
from .topics import over_limits

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

    def connection_made(self, now_ms: int, peer: Any) -> Connection:
        """Register a new network connection and start its connect timeout."""
        conn = Connection(self._max_packet, now_ms, peer, max_connect_size=self._max_connect)
        self._st.connections.add(conn)
        self._st.wheel.schedule(conn, now_ms + self._connect_timeout)
        return conn

    # -- CONNECT -----------------------------------------------------------------------------

    def on_connect(self, conn: Connection, p: Connect) -> None:
        st = self._st
        cid = p.client_id
        if not cid:
            if not p.clean_session:
                self.refuse(conn, CONNACK_ID_REJECTED, "zero-length client id needs clean session (MQTT-3.1.3-8)")
                return
            cid = "auto-" + secrets.token_hex(8)  # MQTT-3.1.3-6: assign a unique id
            while cid in st.sessions:
                cid = "auto-" + secrets.token_hex(8)
        conn.client_id = cid
        if st.clients_connected >= self._max_connections:
            self.refuse(conn, CONNACK_SERVER_UNAVAILABLE, "mqtt.max_connections reached")
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

    def finish_connect(self, conn: Connection, p: Connect, result: Any) -> None:
        """Accept or refuse ``conn`` once its authentication ``result`` (Principal or CONNACK code) is known."""
        st = self._st
        cid: str = conn.client_id  # type: ignore[assignment]
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
                self.close(old.conn, "evicted: client id claimed by its vehicle", will=False)
            old = st.sessions.get(cid)
            if old is not None:
                self.discard_session(old)
                old = None
        if old is not None and old.conn is not None:
            if self._takeover_throttled(cid):
                log.warning("mqtt takeover throttled", client_id=cid, limit=self._takeover_limit,
                            window_ms=self._takeover_window, peer=conn.peer)
                self.refuse(conn, CONNACK_SERVER_UNAVAILABLE, "takeover throttled")
                return
            self.close(old.conn, "takeover", will=True)
            old = st.sessions.get(cid)  # a clean session ended with its connection
        if old is not None and p.clean_session:
            self.discard_session(old)  # MQTT-3.1.2-6
            old = None
        present = old is not None
        if present:
            s = old
            del st.offline[cid]
            if s.principal != principal:  # same owner, other login (certificate vs password): rights may differ
                s.principal = principal
                st.match_cache.clear()  # routed recipients are filtered by each session's principal
        else:
            if len(st.sessions) >= self._max_sessions and not self._evict_oldest_offline():
                self.refuse(conn, CONNACK_SERVER_UNAVAILABLE, "mqtt.max_sessions reached")
                return
            s = Session(cid, p.clean_session, st.limits, st.queue_budget, principal)
            st.sessions[cid] = s
        self._generation += 1
        conn.generation = self._generation
        conn.session = s
        conn.principal = principal
        if principal.role in ("platform", "admin"):
            conn.max_packet_size = self._max_platform_packet  # from the bytes after the CONNECT on
        conn.will = p.will
        conn.keepalive_ms = p.keepalive * 1500  # MQTT-3.1.2-24: 1.5 x keep alive
        s.attach(conn)
        st.clients_connected += 1
        if st.clients_connected > st.clients_maximum:
            st.clients_maximum = st.clients_connected
        conn.accepted()
        st.write(conn, encode_connack(present, 0))  # MQTT-3.2.2-2/3: session present flag
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
        log.info("mqtt client connected", client_id=cid, peer=conn.peer, username=principal.username,
                 role=principal.role, clean_session=p.clean_session, session_present=present,
                 keepalive=p.keepalive, generation=conn.generation)

    def refuse(self, conn: Connection, code: int, reason: str, *, logged: bool = True) -> None:
        """CONNACK with a non-zero return code, then close (MQTT-3.2.2-5)."""
        self._st.write(conn, encode_connack(False, code))
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

    def on_bad_packet(self, conn: Connection, p: Any) -> None:
        self.protocol_error(conn, ProtocolError(f"{type(p).__name__} is a server-to-client packet (section 2.2.1)"))

    def on_disconnect(self, conn: Connection, p: Any) -> None:
        self.close(conn, "disconnect", will=False)  # MQTT-3.14.4-3: discard the will

    def protocol_error(self, conn: Connection, exc: ProtocolError) -> None:
        """Close ``conn`` for a protocol violation (CONNACK 0x01 first for an unsupported protocol)."""
        self._st.protocol_errors += 1
        if conn.close_reason is not None:
            return
        if isinstance(exc, UnsupportedProtocol) and not conn.connect_seen:
            self.refuse(conn, exc.return_code, str(exc))  # MQTT-3.1.2-2: CONNACK 0x01, then close
            return
        log.warning("mqtt protocol error", client_id=conn.client_id, peer=conn.peer, reason=str(exc))
        self.close(conn, f"protocol error: {exc}", will=True, error=True)  # MQTT-4.8.0-1

    def close(self, conn: Connection, reason: str, *, will: bool, error: bool = False) -> None:
        """Close ``conn``: detach its session (discarded if clean), publish the will if asked."""
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
                if st.events is not None:
                    a, b = s.tags()
                    tags = a + b
        published = bool(will and w is not None)
        if published:
            self._delivery.publish_internal(w.topic, w.payload, w.qos, w.retain, s.client_id)  # MQTT-3.1.2-8
        st.emit(ClientDisconnected(s.client_id, conn.generation, reason, published, kept, tags))
        log.info("mqtt client disconnected", client_id=s.client_id, peer=conn.peer, reason=reason,
                 will_published=published, session_kept=kept, generation=conn.generation)

    def discard_session(self, s: Session) -> None:
        """Forget a session: registry, offline list, subscriptions, held messages."""
        st = self._st
        cid = s.client_id
        if st.sessions.get(cid) is s:
            del st.sessions[cid]
        st.offline.pop(cid, None)
        if s.subs:
            st.subscription_count -= len(s.subs)
            st.trie.remove_all(cid)
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
        self.close(s.conn, reason, will=will)
        return True

    def shutdown(self, *, publish_wills: bool = False, reason: str = "shutdown") -> int:
        """Close every connection (clean stop). Wills are not published unless asked (see :mod:`broker`).

        Returns:
            The number of connections closed.
        """
        conns = [c for c in self._st.connections if c.close_reason is None]
        for conn in conns:
            self.close(conn, reason, will=publish_wills)
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
                    self.close(conn, "keepalive timeout", will=True)
                else:
                    wheel.schedule(conn, deadline)

    def expire_sessions(self, now_ms: int) -> None:
        """Drop persistent sessions offline for longer than ``session_expiry_ms`` (0 = never)."""
        st = self._st
        expiry = self._session_expiry
        if not expiry or not st.offline:
            return
        expired = []
        for cid in st.offline:
            if now_ms - st.sessions[cid].disconnected_ms < expiry:
                break
            expired.append(cid)
        for cid in expired:
            s = st.sessions[cid]
            log.info("mqtt session expired", client_id=cid, queued=s.queued_count(), inflight=len(s.inflight))
            self.discard_session(s)

    def forget_takeovers(self, now_ms: int) -> None:
        """Forget takeover windows that have ended."""
        if self._takeovers:
            window = self._takeover_window
            for cid in [c for c, w in self._takeovers.items() if now_ms - w[0] >= window]:
                del self._takeovers[cid]


__all__ = ["Lifecycle"]
