# Over 500 lines: one outbound flow (routing, inflight window, acknowledgements, the deliver API) on the per-delivery path; its MQTT 5 parts are in fanout5.py and message5.py.
"""Outbound message flow of the broker core: routing a message to the matching sessions, the inflight
window and the session queue, the clients' acknowledgements of what was sent, and the embedding API that
sends (``deliver``, ``publish_local``).

Strategy: this is the per-message hot path, written for CPython speed:

- never log, never format strings, never build events unless hooks are installed; only bump integer
  counters on the shared :class:`BrokerState`;
- write by appending bytes to ``conn.out``; the first append of a connection registers it in the
  state's dirty list, which :meth:`Broker.flush` joins into one write per connection per loop iteration;
- route through the subscription trie behind a small cache (topic -> {client id: granted QoS}) that is
  invalidated by any subscription change; a QoS 0 PUBLISH is encoded once for all its recipients;
- ACL held at delivery: a session receives a message only if its principal may read the topic
  (``AccessControl.can_read``: the subscribe rules applied to the topic name, then the role's policy),
  whatever filter matched. Routed messages (client publishes, wills, ``$SYS``, forwards) are filtered
  when the trie result is cached, so a cache hit costs nothing more; retained replay asks per message
  (a cached dict lookup); :meth:`Delivery.deliver`, whose topics are all new (one per request id), asks once
  per session and covering filter ``P/+`` when ``AccessControl.reads_every_topic_under`` says the answer holds
  for every topic one level under ``P/``, else per message. Refusals are counted
  (``deliveries_denied``, ``$SYS/broker/publish/messages/denied at delivery``);
- deliver at min(publish QoS, granted QoS), once per client even with overlapping subscriptions (the
  trie already returns the maximum granted QoS per client), with RETAIN=0 on routed messages
  (MQTT-3.3.1-9) and RETAIN=1 only for retained messages replayed on subscribe (MQTT-3.3.1-8);
- QoS 1/2 go through the session's inflight window (a count, and the session's byte bound with the
  queue); what does not fit (or finds the client offline) is queued in the session, bounded by count,
  by the session's bytes and by the node's queued bytes (offline sessions by their part of them), with
  counted drops (logged once per sweep by
  :meth:`report_drops`; the byte bounds also as :mod:`caps` hits).
"""
from __future__ import annotations

import struct
from typing import Any, Hashable, Iterable

import structlog

from .codec import encode_publish, encode_publish5, encode_pubrel
from .connection import Connection
from .events import Delivered, DeliveryDropped, LocalPublish
from .hooks import DeliverStatus
from .fanout5 import fanout5, publish_parts
from .message5 import MsgProps, message_props, out_publish, publish_bytes
from .property_block import topic_alias_property
from .packets import Puback, Pubcomp, Pubrec
from .session import SENT, OutMsg, Session
from .state import BrokerState
from .subopts import apply_options
from .topics import topic_matches

log = structlog.get_logger(__name__)

_U16 = struct.Struct(">H").pack
_SENT = DeliverStatus.SENT
# Session.drop_reason of a byte bound -> its name in caps.CAPS
_BYTE_CAPS = {"mqtt.max_session_bytes": "session_bytes", "mqtt.max_queued_bytes": "queued_bytes",
              "mqtt.offline_queued_fraction": "offline_queued_bytes"}
_QUEUED = DeliverStatus.QUEUED


