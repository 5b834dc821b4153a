"""PUBLISH and acknowledgements from MQTT 5 clients.

Strategy: the rules of :mod:`inbound` (ACL, topic bounds, ingest interception, QoS 2 "method A") with
what MQTT 5 adds:

- Topic Alias: an alias over the announced Topic Alias Maximum (or 0, refused by the decoder) is
  DISCONNECT 0x94 (MQTT-3.3.2-9/10); a PUBLISH with a topic and an alias sets the alias, one with an empty
  topic uses it, and an alias never set is a Protocol Error (3.3.2.3.4);
- a Subscription Identifier from a client is a Protocol Error (MQTT-3.3.4-6);
- Receive Maximum: a QoS 1/2 PUBLISH when ``mqtt.receive_maximum`` are unacknowledged (intercepted
  publishes awaiting durability, QoS 2 awaiting PUBREL) is DISCONNECT 0x93 (MQTT-3.3.4-8);
- refusals are answered, not hidden: PUBACK/PUBREC 0x87 (Not authorized) for a topic the ACL refuses,
  0x90 (Topic Name invalid) over the topic bounds, 0x99 (Payload format invalid) for a payload declared
  UTF-8 that is not (3.3.2.3.2); 0x10 (No matching subscribers) when nobody received it (only on a
  broker that does not forward publishes to other nodes: there it cannot know);
- the properties the message carries go with it (:mod:`message5`).

A PUBREC with a failure code ends that QoS 2 exchange: the message leaves the window without PUBREL
(4.3.3); the other acknowledgements are handled as in 3.1.1 (their packet id is all that matters).
"""
from __future__ import annotations

from typing import Any

from .codec import encode_puback, encode_puback5, encode_pubrec5
from .connection import Connection
from .delivery import Delivery
from .errors import ProtocolError
from .events import Heartbeat, LocalPublish
from .inbound import Inbound
from .lifecycle import Lifecycle
from .message5 import forwarded_properties, message_props
from .packets5 import Publish5, Pubrec5
from .properties import EMPTY_PROPERTIES
from .property_block import is_alias_only
from .reason_codes import ReasonCode as RC
from .state import BrokerState
from .topics import over_limits


