"""Message flow of the broker core: inbound PUBLISH and its acks, routing, outbound delivery, and the
embedding API (``deliver``, ``publish_local``, deferred acknowledgement of ingest publishes).

Strategy: this is the per-message hot path, written for CPython speed. Packets arrive already decoded
and are dispatched by a dict keyed on the packet class (see :mod:`broker`); handlers here:

- never log, never format strings, never build events unless hooks are installed; they only bump
  integer counters;
- write by appending bytes to ``conn.out``; the first append of a connection registers it in the
  broker's dirty list, which :meth:`Broker.flush` joins into one write per connection per loop
  iteration;
- route through the subscription trie behind a small cache (topic -> {client id: granted QoS}) that is
  invalidated by any subscription change; a QoS 0 PUBLISH is encoded once for all its recipients;
- deliver at min(publish QoS, granted QoS), once per client even with overlapping subscriptions (the
  trie already returns the maximum granted QoS per client), with RETAIN=0 on routed messages
  (MQTT-3.3.1-9) and RETAIN=1 only for retained messages replayed on subscribe (MQTT-3.3.1-8);
- QoS 1/2 go through the session's inflight window; what does not fit (or finds the client offline)
  is queued in the session, bounded, with counted drops.

:class:`Routing` is a mixin: :class:`fanout.mqtt.broker.Broker` owns the attributes it uses.
"""
from __future__ import annotations

import json
import struct
from typing import TYPE_CHECKING, Any, Hashable, Iterable

from .codec import encode_puback, encode_pubcomp, encode_publish, encode_pubrec, encode_pubrel
from .connection import CONNECTED, Connection
from .hooks import Delivered, DeliveryDropped, DeliverStatus, Heartbeat, IngestTicket, LocalPublish
from .packets import Puback, Pubcomp, Publish, Pubrec, Pubrel
from .session import SENT, OutMsg, Session
from .topics import topic_matches

if TYPE_CHECKING:  # pragma: no cover
    from .broker import Broker

MATCH_CACHE_SIZE = 4096
ACL_CACHE_SIZE = 256

_U16 = struct.Struct(">H").pack
_SENT = DeliverStatus.SENT
_QUEUED = DeliverStatus.QUEUED


