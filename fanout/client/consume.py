"""Consuming a durable topic as a member of a consumer group: ``async for msg in client.consume(topic, group)``.

Strategy: a consumer is an MQTT 5 member of the group (:mod:`fanout.node.topic_groups`): its own connection
(paho on its network thread; messages cross to the asyncio loop through ``call_soon_threadsafe``) subscribed
to ``$share/<group>/<topic filter>`` with the ``start`` User Property. The cluster sends each message to one
member with its ``partition``, ``offset``, ``ts_ms`` and ``client_id`` as User Properties (why MQTT 5: a 3.1.1
PUBLISH has no room for them), and commits an offset when the member's PUBACK comes.

PUBACKs are manual (paho ``manual_ack_set``) and go out in the order the PUBLISHes came (MQTT-4.6.0-2): a
:meth:`TopicMessage.ack` given out of order is held until the earlier messages are acknowledged, so a
partition's offsets are committed in order. On a lost connection the unacknowledged messages are forgotten
here (their acks would name packet ids of a dead connection): the cluster sends them again to a member
(at least once), and the consumer reconnects and subscribes again by itself.
"""
from __future__ import annotations

import asyncio
import itertools
from collections import deque
from dataclasses import dataclass, field
from typing import Any, AsyncIterator

import paho.mqtt.client as mqtt
import structlog
from paho.mqtt.enums import CallbackAPIVersion
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties
from paho.mqtt.subscribeoptions import SubscribeOptions

from fanout.topics.groups import parse_start

log = structlog.get_logger(__name__)

DEFAULT_MAX_PENDING = 256  # messages received and not yet acknowledged (the Receive Maximum announced)


@dataclass(slots=True)
class TopicMessage:
    """One durable-topic message received by a group member."""

    topic: str
    partition: int
    offset: int
    ts_ms: int
    mqtt_topic: str
    client_id: str  # the publisher
    payload: bytes
    properties: list[tuple[str, str]] = field(default_factory=list)  # the publisher's User Properties
    _consumer: "Consumer | None" = field(default=None, repr=False)
    _slot: "list | None" = field(default=None, repr=False)

    async def ack(self) -> None:
        """Acknowledge it (its PUBACK goes out once every earlier message of the connection is acknowledged);
        the cluster commits the partition's offset from the PUBACKs in order. Idempotent."""
        if self._consumer is not None and self._slot is not None:
            self._consumer._ack(self._slot)


