"""Inbound PUBLISH of the broker core: the publish ACL, QoS 0/1/2 acknowledgement of what a client
publishes, and ingest interception (publishes under the hooks' ingest prefix are acknowledged only once
the embedding layer made them durable: :meth:`Inbound.complete_publish` / :meth:`Inbound.reject_publish`).

Strategy: :meth:`Inbound.on_publish` runs once per received message, so it keeps to the rules of
:mod:`delivery` (no logging, no string formatting, counters only); a publish the ACL refuses is
acknowledged but not delivered (3.1.1 has no way to refuse a PUBLISH short of closing the connection,
Mosquitto does the same) and logged once per connection and topic through the per-connection ACL cache.
A topic over ``mqtt.max_topic_length`` or ``mqtt.max_topic_levels`` is refused the same way, counted as
a bound hit and never cached, so the caches stay within their entry count x the topic length bound.
QoS 2 uses "method A" of the spec's figure 4.3: route on PUBLISH, remember the packet id until PUBREL so
that a DUP resend is not routed twice (MQTT-4.3.3-2).
"""
from __future__ import annotations

import json
from logging import INFO
from typing import Any

import structlog

from .codec import encode_puback, encode_pubcomp, encode_pubrec
from .link5 import negative_ack5
from .log_level import enabled as log_enabled
from .connection import CONNECTED, Connection
from .delivery import Delivery
from .events import Heartbeat, IngestTicket, LocalPublish
from .lifecycle import Lifecycle
from .packets import Publish, Pubrel
from .state import BrokerState
from .topics import over_limits

log = structlog.get_logger(__name__)

ACL_CACHE_SIZE = 256


