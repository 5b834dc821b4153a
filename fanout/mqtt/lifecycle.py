"""Connection and session lifecycle of the broker core: CONNECT (authentication, takeover, session
resume), refusals, every kind of close (DISCONNECT, lost socket, keepalive, protocol error, takeover,
shutdown), session discard and expiry.

Strategy: these paths run once per connection, not per message, so they favour clarity and log every
decision (connect, refusal with its return code, disconnect with its reason, takeover throttling,
evictions). Rules enforced, with the statement they implement:

- zero-length client id only with clean session, else CONNACK 0x02 (MQTT-3.1.3-7/8); a unique id is
  assigned (MQTT-3.1.3-6);
- authentication result 4/5 -> CONNACK 4/5; a will topic the principal may not publish -> 5;
- takeover closes the OLD connection and publishes its will (MQTT-3.1.4-2, MQTT-3.1.2-8); more than
  ``takeover_limit`` takeovers of one id within ``takeover_window_ms`` refuse the newcomer with 0x03;
- clean session discards any previous session (MQTT-3.1.2-6); otherwise it is resumed with session
  present = 1 (MQTT-3.2.2-2), unacknowledged messages resent with DUP=1, PUBRELs resent, then the queue;
- a clean session ends with its connection; a persistent one stays, queueing QoS 1/2, until
  ``session_expiry_ms`` (or eviction by ``max_sessions``);
- the will is published when the connection ends without DISCONNECT (MQTT-3.1.2-8) and discarded on
  DISCONNECT (MQTT-3.14.4-3); not on a clean broker shutdown unless asked (see :mod:`broker`).

:class:`Lifecycle` is a mixin: :class:`fanout.mqtt.broker.Broker` owns the attributes it uses.
"""
from __future__ import annotations

import functools
import secrets
from typing import TYPE_CHECKING, Any

import structlog

from .codec import encode_connack
from .connection import CONNECTED, Connection
from .errors import ProtocolError, UnsupportedProtocol
from .hooks import ClientConnected, ClientDisconnected
from .packets import CONNACK_ID_REJECTED, CONNACK_NOT_AUTHORIZED, CONNACK_SERVER_UNAVAILABLE, Connect
from .session import Session

if TYPE_CHECKING:  # pragma: no cover
    from .broker import Broker

log = structlog.get_logger(__name__)


class Lifecycle:
    """CONNECT, close and session-registry methods; mixed into :class:`Broker`."""

    # -- CONNECT -----------------------------------------------------------------------------

    def _on_connect(self: "Broker", conn: Connection, p: Connect) -> None:
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

    def _finish_connect(self: "Broker", conn: Connection, p: Connect, result: Any) -> None:
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
        if principal.role in ("platform", "admin"):
            # Applies from the next packet on; a client pipelining a big PUBLISH in the same read as its
            # CONNECT is still held to mqtt.max_packet_size (clients wait for CONNACK in practice).
            conn.reader.max_packet_size = self._max_platform_packet
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

    def _refuse(self: "Broker", conn: Connection, code: int, reason: str) -> None:
        """CONNACK with a non-zero return code, then close (MQTT-3.2.2-5)."""
        self._write(conn, encode_connack(False, code))
        self._close(conn, reason, will=False)
        log.info("mqtt connect refused", client_id=conn.client_id, peer=conn.peer, return_code=code, reason=reason)

    def _takeover_throttled(self: "Broker", cid: str) -> bool:
        now = self._now
        w = self._takeovers.get(cid)
        if w is None or now - w[0] >= self._takeover_window:
            self._takeovers[cid] = [now, 1]
            return False
        w[1] += 1
        return w[1] > self._takeover_limit

    # -- closing -----------------------------------------------------------------------------

    def _release(self: "Broker", conn: Connection) -> None:
        """Bookkeeping common to every close: forget the deadline, ask the adapter to close."""
        self._wheel.cancel(conn)
        self.connections.discard(conn)
        if not conn.out:
            if not self._dirty:
                self._wake()
            self._dirty.append(conn)

    def _on_second_connect(self: "Broker", conn: Connection, p: Connect) -> None:
        self._protocol_error(conn, ProtocolError("second CONNECT on one connection (MQTT-3.1.0-2)"))

    def _on_bad_packet(self: "Broker", conn: Connection, p: Any) -> None:
        self._protocol_error(conn, ProtocolError(f"{type(p).__name__} is a server-to-client packet (section 2.2.1)"))

    def _protocol_error(self: "Broker", conn: Connection, exc: ProtocolError) -> None:
        self.protocol_errors += 1
        if conn.close_reason is not None:
            return
        if isinstance(exc, UnsupportedProtocol) and not conn.connect_seen:
            self._refuse(conn, exc.return_code, str(exc))  # MQTT-3.1.2-2: CONNACK 0x01, then close
            return
        log.warning("mqtt protocol error", client_id=conn.client_id, peer=conn.peer, reason=str(exc))
        self._close(conn, f"protocol error: {exc}", will=True, error=True)  # MQTT-4.8.0-1

    def _close(self: "Broker", conn: Connection, reason: str, *, will: bool, error: bool = False) -> None:
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

    def _discard_session(self: "Broker", s: Session) -> None:
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

    def _expire_sessions(self: "Broker", now_ms: int) -> None:
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

    def _evict_oldest_offline(self: "Broker") -> bool:
        for cid in self._offline:
            log.warning("mqtt session evicted", client_id=cid, reason="mqtt.max_sessions reached")
            self._discard_session(self.sessions[cid])
            return True
        return False

    def kick(self: "Broker", client_id: str, reason: str = "kicked", *, will: bool = True) -> bool:
        """Close the live connection of ``client_id`` (e.g. taken over on another node).

        Returns:
            True when a live connection was closed.
        """
        s = self.sessions.get(client_id)
        if s is None or s.conn is None:
            return False
        self._close(s.conn, reason, will=will)
        return True

    def shutdown(self: "Broker", *, publish_wills: bool = False, reason: str = "shutdown") -> int:
        """Close every connection (clean stop). Wills are not published unless asked (module docstring).

        Returns:
            The number of connections closed.
        """
        conns = [c for c in self.connections if c.close_reason is None]
        for conn in conns:
            self._close(conn, reason, will=publish_wills)
        return len(conns)


__all__ = ["Lifecycle"]