class Consumer:
    """One group member's connection (see the module docstring); iterate it, close it when done.

    Args:
        host, port, username, password: the cluster's MQTT listener and a login allowed to subscribe the filter.
        topic, group: the durable topic and the consumer group.
        topic_filter: the topic's MQTT filter (``FanoutClient.consume`` asks the cluster for it).
        start: ``earliest`` | ``latest`` | an offset, for a group without commits.
        client_id: this member's client id.
        max_pending: messages in flight to this member (its Receive Maximum).
    """

    def __init__(self, host: str, port: int, username: str | None, password: str | None, topic: str, group: str,
                 topic_filter: str, start: str | int = "latest", *, client_id: str, keepalive_s: int = 30,
                 max_pending: int = DEFAULT_MAX_PENDING) -> None:
        self.topic, self.group = topic, group
        self.start_at = parse_start(start)
        self.share = f"$share/{group}/{topic_filter}"
        self.host, self.port = host, port
        self._keepalive_s = keepalive_s
        self._queue: asyncio.Queue[TopicMessage | BaseException] = asyncio.Queue()
        self._loop = asyncio.get_running_loop()
        self._order: deque[list] = deque()  # [mid, qos, acked, epoch] in arrival order
        self._epoch = 0  # bumped per connection: acks of an older connection are dropped
        self._closed = False
        self.received = 0
        self.acked = 0
        props = Properties(PacketTypes.CONNECT)
        props.ReceiveMaximum = max_pending
        c = mqtt.Client(CallbackAPIVersion.VERSION2, client_id=client_id, protocol=mqtt.MQTTv5)
        if username is not None:
            c.username_pw_set(username, password)
        c.manual_ack_set(True)
        c.on_connect = self._cb_connect
        c.on_disconnect = self._cb_disconnect
        c.on_message = self._cb_message
        c.reconnect_delay_set(0.1, 5)
        self._connect_props = props
        self._paho = c
        self._connected = asyncio.Event()

    async def start(self, timeout_s: float = 10.0) -> None:
        """Connect (paho's network thread) and wait for the first subscription."""
        await self._loop.run_in_executor(None, lambda: self._paho.connect(
            self.host, self.port, self._keepalive_s, clean_start=True, properties=self._connect_props))
        self._paho.loop_start()
        await asyncio.wait_for(self._connected.wait(), timeout_s)

    async def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        self._paho.disconnect()
        await self._loop.run_in_executor(None, self._paho.loop_stop)

    def __aiter__(self) -> "Consumer":
        return self

    async def __anext__(self) -> TopicMessage:
        item = await self._queue.get()
        if isinstance(item, BaseException):
            raise item
        return item

    # -- acknowledgements (event loop thread) -------------------------------------------------------------

    def _ack(self, slot: list) -> None:
        if slot[2] or slot[3] != self._epoch:
            return
        slot[2] = True
        order = self._order
        while order and order[0][2]:
            mid, qos, _acked, epoch = order.popleft()
            if epoch == self._epoch and qos > 0:
                self._paho.ack(mid, qos)
            self.acked += 1

    # -- paho callbacks (network thread) -------------------------------------------------------------------

    def _cb_connect(self, client: mqtt.Client, userdata: Any, flags: Any, rc: Any, props: Any) -> None:
        if rc.is_failure:
            log.warning("client.consume_connect_refused", reason=str(rc), group=self.group, topic=self.topic)
            return
        sub = Properties(PacketTypes.SUBSCRIBE)
        sub.UserProperty = [("start", str(self.start_at))]
        client.subscribe(self.share, options=SubscribeOptions(qos=1), properties=sub)
        self._loop.call_soon_threadsafe(self._connected.set)

    def _cb_disconnect(self, client: mqtt.Client, userdata: Any, flags: Any, rc: Any, props: Any) -> None:
        self._loop.call_soon_threadsafe(self._lost)

    def _lost(self) -> None:
        self._epoch += 1
        self._order.clear()  # the cluster sends them again: their packet ids died with the connection
        self._connected.clear()

    def _cb_message(self, client: mqtt.Client, userdata: Any, msg: mqtt.MQTTMessage) -> None:
        self._loop.call_soon_threadsafe(self._received, msg)

    def _received(self, msg: mqtt.MQTTMessage) -> None:
        users = list(getattr(msg.properties, "UserProperty", None) or [])
        meta = dict(users[-4:])  # the cluster's four come after the publisher's own
        try:
            partition, offset, ts_ms = int(meta["partition"]), int(meta["offset"]), int(meta["ts_ms"])
        except (KeyError, ValueError):
            log.warning("client.consume_message_without_offsets", mqtt_topic=msg.topic, group=self.group)
            partition, offset, ts_ms = -1, -1, 0
        slot = [msg.mid, msg.qos, False, self._epoch]
        self._order.append(slot)
        self.received += 1
        self._queue.put_nowait(TopicMessage(self.topic, partition, offset, ts_ms, msg.topic, meta.get("client_id", ""),
                                            msg.payload, users[:-4], self, slot))


_member_ids = itertools.count(1)


async def consume(client: Any, topic: str, group: str, start: str | int = "latest", *,
                  topic_filter: str | None = None, max_pending: int = DEFAULT_MAX_PENDING,
                  timeout_s: float = 30.0) -> AsyncIterator[TopicMessage]:
    """The messages of ``topic`` for ``group`` (``FanoutClient.consume``); the member leaves when the loop ends."""
    parse_start(start)  # a bad value fails here, before anything connects
    if topic_filter is None:
        topic_filter = (await client.topic_info(topic, timeout_s=timeout_s))["filter"]
    member = Consumer(client.host, client.port, client._username, client._password, topic, group, topic_filter,
                      start, client_id=f"{client.client_id}-c{next(_member_ids)}", max_pending=max_pending)
    await member.start(timeout_s)
    try:
        async for msg in member:
            yield msg
    finally:
        await member.close()


__all__ = ["Consumer", "TopicMessage", "consume", "DEFAULT_MAX_PENDING"]
