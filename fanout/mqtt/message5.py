"""MQTT 5 application-message properties on their way from a publisher to every receiver.

Strategy: a PUBLISH's properties split in three (3.3.2.3):

- what the server forwards unchanged to every subscriber: Payload Format Indicator, Content Type,
  Response Topic, Correlation Data and the User Properties in their order (MQTT-3.3.2-4, -15, -16,
  -18, -20); they are encoded once per message into :attr:`MsgProps.body` and copied into every
  PUBLISH to an MQTT 5 receiver;
- the Message Expiry Interval, kept as an absolute deadline on the broker's clock: an expired message
  is not delivered, and a receiver gets the remaining interval, rounded up (MQTT-3.3.2-5, -6);
- what belongs to one hop only: the Topic Alias (resolved on receipt) and the Subscription Identifiers
  (added per receiver from its matching subscriptions, MQTT-3.3.4-3).

Topic aliases to an MQTT 5 receiver that announced a Topic Alias Maximum: the first PUBLISH of a topic
carries the topic and a new alias, later ones the alias and an empty topic (until the receiver's maximum is
used up, later topics go in full).

An MQTT 3.1.1 receiver gets the topic and payload without properties (3.1.1 has none); the expiry still
applies to it. A message from a 3.1.1 publisher has no properties (``None``) and reaches an MQTT 5
receiver as a PUBLISH with an empty property block.

:func:`publish_bytes` encodes one PUBLISH for one connection and returns None when the result is over
the MQTT 5 receiver's Maximum Packet Size: "the Server MUST NOT send packets exceeding Maximum Packet
Size to the Client" and discards such a message as if it had been sent (MQTT-3.1.2-24, -25).
"""
from __future__ import annotations

from typing import Any

from .encoder import encode_publish
from .encoder5 import encode_publish5
from .properties import EMPTY_PROPERTIES, Properties, unchecked_properties
from .property_block import (
    encode_properties_body, is_alias_only, message_expiry_property, subscription_identifier_property,
    topic_alias_property,
)


_FIELDS = Properties._fields
_EXPIRY, _ALIAS, _SUB_IDS, _WILL_DELAY = (_FIELDS.index(n) for n in (
    "message_expiry_interval", "topic_alias", "subscription_identifiers", "will_delay_interval"))


def _without(props: Properties, indexes: tuple[int, ...]) -> Properties:
    """``props`` with the fields at ``indexes`` absent. The values left were validated when ``props`` was
    built, so they are not checked again (``Properties.replace`` re-validates all 27 fields: ~17 us against
    ~1 us here, paid by every aliased PUBLISH)."""
    values = list(props)
    for i in indexes:
        values[i] = () if i == _SUB_IDS else None
    return unchecked_properties(values)