class Inbound:
    """PUBLISH and PUBREL from clients, and the deferred acknowledgement of intercepted publishes.

    Args:
        state: the broker's shared state.
        delivery: routes accepted messages.
        lifecycle: closes a connection whose intercepted publish is rejected.
    """

    def __init__(self, state: BrokerState, delivery: Delivery, lifecycle: Lifecycle) -> None:
        self._st = state
        self._delivery = delivery
        self._lifecycle = lifecycle
        self._write = state.write
        self._emit = state.emit
        self._fanout = delivery.fanout
        self._match = delivery.match
        self._max_levels = state.settings.max_topic_levels
        self._max_length = state.settings.max_topic_length_bytes

    def on_publish(self, conn: Connection, p: Publish) -> None:
        st = self._st
        st.pub_received += 1
        topic = p.topic
        cache = conn.acl_cache  # acl_allows inlined: the per-message path
        if cache is None:
            cache = conn.acl_cache = {}
        allowed = cache.get(topic)
        if allowed is None:
            allowed = self._acl_publish(conn, topic, cache)
        qos = p.qos
        if not allowed:
            st.pub_denied += 1
            if qos == 1:
                self._write(conn, encode_puback(p.packet_id))  # type: ignore[arg-type]
            elif qos == 2:
                self._write(conn, encode_pubrec(p.packet_id))  # type: ignore[arg-type]
            return
        if st.hooked:
            if st.ingest_prefix is not None and topic.startswith(st.ingest_prefix):
                self.ingest(conn, p)
                return
            if st.heartbeat_prefix is not None and topic.startswith(st.heartbeat_prefix):
                self._emit(Heartbeat(conn.client_id, conn.generation, topic, p.payload))  # type: ignore[arg-type]
            if st.forward:
                self._emit(LocalPublish(conn.client_id, topic, p.payload, qos, p.retain, None))
            durable = st.durable
            if durable is not None and durable(topic):  # routed now, acknowledged once appended
                if self.ingest(conn, p, routed=True):
                    self._delivery.route(topic, p.payload, qos, p.retain, None, conn.client_id)
                return
        if qos != 2:
            # Delivery.route inlined: this is the per-message path of QoS 0 and 1
            payload = p.payload
            if p.retain:
                self._delivery.retain(topic, payload, qos, conn.client_id)
            subs = st.match_cache.get(topic)
            if subs is None:
                subs = self._match(topic)
            if subs:
                self._fanout(topic, payload, qos, subs, False, None, conn.client_id, p.retain)
            shared = st.shared
            if shared is not None and shared.groups:
                shared.route(topic, payload, qos, None, p.retain)
            if qos:
                out = conn.out  # BrokerState.write inlined
                if not out:
                    dirty = st.dirty
                    if not dirty:
                        st.wake()
                    dirty.append(conn)
                out.append(encode_puback(p.packet_id))  # type: ignore[arg-type]
                st.msgs_sent += 1
            return
        if conn.session.qos2_received(p.packet_id):
            self._delivery.route(topic, p.payload, 2, p.retain, None, conn.client_id)
        self._write(conn, encode_pubrec(p.packet_id))  # type: ignore[arg-type]

    def acl_allows(self, conn: Connection, topic: str) -> bool:
        """The publish ACL for ``topic`` through the connection's cache (bounds included, never cached)."""
        cache = conn.acl_cache
        if cache is None:
            cache = conn.acl_cache = {}
        allowed = cache.get(topic)
        if allowed is None:
            allowed = self._acl_publish(conn, topic, cache)
        return allowed

    def _acl_publish(self, conn: Connection, topic: str, cache: dict[str, bool]) -> bool:
        over = over_limits(topic, self._max_levels, self._max_length)
        if over is not None:  # refused like a denied topic, and not cached: no table grows with it
            self._st.caps.hit(over, client_id=conn.client_id, peer=conn.peer, length=len(topic),
                              levels=topic.count("/") + 1)
            return False
        allowed = self._st.acl.can_publish(conn.principal, topic)
        if len(cache) >= ACL_CACHE_SIZE:
            cache.clear()
        cache[topic] = allowed
        if not allowed:
            if log_enabled(INFO):  # a client may publish where it may not at line rate: keep the refusal cheap
                log.info("mqtt publish denied", client_id=conn.client_id, topic=topic)
        return allowed

    def on_pubrel(self, conn: Connection, p: Pubrel) -> None:
        conn.session.qos2_released(p.packet_id)
        self._write(conn, encode_pubcomp(p.packet_id))  # always, even for an unknown id (MQTT-4.3.3-2)

    # -- ingest interception -----------------------------------------------------------------

    def ingest(self, conn: Connection, p: Any, routed: bool = False) -> bool:
        """Hand an intercepted publish to the embedding (an :class:`IngestTicket`); acknowledged later.

        ``routed``: a publish on one of the hooks' durable topics, which the caller routes when this returns
        True (a ticket was emitted); False means a resend of one being written or already stored.
        """
        pid = p.packet_id
        if pid is not None:
            pending = conn.pending_ingest
            if pending is None:
                pending = conn.pending_ingest = {}
            elif pid in pending:
                return False  # DUP resend while the first copy is being written: its ack will answer both
            q2 = conn.session.inbound_qos2
            if p.qos == 2 and q2 is not None and pid in q2:
                self._write(conn, encode_pubrec(pid))  # already stored, awaiting PUBREL
                return False
            pending[pid] = p.qos
        props = getattr(p, "properties", None)  # MQTT 5 (Publish5); a 3.1.1 Publish has none
        self._emit(IngestTicket(conn.client_id, conn.generation, pid, p.topic, p.payload, p.qos, p.retain, p.dup,  # type: ignore[arg-type]
                                props, routed))
        return True

    def _ingest_conn(self, client_id: str, generation: int | None) -> Connection | None:
        s = self._st.sessions.get(client_id)
        conn = s.conn if s is not None else None
        if conn is None or conn.state is not CONNECTED:
            return None
        if generation is not None and conn.generation != generation:
            return None
        return conn

    def complete_publish(self, client_id: str, packet_id: int | None, generation: int | None = None) -> bool:
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

    def reject_publish(self, client_id: str, packet_id: int | None, error: str | dict[str, Any],
                       generation: int | None = None) -> bool:
        """Refuse an intercepted publish: publish a JSON error on ``<ingest prefix>errors/<client_id>``,
        then close that connection (its will is published: the server ended it, not the client).

        An MQTT 5 client instead gets a negative PUBACK/PUBREC (``error["reason_code"]``, default 0x99
        Payload format invalid, with the message as Reason String when it asked for problem information)
        and keeps its connection; a QoS 0 publish has nothing to answer and is only logged.

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
        qos = conn.pending_ingest.pop(packet_id, None) if conn.pending_ingest else None  # type: ignore[arg-type]
        if conn.v5 is not None:
            if qos is not None:
                self._write(conn, negative_ack5(conn, qos, packet_id, body))  # type: ignore[arg-type]
            log.warning("mqtt publish rejected", client_id=client_id, packet_id=packet_id, error=body)
            return True
        topic = f"{self._st.error_prefix}{client_id}"
        self._delivery.route(topic, json.dumps(body, separators=(",", ":")).encode(), 1, False)
        log.warning("mqtt publish rejected", client_id=client_id, packet_id=packet_id, error=body)
        self._lifecycle.close(conn, "rejected", will=True)
        return True


__all__ = ["Inbound", "ACL_CACHE_SIZE"]
