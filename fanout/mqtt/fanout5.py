"""One routed message to the MQTT 5 sessions among its recipients, and to any recipient when the message
has MQTT 5 properties: the batch path of :meth:`fanout.mqtt.delivery.Delivery.fanout`.

Strategy: most MQTT 5 recipients look alike: no subscription options on the session (so no Subscription
Identifier, RETAIN 0, the trie's granted QoS), no topic aliases on their connection. For them the PUBLISH
differs only in its packet id, as in the 3.1.1 path: it is encoded once per (QoS, protocol version) into
the bytes before the packet id and the bytes after it, and every recipient gets ``head | pid | tail``
(joined at flush). The Message Expiry is decided once for the whole batch (one clock reading), and a
recipient whose Maximum Packet Size the packet exceeds is skipped (MQTT-3.1.2-25). A receiver that already
has a Topic Alias for the topic shares the parts of every receiver with the same alias number (empty topic,
the alias first in the property block); one whose maximum is used up gets the topic in full like the others.
Every other recipient (options, the first PUBLISH of a topic that sets its alias, offline, window full) goes
through :meth:`Delivery.give5`, one by one.
"""
from __future__ import annotations

import struct
from typing import Any

from .encoder import encode_publish, encode_varint
from .encoder5 import encode_publish5
from .message5 import MsgProps
from .property_block import message_expiry_property, topic_alias_property
from .session import OutMsg

_U16 = struct.Struct(">H").pack


def _body(props: MsgProps | None, now_ms: int) -> bytes:
    """The property block (without its length) of a PUBLISH to an MQTT 5 receiver without options."""
    if props is None:
        return b""
    if props.expires_ms is None:
        return props.body
    return message_expiry_property(props.remaining_s(now_ms)) + props.body


def publish_parts(tb: bytes, payload: bytes, qos: int, v5: bool, props: MsgProps | None, now_ms: int,
                  alias: int = 0) -> tuple[bytes, bytes, int]:
    """(bytes before the packet id, bytes after it, whole size) of a QoS 1/2 PUBLISH, or for QoS 0
    (the whole packet, b"", size). ``alias``: an MQTT 5 Topic Alias the receiver already knows (``tb``
    is then empty), sent first in the property block as :func:`~fanout.mqtt.message5.publish_bytes` does."""
    if not v5:
        full = encode_publish(tb, payload, qos, False, False, 1 if qos else None)
        after = payload
    else:
        body = topic_alias_property(alias) + _body(props, now_ms) if alias else _body(props, now_ms)
        full = encode_publish5(tb, payload, qos, False, False, 1 if qos else None, body)
        after = full[len(full) - len(payload) - len(body) - len(encode_varint(len(body))):]  # property length on
    if not qos:
        return full, b"", len(full)
    return full[:len(full) - len(after) - 2], after, len(full)


def fanout5(d: Any, topic: str, payload: bytes, qos: int, recipients: list[tuple[Any, int]],
            props: MsgProps | None, sender: str | None, published_retain: bool) -> None:
    """Give one message to ``recipients`` ((session, granted QoS) pairs).

    Args:
        d: the :class:`~fanout.mqtt.delivery.Delivery` (its state, ``give5`` for the recipients that need
            one of their own).
        topic, payload, qos: the message.
        props: its MQTT 5 properties, or None.
        sender, published_retain: for No Local and Retain As Published (:meth:`Delivery.give5`).
    """
    st = d._st
    now = st.now
    if props is not None and props.expires_ms is not None and now >= props.expires_ms:
        st.expired_dropped += len(recipients)  # MQTT-3.3.2-5
        return
    give5 = d.give5
    tb = topic.encode("utf-8")
    parts: dict[tuple[int, bool, int], tuple[bytes, bytes, int]] = {}  # (QoS, MQTT 5, alias) -> parts
    dirty = st.dirty
    size = len(topic) + len(payload)  # OutMsg.size
    max_bytes = st.limits.max_bytes
    sent = 0
    single = len(recipients) == 1
    for s, granted in recipients:
        c = s.conn
        if s.opts or c is None:
            give5(s, topic, payload, qos, granted, props, sender, published_retain)
            continue
        link = c.v5
        alias = 0
        if link is not None and link.out_alias_maximum:
            aliases = link.out_aliases
            alias = aliases.get(topic, 0)
            if not alias and len(aliases) < link.out_alias_maximum:
                give5(s, topic, payload, qos, granted, props, sender, published_retain)  # sets the alias
                continue
        q = granted if granted < qos else qos
        if q and (s.queue or len(s.inflight) >= s.inflight_cap or (s.bytes + size > max_bytes and s.bytes)):
            give5(s, topic, payload, qos, granted, props, sender, published_retain)  # queued there
            continue
        if not q and c.write_paused:
            st.pub_dropped += 1
            continue
        limit = link.maximum_packet_size if link is not None else None
        if single and q and not alias:  # one recipient: encode once with its packet id, nothing to share
            pid = s.alloc_pid()
            data = (encode_publish(tb, payload, q, False, False, pid) if link is None
                    else encode_publish5(tb, payload, q, False, False, pid, _body(props, now)))
            if limit is not None and len(data) > limit:
                st.too_large_dropped += 1  # MQTT-3.1.2-25: discarded as if sent
                continue
            chunks: tuple[bytes, ...] = (data,)
        else:
            key = (q, link is not None, alias)
            p = parts.get(key)
            if p is None:
                p = parts[key] = publish_parts(b"" if alias else tb, payload, q, link is not None, props, now,
                                               alias)
            if limit is not None and p[2] > limit:
                if alias:
                    give5(s, topic, payload, qos, granted, props, sender, published_retain)  # counted there
                    continue
                st.too_large_dropped += 1  # MQTT-3.1.2-25: discarded as if sent
                continue
            if not q:
                chunks = (p[0],)
            else:
                pid = s.last_pid + 1
                if pid > 0xFFFF or pid in s.inflight:
                    pid = s.alloc_pid()
                else:
                    s.last_pid = pid
                chunks = (p[0], _U16(pid), p[1])
        if q:
            s.inflight[pid] = OutMsg(topic, payload, q, False, None, False, props)
            s.bytes += size
        out = c.out
        if not out:
            if not dirty:
                st.wake()
            dirty.append(c)
        out.extend(chunks)
        sent += 1
    if sent:
        st.msgs_sent += sent
        st.pub_sent += sent


__all__ = ["fanout5", "publish_parts"]