class Routing:
    """Publish/ack handlers and delivery; mixed into :class:`Broker`."""

    # -- output ------------------------------------------------------------------------------

    def _write(self: "Broker", conn: Connection, data: bytes) -> None:
        out = conn.out
        if not out:
            dirty = self._dirty
            if not dirty:
                self._wake()
            dirty.append(conn)
        out.append(data)
        self.msgs_sent += 1

    def _emit(self: "Broker", event: Any) -> None:
        events = self._events
        if events is not None:
            if not events and not self._dirty:
                self._wake()
            events.append(event)

    # -- inbound PUBLISH ---------------------------------------------------------------------

    def _on_publish(self: "Broker", conn: Connection, p: Publish) -> None:
        self.pub_received += 1
        topic = p.topic
        cache = conn.acl_cache
        if cache is None:
            cache = conn.acl_cache = {}
        allowed = cache.get(topic)
        if allowed is None:
            allowed = self._acl_publish(conn, topic, cache)
        qos = p.qos
        if not allowed:
            # Acknowledged but not delivered (as Mosquitto does for MQTT 3.1.1): 3.1.1 has no way to
            # refuse a PUBLISH short of closing the connection.
            self.pub_denied += 1
            if qos == 1:
                self._write(conn, encode_puback(p.packet_id))  # type: ignore[arg-type]
            elif qos == 2:
                self._write(conn, encode_pubrec(p.packet_id))  # type: ignore[arg-type]
            return
        if self._hooked:
            if self._ingest_prefix is not None and topic.startswith(self._ingest_prefix):
                self._ingest(conn, p)
                return
            if self._hb_prefix is not None and topic.startswith(self._hb_prefix):
                self._emit(Heartbeat(conn.client_id, conn.generation, topic, p.payload))  # type: ignore[arg-type]
            if self._forward:
                self._emit(LocalPublish(conn.client_id, topic, p.payload, qos, p.retain))
        if qos != 2:
            # _route inlined: this is the per-message path of QoS 0 and 1
            payload = p.payload
            if p.retain:
                self.retained.set(topic, payload, qos)
            subs = self._match_cache.get(topic)
            if subs is None:
                subs = self._match(topic)
            if subs:
                self._fanout(topic, payload, qos, subs, False)
            if qos:
                out = conn.out
                if not out:
                    dirty = self._dirty
                    if not dirty:
                        self._wake()
                    dirty.append(conn)
                out.append(encode_puback(p.packet_id))  # type: ignore[arg-type]
                self.msgs_sent += 1
            return
        # QoS 2, "method A": route on PUBLISH, remember the id until PUBREL so a DUP resend is not
        # routed twice (MQTT-4.3.3-2).
        if conn.session.qos2_received(p.packet_id):
            self._route(topic, p.payload, 2, p.retain)
        self._write(conn, encode_pubrec(p.packet_id))  # type: ignore[arg-type]

    def _acl_publish(self: "Broker", conn: Connection, topic: str, cache: dict[str, bool]) -> bool:
        allowed = self.acl.can_publish(conn.principal, topic)
        if len(cache) >= ACL_CACHE_SIZE:
            cache.clear()
        cache[topic] = allowed
        if not allowed:
            self._log.info("mqtt publish denied", client_id=conn.client_id, topic=topic)
        return allowed

    def _route(self: "Broker", topic: str, payload: bytes, qos: int, retain: bool) -> int:
        """Store a retained message if asked, then deliver to every matching subscription.

        Returns:
            The number of sessions the message was given to.
        """
        if retain:
            self.retained.set(topic, payload, qos)
        subs = self._match_cache.get(topic)
        if subs is None:
            subs = self._match(topic)
        if subs:
            self._fanout(topic, payload, qos, subs, False)
            return len(subs)
        return 0

    def _match(self: "Broker", topic: str) -> dict[str, int]:
        """Trie match through the cache (cleared on every subscription change)."""
        subs = self.trie.match(topic)
        cache = self._match_cache
        if len(cache) >= MATCH_CACHE_SIZE:
            cache.clear()
        cache[topic] = subs
        return subs

    def _fanout(self: "Broker", topic: str, payload: bytes, qos: int, subs: dict[str, int], retain: bool) -> None:
        sessions = self.sessions
        enc0 = None
        heads: list[bytes | None] | None = None  # per QoS: PUBLISH bytes before the packet id
        tb = topic.encode("utf-8")
        many = len(subs) > 1
        dirty = self._dirty
        for cid, granted in subs.items():
            s = sessions.get(cid)
            if s is None:
                continue
            q = granted if granted < qos else qos
            c = s.conn
            if q == 0:
                if c is None:
                    continue  # QoS 0 is not queued for offline clients
                if c.write_paused:
                    self.pub_dropped += 1
                    continue
                if enc0 is None:
                    enc0 = encode_publish(tb, payload, 0, retain, False, None)  # once for all recipients
                out = c.out
                if not out:
                    if not dirty:
                        self._wake()
                    dirty.append(c)
                out.append(enc0)
                self.msgs_sent += 1
                self.pub_sent += 1
            elif c is not None and not s.queue and len(s.inflight) < s.limits.max_inflight:
                # Session.send + _write inlined: the common QoS 1 case
                inflight = s.inflight
                pid = s.last_pid + 1
                if pid > 0xFFFF or pid in inflight:
                    pid = s.alloc_pid()
                else:
                    s.last_pid = pid
                inflight[pid] = OutMsg(topic, payload, q, retain)
                out = c.out
                if not out:
                    if not dirty:
                        self._wake()
                    dirty.append(c)
                if many:
                    # Encode the fixed header and topic once per QoS; per recipient only the packet id
                    # differs (head | pid | payload, joined at flush).
                    if heads is None:
                        heads = [None, None, None]
                    head = heads[q]
                    if head is None:
                        full = encode_publish(tb, payload, q, retain, False, 1)
                        head = heads[q] = full[:len(full) - len(payload) - 2]
                    out.append(head)
                    out.append(_U16(pid))
                    if payload:
                        out.append(payload)
                else:
                    out.append(encode_publish(tb, payload, q, retain, False, pid))
                self.msgs_sent += 1
                self.pub_sent += 1
            else:
                self._queue(s, OutMsg(topic, payload, q, retain))

    def _send_msg(self: "Broker", s: Session, m: OutMsg) -> DeliverStatus:
        if s.window_open():
            pid = s.send(m)
            self._write(s.conn, encode_publish(m.topic, m.payload, m.qos, m.retain, m.dup, pid))
            self.pub_sent += 1
            return _SENT
        return self._queue(s, m)

    def _queue(self: "Broker", s: Session, m: OutMsg) -> DeliverStatus:
        dropped = s.enqueue(m)
        if dropped is None:
            return _QUEUED
        self.pub_dropped += 1
        self._drops_unreported.add(s)
        if dropped.tag is not None:
            self._emit(DeliveryDropped(s.client_id, dropped.tag))
        return DeliverStatus.DROPPED if dropped is m else _QUEUED

    def _drain(self: "Broker", s: Session) -> None:
        """Send queued messages while the window has room."""
        while True:
            m = s.next_sendable()
            if m is None:
                return
            pid = s.send(m)
            self._write(s.conn, encode_publish(m.topic, m.payload, m.qos, m.retain, m.dup, pid))
            self.pub_sent += 1

    def _resume(self: "Broker", s: Session) -> None:
        """On a resumed session: resend in-flight messages (DUP=1) or their PUBREL, then the queue."""
        conn = s.conn
        for pid, m in s.resend_order():
            if m.state == SENT:
                self._write(conn, encode_publish(m.topic, m.payload, m.qos, m.retain, True, pid))
                self.pub_sent += 1
            else:
                self._write(conn, encode_pubrel(pid))
        self._drain(s)

    # -- acks from the client ----------------------------------------------------------------

    def _on_puback(self: "Broker", conn: Connection, p: Puback) -> None:
        s = conn.session
        inflight = s.inflight
        pid = p.packet_id
        m = inflight.get(pid)
        if m is None or m.qos != 1:
            self.acks_unknown += 1
            return
        del inflight[pid]
        if m.tag is not None:
            self._emit(Delivered(s.client_id, m.tag, 1))
        if s.queue:
            self._drain(s)

    def _on_pubrec(self: "Broker", conn: Connection, p: Pubrec) -> None:
        if conn.session.pubrec(p.packet_id):
            self._write(conn, encode_pubrel(p.packet_id))
        else:
            self.acks_unknown += 1

    def _on_pubcomp(self: "Broker", conn: Connection, p: Pubcomp) -> None:
        s = conn.session
        m = s.acked(p.packet_id, 2)
        if m is None:
            self.acks_unknown += 1
            return
        if m.tag is not None:
            self._emit(Delivered(s.client_id, m.tag, 2))
        if s.queue:
            self._drain(s)

    def _on_pubrel(self: "Broker", conn: Connection, p: Pubrel) -> None:
        conn.session.qos2_released(p.packet_id)
        self._write(conn, encode_pubcomp(p.packet_id))  # always, even for an unknown id (MQTT-4.3.3-2)

    # -- ingest interception -----------------------------------------------------------------

    def _ingest(self: "Broker", conn: Connection, p: Publish) -> None:
        pid = p.packet_id
        if pid is not None:
            pending = conn.pending_ingest
            if pending is None:
                pending = conn.pending_ingest = {}
            elif pid in pending:
                return  # DUP resend while the first copy is being written: its ack will answer both
            q2 = conn.session.inbound_qos2
            if p.qos == 2 and q2 is not None and pid in q2:
                self._write(conn, encode_pubrec(pid))  # already stored, awaiting PUBREL
                return
            pending[pid] = p.qos
        self._emit(IngestTicket(conn.client_id, conn.generation, pid, p.topic, p.payload, p.qos, p.retain, p.dup))  # type: ignore[arg-type]

    def _ingest_conn(self: "Broker", client_id: str, generation: int | None) -> Connection | None:
        s = self.sessions.get(client_id)
        conn = s.conn if s is not None else None
        if conn is None or conn.state is not CONNECTED:
            return None
        if generation is not None and conn.generation != generation:
            return None
        return conn

    def complete_publish(self: "Broker", client_id: str, packet_id: int | None, generation: int | None = None) -> bool:
        """Acknowledge an intercepted publish once its write is durable.

        Sends PUBACK (QoS 1) or PUBREC (QoS 2, then the normal PUBREL/PUBCOMP exchange); nothing for
        QoS 0 (``packet_id`` None).

        Args:
            client_id: the ticket's client id.
            packet_id: the ticket's packet id (None for QoS 0).
            generation: the ticket's generation; when given, an ack for an older connection of the same
                client id is ignored (the client resends the PUBLISH with DUP on its new connection).

        Returns:
            True when the acknowledgement was written; False when the connection is gone, is another
            generation, or the packet id is not pending.
        """
        conn = self._ingest_conn(client_id, generation)
        if conn is None or packet_id is None:
            return conn is not None
        pending = conn.pending_ingest
        qos = pending.pop(packet_id, None) if pending else None
        if qos is None:
            return False
        if qos == 1:
            self._write(conn, encode_puback(packet_id))
        else:
            conn.session.qos2_received(packet_id)
            self._write(conn, encode_pubrec(packet_id))
        return True

    def reject_publish(self: "Broker", client_id: str, packet_id: int | None, error: str | dict[str, Any],
                       generation: int | None = None) -> bool:
        """Refuse an intercepted publish: publish a JSON error on ``<ingest prefix>errors/<client_id>``,
        then close that connection (its will is published: the server ended it, not the client).

        Args:
            client_id: the ticket's client id.
            packet_id: the ticket's packet id (None for QoS 0).
            error: a message, or a dict merged into the JSON error object.
            generation: the ticket's generation (see :meth:`complete_publish`).

        Returns:
            True when the connection was found and closed.
        """
        conn = self._ingest_conn(client_id, generation)
        if conn is None:
            return False
        body: dict[str, Any] = {"client_id": client_id, "packet_id": packet_id}
        body.update(error if isinstance(error, dict) else {"error": str(error)})
        if conn.pending_ingest:
            conn.pending_ingest.pop(packet_id, None)  # type: ignore[arg-type]
        topic = f"{self._error_prefix}{client_id}"
        self._route(topic, json.dumps(body, separators=(",", ":")).encode(), 1, False)
        self._log.warning("mqtt publish rejected", client_id=client_id, packet_id=packet_id, error=body)
        self._close(conn, "rejected", will=True)
        return True

    # -- embedding API -----------------------------------------------------------------------

    def deliver(self: "Broker", client_id: str, topic: str, payload: bytes, qos: int = 1, tag: Hashable = None,
                *, require_subscription: bool = True, covering: Iterable[str] | None = None,
                dup: bool = False) -> DeliverStatus:
        """Send one message to one connected client through its session (the fanout delivery path).

        QoS 1/2 messages get a packet id and count against the inflight window (queued when full);
        a :class:`Delivered` event with ``tag`` follows the PUBACK/PUBCOMP. Not checked against the
        ACL (the caller is the server itself).

        Args:
            client_id: the recipient.
            topic: topic name of the PUBLISH.
            payload: message bytes.
            qos: requested QoS; lowered to the best granted QoS of the client's matching
                subscriptions when ``require_subscription``.
            tag: opaque value reported back in :class:`Delivered` (and in connect/disconnect events
                while unacknowledged).
            require_subscription: only deliver if one of the client's filters matches ``topic``.
            covering: filters the caller knows match ``topic`` (the fanout edge tracks the ones covering
                the delivery filter); if one is still subscribed with a granted QoS >= ``qos``, the scan
                of every filter (``topic_matches`` per filter, the costliest step of a delivery) is skipped.
            dup: DUP=1 on the first PUBLISH (QoS >= 1): the caller knows it may be a redelivery.

        Returns:
            A :class:`DeliverStatus`.
        """
        s = self.sessions.get(client_id)
        if s is None or s.conn is None:
            return DeliverStatus.NOT_CONNECTED
        if require_subscription:
            granted = -1
            if covering:
                subs = s.subs
                for f in covering:
                    g = subs.get(f, -1)
                    if g > granted:
                        granted = g
                if granted < qos:  # another filter may grant more: decide on all of them
                    granted = -1
            if granted < 0:
                for f, g in s.subs.items():
                    if g > granted and topic_matches(f, topic):
                        granted = g
            if granted < 0:
                return DeliverStatus.NOT_SUBSCRIBED
            if granted < qos:
                qos = granted
        if qos == 0:
            self._write(s.conn, encode_publish(topic, payload, 0, False, False, None))
            self.pub_sent += 1
            if tag is not None:
                self._emit(Delivered(client_id, tag, 0))
            return _SENT
        return self._send_msg(s, OutMsg(topic, payload, qos, False, tag, dup))

    def publish_local(self: "Broker", topic: str, payload: bytes, qos: int = 0, retain: bool = False) -> int:
        """Publish to local subscribers only (a message forwarded from another node).

        No ACL check, no hooks, no :class:`LocalPublish` event (so nothing is forwarded back). A
        retained message is stored (mirrored) here too.

        Returns:
            The number of local sessions the message was given to.
        """
        return self._route(topic, payload, qos, retain)

    def _publish_internal(self: "Broker", topic: str, payload: bytes, qos: int, retain: bool,
                          client_id: str | None = None) -> int:
        """Publish a server-originated message (will, $SYS): routed, and forwarded when enabled."""
        if self._forward:
            self._emit(LocalPublish(client_id, topic, payload, qos, retain))
        return self._route(topic, payload, qos, retain)

    def _replay_retained(self: "Broker", s: Session, topic_filter: str, granted: int) -> None:
        """Send the retained messages matching a new subscription, RETAIN=1 (MQTT-3.3.1-6, -8)."""
        conn = s.conn
        for topic, payload, rqos in self.retained.matching(topic_filter):
            q = rqos if rqos < granted else granted
            if q == 0:
                self._write(conn, encode_publish(topic, payload, 0, True, False, None))
                self.pub_sent += 1
            else:
                self._send_msg(s, OutMsg(topic, payload, q, True))


__all__ = ["Routing", "MATCH_CACHE_SIZE"]