class Inbound5:
    """PUBLISH and PUBREC from MQTT 5 clients.

    Args:
        state: the broker's shared state.
        delivery: routes accepted messages, takes acknowledgements.
        lifecycle: closes a connection with a DISCONNECT reason code.
        inbound: the 3.1.1 inbound path (ACL cache, ingest interception).
    """

    def __init__(self, state: BrokerState, delivery: Delivery, lifecycle: Lifecycle, inbound: Inbound) -> None:
        self._st = state
        self._delivery = delivery
        self._lifecycle = lifecycle
        self._inbound = inbound
        self._receive_maximum = state.settings.receive_maximum
        self._max_levels = state.settings.max_topic_levels
        self._max_length = state.settings.max_topic_length_bytes

    def _disconnect(self, conn: Connection, code: int, reason: str) -> None:
        exc = ProtocolError(reason)
        exc.reason_code = code
        self._lifecycle.protocol_error(conn, exc)

    def _ack(self, conn: Connection, qos: int, packet_id: Any, code: int) -> None:
        if qos == 1:
            self._st.write(conn, encode_puback5(packet_id, code))
        elif qos == 2:
            self._st.write(conn, encode_pubrec5(packet_id, code))

    def on_publish(self, conn: Connection, p: Publish5) -> None:
        st = self._st
        st.pub_received += 1
        topic = p.topic
        props = p.properties
        qos = p.qos
        msg = None
        if props is not EMPTY_PROPERTIES:
            alias = props.topic_alias
            if alias is not None:
                link = conn.v5
                if alias > link.topic_alias_maximum:
                    self._disconnect(conn, RC.TOPIC_ALIAS_INVALID,
                                     f"topic alias {alias} over the maximum {link.topic_alias_maximum} (MQTT-3.3.2-10)")
                    return
                if topic:
                    link.aliases[alias] = topic
                else:
                    topic = link.aliases.get(alias, "")
                    if not topic:
                        self._disconnect(conn, RC.PROTOCOL_ERROR, f"topic alias {alias} was never set (3.3.2.3.4)")
                        return
            if not is_alias_only(props):  # the interned alias-only value carries nothing else to check
                if props.subscription_identifiers:
                    self._disconnect(conn, RC.PROTOCOL_ERROR, "Subscription Identifier from a client (MQTT-3.3.4-6)")
                    return
                if props.payload_format_indicator == 1:
                    try:
                        p.payload.decode("utf-8")
                    except UnicodeDecodeError:
                        self._ack(conn, qos, p.packet_id, RC.PAYLOAD_FORMAT_INVALID)
                        return
                msg = message_props(props, st.now)
        s = conn.session
        if qos and (conn.pending_ingest or s.inbound_qos2):  # else nothing is unacknowledged
            pending = conn.pending_ingest
            q2 = s.inbound_qos2
            pid = p.packet_id
            unacked = (len(pending) if pending else 0) + (len(q2) if q2 else 0)
            if unacked >= self._receive_maximum and not (pending and pid in pending) and not (q2 and pid in q2):
                self._disconnect(conn, RC.RECEIVE_MAXIMUM_EXCEEDED,
                                 f"more than Receive Maximum {self._receive_maximum} unacknowledged (MQTT-3.3.4-8)")
                return
        cache = conn.acl_cache
        allowed = cache.get(topic) if cache is not None else None  # a cached topic is within the bounds
        if allowed is None:
            allowed = self._inbound.acl_allows(conn, topic)  # a topic over the bounds: refused, the hit counted
            if not allowed and over_limits(topic, self._max_levels, self._max_length) is not None:
                st.pub_denied += 1
                self._ack(conn, qos, p.packet_id, RC.TOPIC_NAME_INVALID)
                return
        if not allowed:
            st.pub_denied += 1
            self._ack(conn, qos, p.packet_id, RC.NOT_AUTHORIZED)
            return
        if st.hooked:
            if st.ingest_prefix is not None and topic.startswith(st.ingest_prefix):
                if topic is not p.topic or props.topic_alias is not None:  # the ticket names the topic itself
                    p = Publish5(topic, p.payload, qos, p.retain, p.dup, p.packet_id,
                                 props.replace(topic_alias=None) if props is not EMPTY_PROPERTIES else props)
                self._inbound.ingest(conn, p)
                return
            if st.heartbeat_prefix is not None and topic.startswith(st.heartbeat_prefix):
                st.emit(Heartbeat(conn.client_id, conn.generation, topic, p.payload))  # type: ignore[arg-type]
            if st.forward:
                st.emit(LocalPublish(conn.client_id, topic, p.payload, qos, p.retain,
                                     forwarded_properties(props) if msg is not None else None))
            durable = st.durable
            if durable is not None and durable(topic):  # routed now, acknowledged once appended
                if topic is not p.topic or props.topic_alias is not None:  # the ticket names the topic itself
                    p = Publish5(topic, p.payload, qos, p.retain, p.dup, p.packet_id,
                                 props.replace(topic_alias=None) if props is not EMPTY_PROPERTIES else props)
                if self._inbound.ingest(conn, p, routed=True):
                    self._delivery.route(topic, p.payload, qos, p.retain, msg, conn.client_id)
                return
        delivery = self._delivery
        if qos == 2:
            if not s.qos2_received(p.packet_id):
                self._ack(conn, 2, p.packet_id, 0)  # a DUP resend: routed the first time
                return
            n = delivery.route(topic, p.payload, 2, p.retain, msg, conn.client_id)
            st.write(conn, encode_pubrec5(p.packet_id, 0 if n or st.forward else RC.NO_MATCHING_SUBSCRIBERS))
            return
        # Delivery.route inlined, as in Inbound.on_publish: the per-message path of QoS 0 and 1
        payload = p.payload
        if p.retain:
            delivery.retain(topic, payload, qos, conn.client_id, msg)
        subs = st.match_cache.get(topic)
        if subs is None:
            subs = delivery.match(topic)
        n = 0
        if subs:
            delivery.fanout(topic, payload, qos, subs, False, msg, conn.client_id, p.retain)
            n = len(subs)
        shared = st.shared
        if shared is not None and shared.groups:
            n += shared.route(topic, payload, qos, msg, p.retain, None)
        if qos:
            # 0x10 only when this broker alone decides: forwarded to other nodes, it may have subscribers there;
            # success is the short PUBACK, the same 4 bytes as 3.1.1's (3.4.2.1)
            out = conn.out  # BrokerState.write inlined
            if not out:
                dirty = st.dirty
                if not dirty:
                    st.wake()
                dirty.append(conn)
            out.append(encode_puback(p.packet_id) if n or st.forward
                       else encode_puback5(p.packet_id, RC.NO_MATCHING_SUBSCRIBERS))
            st.msgs_sent += 1

    def on_pubrec(self, conn: Connection, p: Pubrec5) -> None:
        if p.reason_code < 0x80:
            self._delivery.on_pubrec(conn, p)  # type: ignore[arg-type]
            return
        s = conn.session
        m = s.inflight.get(p.packet_id)
        if m is None or m.qos != 2:
            self._st.acks_unknown += 1
            return
        del s.inflight[p.packet_id]  # the receiver refused it: the exchange ends here (4.3.3)
        s.bytes -= m.size
        if s.queue:
            self._delivery.drain(s)


__all__ = ["Inbound5"]