class Delivery:
    """Routing and outbound delivery over one :class:`BrokerState`."""

    def __init__(self, state: BrokerState) -> None:
        self._st = state
        self._write = state.write
        self._emit = state.emit
        # ACL at delivery: None for an access-control object without read rules (an embedding's own)
        self._can_read = getattr(state.acl, "can_read", None)
        self._retained_props: dict[str, MsgProps] = {}  # topic -> MQTT 5 properties of its retained message
        self._reads_under = getattr(state.acl, "reads_every_topic_under", None)
        self._cache_entries = state.settings.match_cache_entries

    # -- routing -----------------------------------------------------------------------------

    def route(self, topic: str, payload: bytes, qos: int, retain: bool, props: MsgProps | None = None,
              sender: str | None = None, serve: Iterable[str] | None = None) -> int:
        """Store a retained message if asked, then deliver to every matching subscription.

        Args:
            topic, payload, qos, retain: the message.
            props: its MQTT 5 properties, or None.
            sender: the publisher's client id (MQTT 5 No Local), None for the server's own messages.
            serve: the shared groups another node placed here (a forwarded message), None for a message
                entering here (:meth:`SharedSubscriptions.route`).

        Returns:
            The number of sessions the message was given to (shared groups count one each).
        """
        st = self._st
        if retain:
            self.retain(topic, payload, qos, sender, props)
        subs = st.match_cache.get(topic)
        if subs is None:
            subs = self.match(topic)
        n = 0
        if subs:
            self.fanout(topic, payload, qos, subs, False, props, sender, retain)
            n = len(subs)
        shared = st.shared
        if shared is not None and shared.groups:
            n += shared.route(topic, payload, qos, props, retain, serve)
        return n

    def retain(self, topic: str, payload: bytes, qos: int, client_id: str | None = None,
               props: MsgProps | None = None) -> None:
        """Store (or clear) the retained message of ``topic``, counting a refusal by the store's bounds.

        The MQTT 5 properties of a retained message are kept beside the store (``retained_props``), so a
        replay carries them and an expired one is not replayed (MQTT-3.3.2-5).
        """
        extra = self._retained_props
        if props is not None and payload:
            extra[topic] = props
        elif extra:
            extra.pop(topic, None)
        refused = self._st.retained.set(topic, payload, qos)
        if refused is not None:
            extra.pop(topic, None)  # not stored: no properties either
            self._st.caps.hit(refused, client_id=client_id, topic=topic[:200], payload_bytes=len(payload),
                              retained_bytes=self._st.retained.stored_bytes)

    def may_read(self, s: Session, topic: str) -> bool:
        """The ACL at delivery for one session (routed recipients in :meth:`match`, shared group members one
        message at a time); a refusal is counted as a denied delivery."""
        can_read = self._can_read
        if can_read is None or s.principal is None or can_read(s.principal, topic):
            return True
        self._st.deliveries_denied += 1
        return False

    def match(self, topic: str) -> dict[str, int]:
        """Trie match through the cache (cleared on every subscription change), keeping only the sessions
        whose principal may read ``topic`` (ACL at delivery, paid once per topic while it stays cached)."""
        st = self._st
        subs = st.trie.match(topic)
        if self._can_read is not None and subs:
            sessions = st.sessions
            may_read = self.may_read
            denied = [cid for cid in subs if (s := sessions.get(cid)) is not None and not may_read(s, topic)]
            for cid in denied:
                del subs[cid]
        cache = st.match_cache
        if len(cache) >= self._cache_entries:
            # Evict the newest entry, not all: each vehicle publishes topics of its own (heartbeat, online,
            # response), so a node's working set is one or more topics per connection, visited in turn.
            # Clearing a full cache made that turn miss every time (server_bench's 10,000 vehicles against
            # 4,096 entries); evicting the newest keeps the resident part hitting, and a client spraying new
            # topics churns one slot instead of emptying the cache of everyone.
            cache.popitem()
        cache[topic] = subs
        return subs

    def fanout(self, topic: str, payload: bytes, qos: int, subs: dict[str, int], retain: bool,
               props: MsgProps | None = None, sender: str | None = None, published_retain: bool = False) -> None:
        """Give one message to each subscriber in ``subs`` (client id -> granted QoS).

        MQTT 5 sessions (``s.opts`` not None) and messages with MQTT 5 properties go to
        :func:`~fanout.mqtt.fanout5.fanout5` after the others; ``sender`` and ``published_retain`` serve
        No Local and Retain As Published there.
        """
        st = self._st
        sessions = st.sessions
        enc0: bytes | None = None
        heads: list[bytes | None] | None = None  # per QoS: PUBLISH bytes before the packet id
        tb = topic.encode("utf-8")
        many = len(subs) > 1
        dirty = st.dirty
        limits = st.limits
        max_inflight = limits.max_inflight
        max_bytes = limits.max_bytes
        size = len(topic) + len(payload)  # OutMsg.size
        sent = 0
        dropped = 0
        batch5: list[tuple[Session, int]] | None = None
        parts5: dict[tuple[int, int], tuple[bytes, bytes, int]] | None = None  # (QoS, alias) -> fanout5's parts
        for cid, granted in subs.items():
            s = sessions.get(cid)
            if s is None:
                continue
            if s.opts is not None or props is not None:
                c = s.conn
                q = granted if granted < qos else qos
                if (props is None and q and not s.opts
                        and (c is None or s.queue or len(s.inflight) >= s.inflight_cap
                             or (s.bytes + size > max_bytes and s.bytes))):
                    # Window closed (or offline), nothing of MQTT 5 to decide now: queued as give5 ->
                    # send_msg would; the drain encodes it (aliases, Maximum Packet Size) when it is sent.
                    self.queue(s, OutMsg(topic, payload, q, False, None, False, None))
                    continue
                if (props is None and q and not s.opts and (link := c.v5) is not None
                        and ((alias := link.out_aliases.get(topic, 0)) or not link.out_alias_maximum)):
                    # A plain MQTT 5 receiver (no subscription options; no outbound aliases, or one it already
                    # holds for this topic) of a message without properties, window open (checked above): what
                    # fanout5 sends it, inlined as for 3.1.1.
                    limit = link.maximum_packet_size
                    if many:
                        if parts5 is None:
                            parts5 = {}
                        part = parts5.get((q, alias))
                        if part is None:
                            part = parts5[q, alias] = publish_parts(b"" if alias else tb, payload, q, True, None,
                                                                    st.now, alias)
                        if limit is not None and part[2] > limit:
                            if alias:  # as fanout5: give5 sends nothing and counts it
                                self.give5(s, topic, payload, qos, granted, None, sender, published_retain)
                                continue
                            st.too_large_dropped += 1  # MQTT-3.1.2-25: discarded as if sent
                            continue
                        inflight = s.inflight
                        pid = s.last_pid + 1
                        if pid > 0xFFFF or pid in inflight:
                            pid = s.alloc_pid()
                        else:
                            s.last_pid = pid
                        chunks: tuple[bytes, ...] = (part[0], _U16(pid), part[1])
                    else:
                        pid = s.last_pid + 1  # Session.alloc_pid inlined
                        if pid > 0xFFFF or pid in s.inflight:
                            pid = s.alloc_pid()
                        else:
                            s.last_pid = pid
                        data = (encode_publish5(b"", payload, q, False, False, pid, topic_alias_property(alias))
                                if alias else encode_publish5(tb, payload, q, False, False, pid, b""))
                        if limit is not None and len(data) > limit:
                            st.too_large_dropped += 1  # MQTT-3.1.2-25: discarded as if sent
                            if alias:
                                st.pub_dropped += 1  # as give5 -> send_msg -> _discard counts it
                            continue
                        chunks = (data,)
                    s.inflight[pid] = OutMsg(topic, payload, q, False, None, False, None)
                    s.bytes += size
                    out = c.out  # BrokerState.write inlined, as in the 3.1.1 branch below
                    if not out:
                        if not dirty:
                            st.wake()
                        dirty.append(c)
                    out.extend(chunks)
                    sent += 1
                    continue
                if batch5 is None:
                    batch5 = []
                batch5.append((s, granted))  # MQTT 5 session, or a message with properties: fanout5 below
                continue
            q = granted if granted < qos else qos
            c = s.conn
            if q == 0:
                if c is None:
                    continue  # QoS 0 is not queued for offline clients
                if c.write_paused:
                    dropped += 1
                    continue
                if enc0 is None:
                    enc0 = encode_publish(tb, payload, 0, retain, False, None)  # once for all recipients
                out = c.out
                if not out:
                    if not dirty:
                        st.wake()
                    dirty.append(c)
                out.append(enc0)
                sent += 1
            elif (c is not None and not s.queue and len(s.inflight) < max_inflight
                  and (s.bytes + size <= max_bytes or not s.bytes)):
                # Session.window_open + send + write inlined: the common QoS 1 case
                inflight = s.inflight
                pid = s.last_pid + 1
                if pid > 0xFFFF or pid in inflight:
                    pid = s.alloc_pid()
                else:
                    s.last_pid = pid
                inflight[pid] = OutMsg(topic, payload, q, retain)
                s.bytes += size
                out = c.out
                if not out:
                    if not dirty:
                        st.wake()
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
                sent += 1
            else:
                self.queue(s, OutMsg(topic, payload, q, retain))
        if sent:
            st.msgs_sent += sent
            st.pub_sent += sent
        if dropped:
            st.pub_dropped += dropped
        if batch5 is not None:
            fanout5(self, topic, payload, qos, batch5, props, sender, published_retain)

    def give5(self, s: Session, topic: str, payload: bytes, qos: int, granted: int, props: MsgProps | None,
              sender: str | None, published_retain: bool, sub_ids: tuple[int, ...] | None = None) -> bool:
        """Give one message to one session the MQTT 5 way (not when expired; its subscriptions' options
        decide QoS, RETAIN and Subscription Identifiers, :func:`~fanout.mqtt.subopts.apply_options`).
        ``granted``: the trie's QoS (used when no subscription has options); ``sub_ids``: identifiers the
        caller decided (a shared subscription). Returns True when the message was sent or queued.
        """
        st = self._st
        if props is not None and props.expires_ms is not None and st.now >= props.expires_ms:
            st.expired_dropped += 1  # MQTT-3.3.2-5: no onward delivery started: deleted for this subscriber
            return False
        retain = False
        if sub_ids is None:
            sub_ids = ()
            if s.opts:
                granted, retain, sub_ids = apply_options(s, topic, sender, published_retain)
                if granted < 0:
                    return False
        q = granted if granted < qos else qos
        c = s.conn
        if q == 0:
            if c is None:
                return False
            if c.write_paused:
                st.pub_dropped += 1
                return False
            data = publish_bytes(c, topic, payload, 0, retain, False, None, props, sub_ids, st.now)
            if data is None:
                st.too_large_dropped += 1
                return False
            self._write(c, data)
            st.pub_sent += 1
            return True
        return self.send_msg(s, OutMsg(topic, payload, q, retain, None, False, props, sub_ids)) is not DeliverStatus.DROPPED

    def publish_internal(self, topic: str, payload: bytes, qos: int, retain: bool, client_id: str | None = None,
                         props: MsgProps | None = None) -> int:
        """Publish a server-originated message (will, $SYS): routed, and forwarded when enabled."""
        if self._st.forward:
            self._emit(LocalPublish(client_id, topic, payload, qos, retain, None))
        return self.route(topic, payload, qos, retain, props)

    def _publish(self, conn: Connection, m: OutMsg, pid: int, dup: bool, resend: bool = False) -> bytes | None:
        """The PUBLISH of ``m`` for ``conn`` (:func:`~fanout.mqtt.message5.out_publish`).

        A message without MQTT 5 properties or Subscription Identifiers (every one from a 3.1.1 publisher,
        most from MQTT 5 ones) is encoded here as ``publish_bytes`` would, without its general path: to a
        3.1.1 receiver as such, to an MQTT 5 one with an empty property block or the Topic Alias it already
        holds for the topic; a new alias, or a packet over the receiver's Maximum Packet Size, goes the
        general way (which sets the alias, or counts the drop)."""
        link = conn.v5
        if m.props is None and not m.sub_ids:
            if link is None:
                return encode_publish(m.topic, m.payload, m.qos, m.retain, dup, pid)
            if not link.out_alias_maximum:
                data = encode_publish5(m.topic, m.payload, m.qos, m.retain, dup, pid, b"")
            else:
                alias = link.out_aliases.get(m.topic)
                if alias is None:
                    return out_publish(self._st, conn, m, pid, dup, resend)
                data = encode_publish5(b"", m.payload, m.qos, m.retain, dup, pid, topic_alias_property(alias))
            limit = link.maximum_packet_size
            if limit is None or len(data) <= limit:
                return data
        return out_publish(self._st, conn, m, pid, dup, resend)

    def _discard(self, s: Session, pid: int, m: OutMsg) -> DeliverStatus:
        """Take ``m`` (put in flight as ``pid``) back out: it is not sent (expired or too large); returns which."""
        if s.inflight.pop(pid, None) is not None:
            s.bytes -= m.size
        self._st.pub_dropped += 1
        props = m.props
        expired = props is not None and props.expires_ms is not None and self._st.now >= props.expires_ms
        if m.tag is not None:
            self._emit(DeliveryDropped(s.client_id, m.tag, not expired))
        return DeliverStatus.DROPPED if expired else DeliverStatus.TOO_LARGE

    # -- one session -------------------------------------------------------------------------

    def send_msg(self, s: Session, m: OutMsg) -> DeliverStatus:
        """Send ``m`` now if the session's window is open, else queue it."""
        if s.window_open(m.size):
            pid = s.send(m)
            data = self._publish(s.conn, m, pid, m.dup)
            if data is None:
                return self._discard(s, pid, m)
            self._write(s.conn, data)
            self._st.pub_sent += 1
            return _SENT
        return self.queue(s, m)

    def queue(self, s: Session, m: OutMsg) -> DeliverStatus:
        """Queue ``m`` in the session, counting the drops its bounds make."""
        dropped = s.enqueue(m)
        pressure = self._st.pressure
        if pressure.engaged and s.conn is not None:
            pressure.queued_for(s.conn)  # a paused connection that now has to acknowledge is read again
        if not dropped:
            return _QUEUED
        self._count_drops(s, dropped)
        return DeliverStatus.DROPPED if dropped[-1] is m else _QUEUED

    def detach(self, s: Session) -> None:
        """The session's connection ended: its queue moves to the offline part of the node budget, trimmed to
        fit it by the offline drop policy (counted as any queue drop)."""
        dropped = s.detach()
        if dropped:
            self._count_drops(s, dropped)

    def _count_drops(self, s: Session, dropped: tuple[OutMsg, ...]) -> None:
        """Count messages a session's bounds dropped, and report the tagged ones to the hooks."""
        st = self._st
        st.pub_dropped += len(dropped)
        st.drops_unreported.add(s)
        reason = s.drop_reason
        if reason != "mqtt.max_offline_messages":  # the byte bounds; the count bound is logged by report_drops
            budget = st.queue_budget
            st.caps.hit(_BYTE_CAPS[reason], client_id=s.client_id, session_bytes=s.bytes,
                        online_queued_bytes=budget.online_bytes, offline_queued_bytes=budget.offline_bytes)
        for d in dropped:
            if d.tag is not None:
                self._emit(DeliveryDropped(s.client_id, d.tag))

    def drain(self, s: Session) -> None:
        """Send queued messages while the window has room."""
        while True:
            m = s.next_sendable()
            if m is None:
                return
            pid = s.send(m)
            data = self._publish(s.conn, m, pid, m.dup)
            if data is None:
                self._discard(s, pid, m)
                continue
            self._write(s.conn, data)
            self._st.pub_sent += 1

    def resume(self, s: Session) -> None:
        """On a resumed session: resend in-flight messages (DUP=1) or their PUBREL, then the queue."""
        conn = s.conn
        for pid, m in s.resend_order():
            if m.state == SENT:
                data = self._publish(conn, m, pid, True, resend=True)
                if data is None:
                    self._discard(s, pid, m)
                    continue
                self._write(conn, data)
                self._st.pub_sent += 1
            else:
                self._write(conn, encode_pubrel(pid))
        self.drain(s)

    def replay_retained(self, s: Session, topic_filter: str, granted: int, sub_ids: tuple[int, ...] = ()) -> None:
        """Send the retained messages matching a new subscription, RETAIN=1 (MQTT-3.3.1-6, -8), with their
        MQTT 5 properties and the subscription's identifier, unless expired."""
        conn = s.conn
        can_read = self._can_read
        extra = self._retained_props
        for topic, payload, rqos in self._st.retained.matching(topic_filter):
            if can_read is not None and s.principal is not None and not can_read(s.principal, topic):
                self._st.deliveries_denied += 1
                continue  # ACL at delivery holds for retained replay too
            props = extra.get(topic) if extra else None
            q = rqos if rqos < granted else granted
            if q == 0:
                if props is None and conn.v5 is None:
                    data: bytes | None = encode_publish(topic, payload, 0, True, False, None)
                else:
                    data = self._publish(conn, OutMsg(topic, payload, 0, True, None, False, props, sub_ids), 0, False)
                if data is not None:
                    self._write(conn, data)
                    self._st.pub_sent += 1
            else:
                self.send_msg(s, OutMsg(topic, payload, q, True, None, False, props, sub_ids))

    def report_drops(self) -> None:
        """Log the queue drops since the last call, one line per session (called once per sweep)."""
        st = self._st
        limits = st.limits
        for s in st.drops_unreported:
            log.warning("mqtt session queue full, messages dropped", client_id=s.client_id,
                        dropped=s.dropped_unreported, dropped_total=s.dropped,
                        policy="oldest" if limits.drop_oldest else "newest", bound=s.drop_reason,
                        limit=limits.max_queued, session_bytes=s.bytes)
            s.dropped_unreported = 0
        st.drops_unreported.clear()

    # -- acks from the client ----------------------------------------------------------------

    def on_puback(self, conn: Connection, p: Puback) -> None:
        s = conn.session
        inflight = s.inflight
        pid = p.packet_id
        m = inflight.get(pid)
        if m is None or m.qos != 1:
            self._st.acks_unknown += 1
            return
        del inflight[pid]
        s.bytes -= m.size
        if m.tag is not None:
            self._emit(Delivered(s.client_id, m.tag, 1))
        if s.queue:
            self.drain(s)

    def on_pubrec(self, conn: Connection, p: Pubrec) -> None:
        if conn.session.pubrec(p.packet_id):
            self._write(conn, encode_pubrel(p.packet_id))
        else:
            self._st.acks_unknown += 1

    def on_pubcomp(self, conn: Connection, p: Pubcomp) -> None:
        s = conn.session
        m = s.acked(p.packet_id, 2)
        if m is None:
            self._st.acks_unknown += 1
            return
        if m.tag is not None:
            self._emit(Delivered(s.client_id, m.tag, 2))
        if s.queue:
            self.drain(s)

    # -- embedding API -----------------------------------------------------------------------

    def deliver(self, client_id: str, topic: str, payload: bytes, qos: int = 1, tag: Hashable = None,
                *, require_subscription: bool = True, covering: Iterable[str] | None = None,
                dup: bool = False, props: MsgProps | None = None, unique: bool = False) -> DeliverStatus:
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
            props: MQTT 5 properties to send with it (:func:`fanout.mqtt.message5.message_props`; an
                expired message is not sent, and an MQTT 5 client gets the remaining interval).
            unique: while the session holds a message with this ``tag`` (in flight or queued), send no second
                copy and return where that one is (SENT or QUEUED). The fanout passes it: a dispatcher's
                ``deliver`` call can run twice (its reply lost on the direct channel, then made over Ray), and
                a restarted dispatcher resends the rows of connected vehicles; two copies of a row must not go
                towards one vehicle.

        Returns:
            A :class:`DeliverStatus`.
        """
        st = self._st
        s = st.sessions.get(client_id)
        if s is None:
            return DeliverStatus.NOT_CONNECTED
        c = s.conn
        if c is None:
            return DeliverStatus.NOT_CONNECTED
        # Free on the fanout's own path: its next row goes out after the PUBACK emptied the window.
        if unique and (s.inflight or s.queue) and tag is not None:  # None tags every untagged message
            held = _held_status(s, tag)
            if held is not None:
                return held
        principal = s.principal
        if principal is not None and self._can_read is not None:
            # ACL at delivery. Every fanout message has a topic of its own (a per-topic cache never hits), so it
            # is decided once per covering filter ``P/+`` when the ACL allows every topic one level under ``P/``:
            # the caller vouches that ``topic`` matches each covering filter, as for the subscription check.
            if not s.read_ok or s.read_principal is not principal or covering is None or s.read_filter not in covering:  # type: ignore[operator]
                if not self._can_read(principal, topic):
                    st.deliveries_denied += 1
                    return DeliverStatus.NOT_SUBSCRIBED  # this principal may not read the topic
                if covering:
                    self._learn_read_filter(s, principal, covering)
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
            if c.v5 is None and props is None:
                self._write(c, encode_publish(topic, payload, 0, False, False, None))
            else:
                data = self._publish(c, OutMsg(topic, payload, 0, False, None, False, props), 0, False)
                if data is None:
                    return DeliverStatus.DROPPED
                self._write(c, data)
            st.pub_sent += 1
            if tag is not None:
                self._emit(Delivered(client_id, tag, 0))
            return _SENT
        m = OutMsg(topic, payload, qos, False, tag, dup, props)
        if c.v5 is not None or props is not None:
            return self.send_msg(s, m)  # per-connection encoding, expiry, the client's Receive Maximum
        inflight = s.inflight
        if not s.queue and len(inflight) < s.inflight_cap and (s.bytes + m.size <= st.limits.max_bytes or not s.bytes):
            # Session.window_open + send inlined for MQTT 3.1.1: the fanout delivery of every message
            pid = s.last_pid + 1
            if pid > 0xFFFF or pid in inflight:
                pid = s.alloc_pid()
            else:
                s.last_pid = pid
            inflight[pid] = m
            s.bytes += m.size
            self._write(c, encode_publish(topic, payload, qos, False, dup, pid))
            st.pub_sent += 1
            return _SENT
        return self.queue(s, m)

    def _learn_read_filter(self, s: Session, principal: Any, covering: Iterable[str]) -> None:
        """After an allowed delivery: remember whether the ACL allows every topic one level under a covering
        filter ``P/+`` with no wildcard in ``P`` (asked once per filter and principal), so the next deliveries
        it covers skip the check."""
        reads_under = self._reads_under
        if reads_under is None:
            return
        for f in covering:
            if f.endswith("/+") and "+" not in f[:-2]:  # P/ literal: a wildcard in P would stand for any level
                if s.read_principal is not principal or s.read_filter != f:
                    s.read_principal, s.read_filter, s.read_ok = principal, f, reads_under(principal, f[:-1])
                return

    def publish_local(self, topic: str, payload: bytes, qos: int = 0, retain: bool = False,
                      properties: Any = None, groups: Iterable[str] | None = None, plain: bool = True) -> int:
        """Publish to local subscribers only (a message forwarded from another node).

        No ACL check, no hooks, no :class:`LocalPublish` event (so nothing is forwarded back). A
        retained message is stored (mirrored) here too.

        ``properties``: the MQTT 5 properties it carries (``LocalPublish.properties`` of the other node),
        the Message Expiry Interval counted from now. ``groups``: the shared groups the other node placed
        here (only those get it), None to treat it as entering here (every matching group, placed
        cluster-wide). ``plain=False``: for those groups only, not the ordinary subscribers (and not stored
        when retained).

        Returns:
            The number of local sessions the message was given to.
        """
        props = message_props(properties, self._st.now) if properties is not None else None
        if plain:
            return self.route(topic, payload, qos, retain, props, None, groups)
        shared = self._st.shared
        return shared.route(topic, payload, qos, props, retain, groups or ()) if shared is not None else 0


def _held_status(s: Session, tag: Hashable) -> DeliverStatus | None:
    """SENT when a message tagged ``tag`` is in flight in ``s``, QUEUED when it waits in its queue, else None.
    A vehicle's session holds one fanout row and what else its subscriptions brought (bounded by
    ``mqtt.max_inflight`` and ``mqtt.max_offline_messages``)."""
    for m in s.inflight.values():
        if m.tag == tag:
            return _SENT
    for m in s.queue or ():
        if m.tag == tag:
            return DeliverStatus.QUEUED
    return None


__all__ = ["Delivery"]
