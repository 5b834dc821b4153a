"""SUBSCRIBE and UNSUBSCRIBE from MQTT 5 clients: subscription options, identifiers, reason codes, shared
subscriptions.

Strategy: the checks and bounds are those of :mod:`subscriptions` (3.1.1), answered with MQTT 5 reason
codes instead of 0x80: over ``mqtt.max_topic_levels``/``max_topic_length`` or invalid 0x8F (Topic Filter
invalid), refused by the ACL 0x80 (Unspecified error, as in 3.1.1), past ``mqtt.max_subscriptions_per_client`` 0x97 (Quota
exceeded); granted filters get their QoS (MQTT-3.9.3-1). Options (3.8.3.1):

- No Local, Retain As Published and the SUBSCRIBE's Subscription Identifier are kept per filter in the
  session's ``opts`` (:class:`SubOpts`; only for filters that have one), read by
  :meth:`fanout.mqtt.delivery.Delivery.give5` for every message to that session; a SUBSCRIBE without an
  identifier removes the filter's old one (MQTT-3.8.4-3 replaces the subscription);
- Retain Handling: 0 replays retained messages, 1 only when the subscription is new, 2 never
  (MQTT-3.3.1-9/10/11); never for a shared subscription (4.8.2);
- ``$share/<group>/<filter>`` joins a group of :mod:`shared` (the ACL and the bounds apply to the inner
  filter).

UNSUBACK carries 0x00 per removed filter and 0x11 (No subscription existed) otherwise (MQTT-3.11.3-1).
"""
from __future__ import annotations

import structlog

from .codec import encode_suback5, encode_unsuback5
from .connection import Connection
from .delivery import Delivery
from .events import Subscribed, Unsubscribed
from .packets5 import Subscribe5, Unsubscribe5
from .reason_codes import ReasonCode as RC
from .session import Session
from .shared import parse_shared
from .state import BrokerState
from .subopts import SubOpts
from .subscriptions import Subscriptions

log = structlog.get_logger(__name__)


# Subscriptions.refusal's answer -> SUBACK reason code. A filter the ACL refuses gets 0x80 (Unspecified
# error, "the Server does not wish to accept it"), as in 3.1.1 and as the Eclipse Paho MQTT 5
# interoperability suite expects for its test/nosubscribe filter; 0x87 would be as valid.
_CODES = {"invalid": RC.TOPIC_FILTER_INVALID, "not_authorised": RC.UNSPECIFIED_ERROR, "quota": RC.QUOTA_EXCEEDED}


class Subscriptions5:
    """MQTT 5 subscription changes over one :class:`BrokerState`; ``delivery`` replays retained messages,
    ``v3`` (the 3.1.1 :class:`Subscriptions`) checks filters against the ACL and the bounds."""

    def __init__(self, state: BrokerState, delivery: Delivery, v3: Subscriptions) -> None:
        self._st = state
        self._delivery = delivery
        self._v3 = v3  # the checks and bounds, shared with 3.1.1

    def _refusal(self, conn: Connection, s: Session, topic_filter: str) -> tuple[int, str | None]:
        """(reason code, inner filter of a shared subscription) for ``topic_filter``; code 0 = grant."""
        try:
            shared = parse_shared(topic_filter)
        except ValueError as exc:
            log.info("mqtt subscribe refused", client_id=s.client_id, topic_filter=topic_filter, reason=str(exc))
            return RC.TOPIC_FILTER_INVALID, None
        inner = shared[1] if shared is not None else None
        why = self._v3.refusal(conn, s, topic_filter, inner)
        if why is not None:
            return _CODES[why], None
        return 0, inner

    def on_subscribe(self, conn: Connection, p: Subscribe5) -> None:
        st = self._st
        s: Session = conn.session
        cid = s.client_id
        ids = p.properties.subscription_identifiers
        sub_id = ids[0] if ids else None
        if s.opts is None:
            s.opts = {}
        opts = s.opts
        codes: list[int] = []
        granted: list[tuple[str, int]] = []
        replay: list[tuple[str, int]] = []
        for sub in p.subscriptions:
            topic_filter = sub.topic_filter
            code, inner = self._refusal(conn, s, topic_filter)
            if code:
                codes.append(code)
                continue
            qos = sub.qos
            existed = topic_filter in s.subs
            if inner is not None:
                if not (st.hooks is not None and st.hooks.claims_shared(topic_filter[7:-len(inner) - 1], inner)):
                    st.shared.add(topic_filter, inner, cid, qos)  # else the embedding serves it (hooks.claims_shared)
            else:
                # refusal() validated the filter; MQTT-3.8.4-3: replaces an identical filter
                st.trie.add(topic_filter, cid, qos, validated=True)
            if not existed:
                st.subscription_count += 1
            s.subs[topic_filter] = qos
            if sub.no_local or sub.retain_as_published or sub_id:
                opts[topic_filter] = SubOpts(sub.no_local, sub.retain_as_published, sub_id)
            else:
                opts.pop(topic_filter, None)
            codes.append(qos)
            granted.append((topic_filter, qos))
            if inner is None and (sub.retain_handling == 0 or (sub.retain_handling == 1 and not existed)):
                replay.append((topic_filter, qos))
        if granted:
            st.match_cache.clear()
        st.write(conn, encode_suback5(p.packet_id, codes))  # MQTT-3.8.4-1, MQTT-3.9.3-1
        sub_ids = (sub_id,) if sub_id else ()
        for topic_filter, qos in replay:
            self._delivery.replay_retained(s, topic_filter, qos, sub_ids)
        if granted:
            st.emit(Subscribed(cid, conn.generation, tuple(granted), p.properties.user_properties))

    def on_unsubscribe(self, conn: Connection, p: Unsubscribe5) -> None:
        st = self._st
        s: Session = conn.session
        removed = []
        codes = []
        for topic_filter in p.topics:
            if s.subs.pop(topic_filter, None) is None:
                codes.append(RC.NO_SUBSCRIPTION_EXISTED)
                continue
            try:
                shared = parse_shared(topic_filter)
            except ValueError:
                shared = None
            if shared is not None:
                st.shared.remove(topic_filter, shared[1], s.client_id)
            else:
                st.trie.remove(topic_filter, s.client_id)
            if s.opts:
                s.opts.pop(topic_filter, None)
            st.subscription_count -= 1
            removed.append(topic_filter)
            codes.append(RC.SUCCESS)
        if removed:
            st.match_cache.clear()
            st.emit(Unsubscribed(s.client_id, conn.generation, tuple(removed)))
        st.write(conn, encode_unsuback5(p.packet_id, codes))  # MQTT-3.11.3-1


__all__ = ["Subscriptions5", "SubOpts"]
