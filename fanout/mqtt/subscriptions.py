"""SUBSCRIBE and UNSUBSCRIBE of the broker core.

Strategy: a filter is granted when it is within ``mqtt.max_topic_levels`` and ``mqtt.max_topic_length``
(checked first, before anything splits it), valid (section 4.7), allowed by the ACL, and new filters stay
within ``mqtt.max_subscriptions_per_client``; else its SUBACK code is 0x80 and the reason is logged (a
bound through :mod:`caps`); a granted filter replaces an identical one of the same client
(MQTT-3.8.4-3) in the session and in the broker's trie, which is the routing table. Any change clears the
match cache. The SUBACK is written before the retained messages the new filters match; UNSUBACK is sent
even when nothing matched (MQTT-3.10.4-4/5).
"""
from __future__ import annotations

import structlog

from .codec import encode_suback, encode_unsuback
from .connection import Connection
from .delivery import Delivery
from .events import Subscribed, Unsubscribed
from .packets import SUBACK_FAILURE, Subscribe, Unsubscribe
from .session import Session
from .state import BrokerState
from .topics import InvalidTopic, over_limits, validate_topic_filter

log = structlog.get_logger(__name__)


class Subscriptions:
    """Subscription changes over one :class:`BrokerState`; ``delivery`` replays retained messages."""

    def __init__(self, state: BrokerState, delivery: Delivery) -> None:
        self._st = state
        self._delivery = delivery
        s = state.settings
        self._max_levels = s.max_topic_levels
        self._max_length = s.max_topic_length_bytes
        self._max_subs = s.max_subscriptions_per_client

    def on_subscribe(self, conn: Connection, p: Subscribe) -> None:
        st = self._st
        s: Session = conn.session
        cid = s.client_id
        codes = []
        granted = []
        for topic_filter, qos in p.topics:
            if self.refusal(conn, s, topic_filter, self._claimed_inner(topic_filter)) is not None:
                codes.append(SUBACK_FAILURE)
                continue
            # refusal() validated the filter; MQTT-3.8.4-3: replaces an identical filter
            st.trie.add(topic_filter, cid, qos, validated=True)
            if topic_filter not in s.subs:
                st.subscription_count += 1
            s.subs[topic_filter] = qos
            if s.opts:
                s.opts.pop(topic_filter, None)  # a 3.1.1 SUBSCRIBE replaces an MQTT 5 one with its options
            codes.append(qos)
            granted.append((topic_filter, qos))
        if granted:
            st.match_cache.clear()
        st.write(conn, encode_suback(p.packet_id, codes))  # MQTT-3.8.4-1, MQTT-3.9.3-1
        for topic_filter, qos in granted:
            self._delivery.replay_retained(s, topic_filter, qos)
        if granted:
            st.emit(Subscribed(cid, conn.generation, tuple(granted), ()))

    def _claimed_inner(self, topic_filter: str) -> str | None:
        """The inner filter of a ``$share/<group>/<filter>`` the hooks serve (``BrokerHooks.claims_shared``),
        checked in its place; None for any other filter (3.1.1 has no shared subscriptions otherwise)."""
        hooks = self._st.hooks
        if hooks is None or not topic_filter.startswith("$share/"):
            return None
        group, _sep, inner = topic_filter[7:].partition("/")
        return inner if group and inner and "+" not in group and "#" not in group and hooks.claims_shared(group, inner) else None

    def refusal(self, conn: Connection, s: Session, topic_filter: str, inner: str | None = None) -> str | None:
        """Why ``topic_filter`` is not granted (``invalid``, ``not_authorised``, ``quota``), logged or counted
        as a bound hit; None when it is. ``inner``: the filter of a shared subscription (checked and
        authorised in place of ``topic_filter``)."""
        st = self._st
        cid = s.client_id
        over = over_limits(topic_filter, self._max_levels, self._max_length)
        if over is not None:
            st.caps.hit(over, client_id=cid, peer=conn.peer, length=len(topic_filter),
                        levels=topic_filter.count("/") + 1)
            return "invalid"
        checked = topic_filter if inner is None else inner
        try:
            validate_topic_filter(checked)
        except InvalidTopic as exc:
            log.info("mqtt subscribe refused", client_id=cid, topic_filter=topic_filter, reason=str(exc))
            return "invalid"
        if not st.acl.can_subscribe(conn.principal, checked):
            log.info("mqtt subscribe refused", client_id=cid, topic_filter=topic_filter, reason="not authorised")
            return "not_authorised"
        if topic_filter not in s.subs and len(s.subs) >= self._max_subs:
            st.caps.hit("subscriptions", client_id=cid, peer=conn.peer, subscriptions=len(s.subs))
            return "quota"
        return None

    def on_unsubscribe(self, conn: Connection, p: Unsubscribe) -> None:
        st = self._st
        s: Session = conn.session
        removed = []
        for topic_filter in p.topics:
            if s.subs.pop(topic_filter, None) is not None:
                if s.opts:
                    s.opts.pop(topic_filter, None)
                st.trie.remove(topic_filter, s.client_id)
                st.subscription_count -= 1
                removed.append(topic_filter)
        if removed:
            st.match_cache.clear()
            st.emit(Unsubscribed(s.client_id, conn.generation, tuple(removed)))
        st.write(conn, encode_unsuback(p.packet_id))  # MQTT-3.10.4-4/5: even when nothing matched

    def route_filters(self) -> list[str]:
        """Distinct topic filters subscribed on this node (the route table other nodes forward by). MQTT 5
        shared subscriptions are not among them: a cluster announces them as groups with member counts
        (:meth:`SharedSubscriptions.local_counts`) and the publishing node places each message."""
        return list(self._st.trie.filters())


__all__ = ["Subscriptions"]