class MsgProps:
    """The properties one application message carries to every receiver.

    Attributes:
        props: the forwarded properties (no Topic Alias, Message Expiry or Subscription Identifier).
        body: ``props`` encoded without a Property Length.
        expires_ms: the deadline of the Message Expiry Interval on the broker's clock, or None.
    """

    __slots__ = ("props", "body", "expires_ms")

    def __init__(self, props: Properties, expires_ms: int | None) -> None:
        self.props = props
        self.body = encode_properties_body(props) if props is not EMPTY_PROPERTIES else b""
        self.expires_ms = expires_ms

    def __repr__(self) -> str:
        return f"MsgProps({self.props!r}, expires_ms={self.expires_ms!r})"

    def expired(self, now_ms: int) -> bool:
        """True once the Message Expiry Interval has passed."""
        return self.expires_ms is not None and now_ms >= self.expires_ms

    def remaining_s(self, now_ms: int) -> int:
        """The Message Expiry Interval to send on: what is left, in whole seconds rounded up."""
        return max(0, -((now_ms - self.expires_ms) // 1000))  # type: ignore[operator]


def message_props(props: Properties, now_ms: int) -> MsgProps | None:
    """The :class:`MsgProps` of a received PUBLISH (or will), None when it carries nothing to forward.

    Args:
        props: the properties as decoded.
        now_ms: the broker's clock (the expiry deadline is relative to it).
    """
    if props is EMPTY_PROPERTIES or is_alias_only(props):
        return None
    expiry = props.message_expiry_interval
    kept = props
    if expiry is not None or props.topic_alias is not None or props.subscription_identifiers \
            or props.will_delay_interval is not None:
        kept = _without(props, (_EXPIRY, _ALIAS, _SUB_IDS, _WILL_DELAY))
    if kept == EMPTY_PROPERTIES:
        if expiry is None:
            return None
        kept = EMPTY_PROPERTIES
    return MsgProps(kept, None if expiry is None else now_ms + expiry * 1000)


def forwarded_properties(props: Properties) -> Properties:
    """``props`` of a received PUBLISH without what belongs to its hop (Topic Alias, Subscription
    Identifiers), for another node's ``publish_local``."""
    if props.topic_alias is None and not props.subscription_identifiers:
        return props
    return _without(props, (_ALIAS, _SUB_IDS))


def publish_bytes(conn: Any, topic: str | bytes, payload: bytes, qos: int, retain: bool, dup: bool,
                  packet_id: int | None, props: MsgProps | None, sub_ids: tuple[int, ...], now_ms: int
                  ) -> bytes | None:
    """One PUBLISH for ``conn`` in its protocol version, or None when it must not be sent to it.

    Args:
        conn: the receiving :class:`~fanout.mqtt.connection.Connection` (``conn.v5`` None = 3.1.1).
        topic, payload, qos, retain, dup, packet_id: as for ``encode_publish``.
        props: the message's :class:`MsgProps`, or None.
        sub_ids: Subscription Identifiers of the receiver's matching subscriptions.
        now_ms: the broker's clock (remaining expiry).

    Returns:
        The encoded packet; None when it is over the MQTT 5 receiver's Maximum Packet Size.
    """
    link = conn.v5
    if link is None:
        return encode_publish(topic, payload, qos, retain, dup, packet_id)
    if props is None:
        body = b""
    elif props.expires_ms is None:
        body = props.body
    else:
        body = message_expiry_property(props.remaining_s(now_ms)) + props.body
    for sid in sub_ids:
        body += subscription_identifier_property(sid)
    new_alias = 0
    if link.out_alias_maximum:
        aliases = link.out_aliases
        alias = aliases.get(topic)
        if alias is not None:
            body = topic_alias_property(alias) + body
            topic = b""  # the alias stands for it (3.3.2.3.4)
        elif len(aliases) < link.out_alias_maximum:
            new_alias = len(aliases) + 1
            body = topic_alias_property(new_alias) + body  # sent with the topic: sets the alias
    data = encode_publish5(topic, payload, qos, retain, dup, packet_id, body)
    limit = link.maximum_packet_size
    if limit is not None and len(data) > limit:
        return None
    if new_alias:
        link.out_aliases[topic] = new_alias  # only once a PUBLISH carrying it is sent
    return data


def out_publish(st: Any, conn: Any, m: Any, packet_id: int, dup: bool, resend: bool = False) -> bytes | None:
    """The PUBLISH of a held message (:class:`~fanout.mqtt.session.OutMsg`) for ``conn``; None, counted on
    the broker state ``st``, when it is expired or too large for an MQTT 5 client. A resend of a message in
    flight ignores the expiry: its onward delivery had started (MQTT-3.3.2-5)."""
    props = m.props
    if not resend and props is not None and props.expires_ms is not None and st.now >= props.expires_ms:
        st.expired_dropped += 1
        return None
    data = publish_bytes(conn, m.topic, m.payload, m.qos, m.retain, dup, packet_id, props, m.sub_ids, st.now)
    if data is None:
        st.too_large_dropped += 1  # MQTT-3.1.2-25: discarded as if it had been sent
    return data


__all__ = ["MsgProps", "message_props", "forwarded_properties", "publish_bytes", "out_publish"]
