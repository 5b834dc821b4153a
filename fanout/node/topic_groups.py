"""The connection node's part of durable-topic consumer groups: which subscriptions are group members, the
membership and acknowledgement events for the dispatchers, and the sends they order.

Strategy: a ``$share/<group>/<filter>`` subscription whose filter is a durable topic's filter is that group's
consumer (:meth:`NodeGroups.claims` answers the broker's ``BrokerHooks.claims_shared``, so the broker never
routes live copies to it), from MQTT 5 and 3.1.1 clients alike. The node keeps per client its claimed
subscriptions and reports, in its ordinary batched ``events`` calls:

- a join (:class:`GroupJoin`) to EVERY dispatcher (each serves the group's partitions of its shard) on
  subscribe and on a resumed session's reconnect, carrying the session's window (its Receive Maximum or
  ``fanout.topic_group_inflight``) and the SUBSCRIBE's ``start`` User Property; a leave (:class:`GroupLeave`) on
  unsubscribe and on disconnect;
- the member's PUBACK of a group message (the broker's ``Delivered`` event; its tag is ``(topic, group,
  partition, offset)``) as a :class:`GroupAck` to the dispatcher of the partition; a send the session did
  not take as a :class:`GroupFailed` (ACL refusal at delivery and too large evict the member).

Sends (:meth:`deliver`) go through ``Broker.deliver`` with ``require_subscription=False`` (the filter is
``$share/...``, which no topic matches literally); the broker still applies the ACL at delivery. An MQTT 5
member gets ``partition``, ``offset``, ``ts_ms`` and ``client_id`` (the publisher) as User Properties, after
the publisher's own; a 3.1.1 member gets the bare message (a consumer that needs the offsets connects with
MQTT 5, as :mod:`fanout.client.consume` does). A kept session's group messages are dropped from it at
disconnect: they go again to whichever member owns the partition then.

Bound: ``topics.max_groups_per_client`` claimed subscriptions per client; past it the subscription is
granted but joins nothing (counted in :attr:`NodeGroups.refused`, logged).
"""
from __future__ import annotations

from typing import Any, Callable, Iterable

import structlog

from fanout.mqtt.hooks import DeliverStatus
from fanout.mqtt.message5 import message_props
from fanout.mqtt.properties import Properties
from fanout.topics.groups import parse_start
from fanout.topics.groups_records import GroupAck, GroupFailed, GroupJoin, GroupLeave
from storage.topics import RECEIPTS

log = structlog.get_logger(__name__)

_SHARE = "$share/"
_EVICT = (DeliverStatus.NOT_SUBSCRIBED, DeliverStatus.TOO_LARGE)
_FAILED_MIN = DeliverStatus.NOT_CONNECTED
_KEPT_PROPERTIES = ("content_type", "payload_format_indicator", "response_topic", "correlation_data")


def _is_group_message(m: Any) -> bool:
    return type(m.tag) is tuple


def split_shared(topic_filter: str) -> tuple[str, str] | None:
    """(group, inner filter) of ``$share/<group>/<filter>``, None for any other or a malformed one."""
    if not topic_filter.startswith(_SHARE):
        return None
    group, sep, inner = topic_filter[len(_SHARE):].partition("/")
    if not sep or not group or not inner or "+" in group or "#" in group:
        return None
    return group, inner


def durable_filters(specs: Iterable[Any]) -> set[str]:
    """The filters of durable topics (``storage.topics.TopicSpec``), the built-in ``receipts`` always among them."""
    return {s.filter for s in specs} | {RECEIPTS.filter}


