"""What an MQTT 5 CONNECT/CONNACK exchange negotiates for one connection, and the CONNACK it gets.

Strategy: a 3.1.1 connection has ``conn.v5 is None`` and none of this runs. For a level-5 CONNECT the
broker builds one :class:`Link5` from the CONNECT's properties and the broker's settings, and every
MQTT 5 rule that depends on the connection reads it:

- the client's Receive Maximum caps the session's outbound QoS 1/2 window (MQTT-3.3.4-9), with
  ``mqtt.max_inflight``; the broker's own ``mqtt.receive_maximum`` is announced, and a client that has
  more unacknowledged QoS 1/2 PUBLISHes gets DISCONNECT 0x93 (MQTT-3.3.4-7/8);
- the client's Maximum Packet Size: nothing bigger is sent to it (a PUBLISH is discarded,
  MQTT-3.1.2-24/25; reason strings are left out of acknowledgements, :func:`encode_within`);
- the broker's Topic Alias Maximum (``mqtt.topic_alias_maximum``) bounds the aliases the client may set,
  held in ``aliases`` for the life of the connection (MQTT-3.3.2-7, -8, -9); the client's bounds the
  aliases the broker gives the topics it sends (``out_aliases``, first come first served, when
  ``mqtt.send_topic_aliases``; MQTT-3.3.2-11);
- Session Expiry Interval, capped by ``mqtt.session_expiry`` (the CONNACK says so when it is lower,
  3.2.2.3.2); Server Keep Alive when ``mqtt.max_keepalive`` is lower than the client's (3.2.2.3.14);
- Request Problem Information 0: no Reason String or User Property on anything but PUBLISH, CONNACK
  and DISCONNECT (MQTT-3.1.2-29);
- an Authentication Method: extended authentication is not offered, CONNACK 0x8C (3.1.2.11.9).

The 3.1.1 CONNACK return codes the broker's shared paths produce map to their MQTT 5 reason codes in
:data:`CONNACK_CODE_5`.
"""
from __future__ import annotations

from typing import Any

from .encoder5 import encode_within
from .packets5 import Connack5, Connect5, Puback5, Pubrec5
from .properties import Properties
from .reason_codes import ReasonCode as RC

# 3.1.1 CONNACK return code -> MQTT 5 CONNACK reason code (table 3.2.2.2 of both versions)
CONNACK_CODE_5 = {
    0x01: RC.UNSUPPORTED_PROTOCOL_VERSION,
    0x02: RC.CLIENT_IDENTIFIER_NOT_VALID,
    0x03: RC.SERVER_UNAVAILABLE,
    0x04: RC.BAD_USER_NAME_OR_PASSWORD,
    0x05: RC.NOT_AUTHORIZED,
}
NEVER_EXPIRES = 0xFFFF_FFFF  # Session Expiry Interval "the Session does not expire" (3.1.2.11.2)


class Link5:
    """The MQTT 5 parameters of one connection.

    Attributes:
        receive_maximum: the client's Receive Maximum (65535 when absent).
        maximum_packet_size: the client's Maximum Packet Size, None when absent (no limit).
        topic_alias_maximum: aliases the client may set (the broker's announced value).
        aliases: topic alias -> topic name, set by the client on this connection.
        problem_info: the client's Request Problem Information (reason strings on acks when 1).
        session_expiry_s: the Session Expiry Interval in force (seconds).
        disconnected: the client sent DISCONNECT (no server DISCONNECT follows).
        out_alias_maximum: aliases the broker may give topics it sends (the client's Topic Alias Maximum,
            0 when it announced none or ``mqtt.send_topic_aliases`` is off).
        out_aliases: topic -> alias the broker gave it on this connection (MQTT-3.3.2-11: up to the
            client's maximum; aliases are not reused for another topic).
    """

    __slots__ = ("receive_maximum", "maximum_packet_size", "topic_alias_maximum", "aliases", "problem_info",
                 "session_expiry_s", "disconnected", "out_alias_maximum", "out_aliases")

    def __init__(self, props: Properties, topic_alias_maximum: int, session_expiry_s: int,
                 send_aliases: bool = False) -> None:
        self.receive_maximum = props.receive_maximum or 0xFFFF
        self.maximum_packet_size = props.maximum_packet_size
        self.topic_alias_maximum = topic_alias_maximum
        self.aliases: dict[int, str] = {}
        self.problem_info = 1 if props.request_problem_information is None else props.request_problem_information
        self.session_expiry_s = session_expiry_s
        self.disconnected = False
        self.out_alias_maximum = (props.topic_alias_maximum or 0) if send_aliases else 0
        self.out_aliases: dict[str | bytes, int] = {}


