"""The consumer-group records crossing the connection node / dispatcher boundary, defined once.

They ride the existing hot calls (``fanout.records`` says why each is a plain tuple built by ``build``):

- node -> dispatcher, inside the node's ``events`` batch: :class:`GroupJoin` / :class:`GroupLeave` (sent to
  EVERY dispatcher: each holds the group for its own partitions), :class:`GroupAck` and :class:`GroupFailed`
  (to the dispatcher of the partition: ``partition % shards``). Their kinds follow the ``EV_*`` of
  :mod:`fanout.records`, from :data:`EV_GROUP_FIRST` up;
- dispatcher -> node, as the optional fifth field of the ``deliver`` call's ``DeliverBatch``: a list of
  :class:`GroupSend`.
"""
from __future__ import annotations

from typing import Any, NamedTuple

EV_GROUP_FIRST = 20
EV_GROUP_JOIN = 20
EV_GROUP_LEAVE = 21
EV_GROUP_ACK = 22
EV_GROUP_FAILED = 23


class GroupJoin(NamedTuple):
    """``client_id`` (connection ``generation``) consumes ``$share/<group>/<filter>``; ``window``: the messages
    its session takes in flight; ``start``: ``earliest`` | ``latest`` | an offset (for a group without commits)."""

    kind: int  # EV_GROUP_JOIN
    client_id: str
    generation: int
    group: str
    filter: str
    window: int
    start: Any

    @staticmethod
    def build(client_id: str, generation: int, group: str, topic_filter: str, window: int, start: Any) -> tuple:
        return (EV_GROUP_JOIN, client_id, generation, group, topic_filter, window, start)


class GroupLeave(NamedTuple):
    """``client_id`` stopped consuming ``$share/<group>/<filter>``; ``group`` None: every group (disconnect)."""

    kind: int  # EV_GROUP_LEAVE
    client_id: str
    generation: int
    group: str | None
    filter: str | None

    @staticmethod
    def build(client_id: str, generation: int, group: str | None, topic_filter: str | None) -> tuple:
        return (EV_GROUP_LEAVE, client_id, generation, group, topic_filter)


class GroupAck(NamedTuple):
    """The member's PUBACK (or the QoS 0 write) of one group message."""

    kind: int  # EV_GROUP_ACK
    client_id: str
    generation: int
    topic: str
    group: str
    partition: int
    offset: int

    @staticmethod
    def build(client_id: str, generation: int, topic: str, group: str, partition: int, offset: int) -> tuple:
        return (EV_GROUP_ACK, client_id, generation, topic, group, partition, offset)


class GroupFailed(NamedTuple):
    """A group message the node could not hand to the member (``status``: a ``DeliverStatus``, or -1 when its
    session dropped it later); ``evict``: the member can never take it (ACL at delivery, too large)."""

    kind: int  # EV_GROUP_FAILED
    client_id: str
    generation: int
    topic: str
    group: str
    partition: int
    offset: int
    evict: bool

    @staticmethod
    def build(client_id: str, generation: int, topic: str, group: str, partition: int, offset: int,
              evict: bool) -> tuple:
        return (EV_GROUP_FAILED, client_id, generation, topic, group, partition, offset, evict)


class GroupSend(NamedTuple):
    """One log entry for one member (the dispatcher read it; the node sends it as a PUBLISH on ``mqtt_topic``)."""

    client_id: str
    generation: int
    topic: str
    group: str
    partition: int
    offset: int
    ts_ms: int
    mqtt_topic: str
    publisher: str  # the publishing client id
    qos: int
    payload: bytes
    properties: Any  # list of [name, value] pairs kept from an MQTT 5 publish, or None

    @staticmethod
    def build(client_id: str, generation: int, topic: str, group: str, partition: int, offset: int, ts_ms: int,
              mqtt_topic: str, publisher: str, qos: int, payload: bytes, properties: Any) -> tuple:
        return (client_id, generation, topic, group, partition, offset, ts_ms, mqtt_topic, publisher, qos, payload,
                properties)


GROUP_RECORDS: tuple[type, ...] = (GroupJoin, GroupLeave, GroupAck, GroupFailed, GroupSend)

__all__ = ["EV_GROUP_FIRST", "EV_GROUP_JOIN", "EV_GROUP_LEAVE", "EV_GROUP_ACK", "EV_GROUP_FAILED", "GroupJoin",
           "GroupLeave", "GroupAck", "GroupFailed", "GroupSend", "GROUP_RECORDS"]