def delivery_properties(partition: int, offset: int, ts_ms: int, publisher: str, kept: Any) -> Properties:
    """The MQTT 5 properties of a group message: the publisher's kept properties (``[name, value]`` pairs as
    the log stores them), then the User Properties ``partition``, ``offset``, ``ts_ms``, ``client_id``."""
    users: list[tuple[str, str]] = []
    extra: dict[str, Any] = {}
    for name, value in kept or ():
        if name == "user_property":  # one [key, value] pair (storage.topics.KEEP_PROPERTIES)
            users.append((value[0], value[1]))
        elif name in _KEPT_PROPERTIES:
            extra[name] = value
    users += [("partition", str(partition)), ("offset", str(offset)), ("ts_ms", str(ts_ms)), ("client_id", publisher)]
    return Properties(user_properties=tuple(users), **extra)


class NodeGroups:
    """See the module docstring.

    Args:
        shards: the dispatcher count.
        emit: ``emit(shard, event)`` queues an event for a dispatcher's next ``events`` call.
        max_groups_per_client: the bound on claimed subscriptions per client.
        max_window: ``fanout.topic_group_inflight``: a member's window when its client names none (3.1.1), and
            the cap of an MQTT 5 client's Receive Maximum.
        filters: the durable topics' filters known at start (:meth:`set_filters` replaces them).
    """

    def __init__(self, shards: int, emit: Callable[[int, tuple], None], *, max_groups_per_client: int = 16,
                 max_window: int = 256, filters: Iterable[str] = ()) -> None:
        self.shards = shards
        self.max_window = max_window
        self._emit = emit
        self.max_groups_per_client = max_groups_per_client
        self.filters: set[str] = set(filters)
        self._subs: dict[str, dict[str, tuple[str, str]]] = {}  # client id -> {shared filter: (group, inner)}
        self._joins: dict[str, dict[str, tuple]] = {}  # client id -> {shared filter: its GroupJoin} (resync)
        self.refused = 0
        self.sent = 0
        self.failed = 0

    def set_filters(self, filters: Iterable[str]) -> None:
        """The durable topics' filters (from config and the topics created at run time)."""
        self.filters = set(filters)

    def claims(self, group: str, inner: str) -> bool:
        """``BrokerHooks.claims_shared``: a durable topic's filter is a consumer group, not a live share."""
        return inner in self.filters

    # -- membership ---------------------------------------------------------------------------------------

    def _broadcast(self, event: tuple) -> None:
        for shard in range(self.shards):
            self._emit(shard, event)

    def window(self, session: Any) -> int:
        """A member's window: its MQTT 5 Receive Maximum, else ``max_window``, capped by ``max_window`` (the
        broker's session queues what exceeds its own ``mqtt.max_inflight``)."""
        link = session.conn.v5 if session is not None and session.conn is not None else None
        return min(link.receive_maximum, self.max_window) if link is not None else self.max_window

    def subscribed(self, client_id: str, generation: int, filters: Iterable[tuple[str, int]],
                   user_properties: Iterable[tuple[str, str]], window: int) -> None:
        """Granted filters of one SUBSCRIBE: the claimed ones join their groups."""
        start: Any = "latest"
        for name, value in user_properties:
            if name == "start":
                try:
                    start = parse_start(value)
                except ValueError as exc:
                    log.warning("consumer group start property ignored", client_id=client_id, error=str(exc))
        have = self._subs.get(client_id)
        for topic_filter, _qos in filters:
            parsed = split_shared(topic_filter)
            if parsed is None or not self.claims(*parsed):
                continue
            if have is None:
                have = self._subs[client_id] = {}
            if topic_filter not in have and len(have) >= self.max_groups_per_client:
                self.refused += 1
                log.warning("consumer group subscription joins nothing: bound reached",
                            bound="topics.max_groups_per_client", client_id=client_id, limit=self.max_groups_per_client)
                continue
            have[topic_filter] = parsed
            join = GroupJoin.build(client_id, generation, parsed[0], parsed[1], window, start)
            self._joins.setdefault(client_id, {})[topic_filter] = join
            self._broadcast(join)

    def unsubscribed(self, client_id: str, generation: int, filters: Iterable[str]) -> None:
        have = self._subs.get(client_id)
        if not have:
            return
        for topic_filter in filters:
            parsed = have.pop(topic_filter, None)
            self._joins.get(client_id, {}).pop(topic_filter, None)
            if parsed is not None:
                self._broadcast(GroupLeave.build(client_id, generation, parsed[0], parsed[1]))
        if not have:
            del self._subs[client_id]
            self._joins.pop(client_id, None)

    def connected(self, client_id: str, generation: int, session: Any) -> None:
        """A connection was accepted: a resumed session's claimed subscriptions join again (new generation)."""
        self._subs.pop(client_id, None)
        self._joins.pop(client_id, None)
        if session is None or not session.subs:
            return
        claimed = [(f, q) for f, q in session.subs.items() if f.startswith(_SHARE)]
        if claimed:
            self.subscribed(client_id, generation, claimed, (), self.window(session))

    def disconnected(self, client_id: str, generation: int, session: Any) -> None:
        """The connection ended: the client leaves its groups; a kept session forgets their messages."""
        self._joins.pop(client_id, None)
        if self._subs.pop(client_id, None) is None:
            return
        self._broadcast(GroupLeave.build(client_id, generation, None, None))
        if session is not None and session.conn is None:
            session.drop_where(_is_group_message)

    def sync_joins(self) -> list[tuple]:
        """The joins of every current member (a restarted dispatcher learns the groups' members again)."""
        return [join for joins in self._joins.values() for join in joins.values()]

    # -- acknowledgements ------------------------------------------------------------------------------------

    def delivered(self, client_id: str, generation: int, tag: tuple) -> None:
        topic, group, partition, offset = tag
        self._emit(partition % self.shards, GroupAck.build(client_id, generation, topic, group, partition, offset))

    def dropped(self, client_id: str, generation: int, tag: tuple, evict: bool) -> None:
        topic, group, partition, offset = tag
        self.failed += 1
        self._emit(partition % self.shards,
                   GroupFailed.build(client_id, generation, topic, group, partition, offset, evict))

    # -- sends from dispatchers ------------------------------------------------------------------------------

    def deliver(self, broker: Any, generation_of: Callable[[str], int | None], sends: Iterable[tuple]) -> int:
        """Hand :class:`fanout.topics.groups_records.GroupSend` tuples to their members' sessions; what is not
        taken goes back as :class:`GroupFailed` events. Returns how many were handed over."""
        deliver = broker.deliver
        sessions = broker.state.sessions
        now = broker.state.now
        n = 0
        for cid, gen, topic, group, partition, offset, ts_ms, mqtt_topic, publisher, qos, payload, kept in sends:
            tag = (topic, group, partition, offset)
            s = sessions.get(cid)
            granted = s.subs.get(f"{_SHARE}{group}/{self._inner(cid, group, topic)}", 1) if s is not None else 0
            if s is None or generation_of(cid) != gen:
                self.dropped(cid, gen, tag, False)
                continue
            q = min(qos, granted)
            props = None
            if s.conn is not None and s.conn.v5 is not None:
                props = message_props(delivery_properties(partition, offset, ts_ms, publisher, kept), now)
            status = deliver(cid, mqtt_topic, payload, q, tag, require_subscription=False, props=props)
            if status >= _FAILED_MIN:
                self.dropped(cid, gen, tag, status in _EVICT)
            else:
                n += 1
        self.sent += n
        return n

    def _inner(self, client_id: str, group: str, topic: str) -> str:
        for g, inner in self._subs.get(client_id, {}).values():
            if g == group:
                return inner
        return ""

    def stats(self) -> dict[str, int]:
        return {"group_members": sum(len(v) for v in self._subs.values()), "group_sent": self.sent,
                "group_failed": self.failed, "group_refused": self.refused}

    def sys_values(self) -> dict[str, int]:
        """This node's ``$SYS/fanout/groups/...`` values (published with its ``$SYS`` tree)."""
        return {f"$SYS/fanout/groups/{k[6:]}": v for k, v in self.stats().items()}


__all__ = ["NodeGroups", "split_shared", "delivery_properties", "durable_filters"]