def session_expiry_s(p: Connect5, cap_ms: int) -> tuple[int, bool]:
    """The Session Expiry Interval the broker applies to ``p`` and whether the CONNACK must announce it.

    Args:
        p: the CONNECT.
        cap_ms: ``mqtt.session_expiry`` (0 = no cap).

    Returns:
        (seconds, changed): the client's value, or the cap when that is lower ("never" included).
    """
    asked = p.properties.session_expiry_interval or 0
    if cap_ms and asked and (asked == NEVER_EXPIRES or asked * 1000 > cap_ms):
        return cap_ms // 1000, True
    return asked, False


def keepalive_s(p: Connect5, max_keepalive_ms: int) -> tuple[int, bool]:
    """The keep alive the broker enforces for ``p`` and whether CONNACK must send Server Keep Alive."""
    cap = max_keepalive_ms // 1000
    if cap and (p.keepalive == 0 or p.keepalive > cap):
        return cap, True
    return p.keepalive, False


def connack_properties(*, settings: Any, link: Link5, assigned_id: str | None, expiry_changed: bool,
                       keepalive: int | None, max_packet: int, shared_available: bool) -> Properties:
    """The properties of an accepting CONNACK (3.2.2.3).

    Args:
        settings: the broker's :class:`~fanout.mqtt.settings.MQTTSettings`.
        link: the connection's :class:`Link5`.
        assigned_id: the client id the broker assigned to a zero-length one, or None.
        expiry_changed: the Session Expiry Interval differs from the CONNECT's.
        keepalive: the Server Keep Alive to announce, or None.
        max_packet: the largest packet the broker accepts from this client (remaining length).
        shared_available: shared subscriptions are offered.
    """
    return Properties(
        session_expiry_interval=link.session_expiry_s if expiry_changed else None,
        assigned_client_identifier=assigned_id,
        server_keep_alive=keepalive,
        receive_maximum=settings.receive_maximum,
        topic_alias_maximum=link.topic_alias_maximum or None,
        retain_available=1,
        # a whole packet, fixed header included (3.1.2.11.4): a client within it is within the reader's
        # limit on the remaining length
        maximum_packet_size=max_packet,
        wildcard_subscription_available=1,
        subscription_identifier_available=1,
        shared_subscription_available=1 if shared_available else 0,
    )


def refusal5(conn: Any, cls: type, code: int, reason: str) -> bytes:
    """A refusing CONNACK or a server DISCONNECT for an MQTT 5 client, ``reason`` as its Reason String
    (allowed on both whatever Request Problem Information says, MQTT-3.1.2-29), left out when the packet
    would exceed the client's Maximum Packet Size (:func:`encode_within`)."""
    props = Properties(reason_string=reason[:500]) if reason else Properties()
    pkt = cls(False, code, props) if cls is Connack5 else cls(code, props)
    return encode_within(pkt, conn.v5.maximum_packet_size)


def negative_ack5(conn: Any, qos: int, packet_id: int, error: dict[str, Any]) -> bytes:
    """The PUBACK (QoS 1) or PUBREC (QoS 2) refusing a publish of an MQTT 5 client.

    Args:
        conn: the client's connection (its Link5 says whether a Reason String is wanted and fits).
        qos: the publish's QoS (1 or 2).
        packet_id: its packet id.
        error: ``reason_code`` (default 0x99 Payload format invalid); ``error``, ``field`` and ``reason``
            joined make the Reason String (``invalid_trigger: ids[3]: not a VIN``), left out when the client
            asked for no problem information (MQTT-3.1.2-29).
    """
    link = conn.v5
    code = int(error.get("reason_code", RC.PAYLOAD_FORMAT_INVALID))
    text = ": ".join(str(error[k]) for k in ("error", "field", "reason") if error.get(k))
    props = Properties(reason_string=str(text)[:1000]) if text and link.problem_info else Properties()
    pkt = Puback5(packet_id, code, props) if qos == 1 else Pubrec5(packet_id, code, props)
    return encode_within(pkt, link.maximum_packet_size)


__all__ = ["refusal5", "negative_ack5", "Link5", "CONNACK_CODE_5", "NEVER_EXPIRES", "session_expiry_s", "keepalive_s", "connack_properties"]
