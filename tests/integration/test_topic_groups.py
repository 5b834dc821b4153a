"""Consumer groups of durable topics over MQTT on a real cluster (the shared local Ray): ``$share/<group>/<filter>``
members with paho MQTT 5 and 3.1.1 and amqtt, their PUBACKs committing the group's position, a departed member's
unacknowledged messages going to the other member, ``start=earliest``, per-vehicle order, the position across
disconnects (a whole-cluster restart: test_topic_groups_restart.py), and the platform client's ``consume`` / ``msg.ack`` / ``client.ack``."""
from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import queue
import threading
import uuid

import paho.mqtt.client as mqtt
import pytest
import ray
from amqtt.client import MQTTClient
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties
from paho.mqtt.subscribeoptions import SubscribeOptions

from fanout.client import FanoutClient
from storage.topics import TopicSpec, partition_for

from .fanout_harness import fanout_config, running_cluster, wait_until

pytestmark = pytest.mark.timeout(300)

RESPONSES = TopicSpec.build("responses", "ecp/+/response")
SHARDS = 2  # fanout_config's dispatchers: partitions = shards


def vins_of_partition(partition: int, n: int, tag: str) -> list[str]:
    """``n`` VINs whose ``ecp/<VIN>/response`` publishes land in ``partition``."""
    out: list[str] = []
    i = 0
    while len(out) < n:
        vin = f"{tag}{i:0{17 - len(tag)}d}"
        if partition_for(RESPONSES, f"ecp/{vin}/response", vin, SHARDS) == partition:
            out.append(vin)
        i += 1
    return out


class Member:
    """A paho group member (MQTT 5 or 3.1.1) recording what it receives; ``manual_ack``: PUBACK on :meth:`ack`."""

    def __init__(self, port: int, group: str, *, v5: bool, start: str | None = None, manual_ack: bool = False,
                 client_id: str | None = None) -> None:
        self.messages: "queue.Queue[mqtt.MQTTMessage]" = queue.Queue()
        self.got: list[tuple[str, bytes]] = []
        self.subscribed = threading.Event()
        cid = client_id or f"member-{uuid.uuid4().hex[:8]}"
        self.c = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2, client_id=cid,
                             protocol=mqtt.MQTTv5 if v5 else mqtt.MQTTv311, manual_ack=manual_ack)
        self.c.on_message = self._on_message
        self.c.on_subscribe = lambda *a: self.subscribed.set()
        self.c.connect("127.0.0.1", port, keepalive=30)
        self.c.loop_start()
        share = f"$share/{group}/{RESPONSES.filter}"
        if v5:
            props = Properties(PacketTypes.SUBSCRIBE)
            if start is not None:
                props.UserProperty = [("start", start)]
            self.c.subscribe(share, options=SubscribeOptions(qos=1), properties=props)
        else:
            self.c.subscribe(share, qos=1)
        assert self.subscribed.wait(10), "no SUBACK"

    def _on_message(self, client, userdata, msg) -> None:
        self.got.append((msg.topic, msg.payload))
        self.messages.put(msg)

    def ack(self, msg: mqtt.MQTTMessage) -> None:
        self.c.ack(msg.mid, msg.qos)

    def user_properties(self, msg: mqtt.MQTTMessage) -> dict[str, str]:
        return dict(getattr(msg.properties, "UserProperty", None) or [])

    def close(self, clean: bool = True) -> None:
        if clean:
            self.c.disconnect()
        else:
            self.c.socket().close()  # gone without DISCONNECT or PUBACKs
        self.c.loop_stop()


def publish(port: int, vin: str, payloads: list[bytes]) -> None:
    c = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2, client_id=vin, protocol=mqtt.MQTTv311)
    c.connect("127.0.0.1", port, keepalive=30)
    c.loop_start()
    try:
        for p in payloads:
            c.publish(f"ecp/{vin}/response", p, qos=1).wait_for_publish(15)
    finally:
        c.disconnect()
        c.loop_stop()


def settle(seconds: float = 0.5) -> None:
    """Let join events reach the dispatchers (the node ships presence events at its next tick)."""
    threading.Event().wait(seconds)


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory):
    return tmp_path_factory.mktemp("topic-groups")


@pytest.fixture(scope="module")
def cfg(data_dir):
    return dataclasses.replace(fanout_config(data_dir), topics=(RESPONSES,))


@pytest.fixture(scope="module")
def fanout(ray_local, cfg):
    with running_cluster(cfg) as cluster:
        yield cluster


def test_two_members_share_the_partitions_in_per_vehicle_order(fanout):
    v5 = Member(fanout.port, "share", v5=True, start="earliest", client_id="share-a")
    v3 = Member(fanout.port, "share", v5=False, client_id="share-b")
    try:
        settle()
        per_vin = {vin: [f"{vin}:{i}".encode() for i in range(5)]
                   for p in range(SHARDS) for vin in vins_of_partition(p, 2, f"SH{p}")}
        for vin, payloads in per_vin.items():
            publish(fanout.port, vin, payloads)
        total = sum(len(v) for v in per_vin.values())
        wait_until(lambda: len(v5.got) + len(v3.got) >= total, 30, "every message at one member")
        assert len(v5.got) + len(v3.got) == total  # each message to ONE member (no live copies either)
        assert v5.got and v3.got  # the load is shared: one partition each
        for m in (v5, v3):
            for vin, payloads in per_vin.items():
                mine = [p for t, p in m.got if t == f"ecp/{vin}/response"]
                assert mine in ([], payloads)  # a vehicle's messages: all at one member, in order
        props = v5.user_properties(v5.messages.get(timeout=1))
        assert set(props) >= {"partition", "offset", "ts_ms", "client_id"}
    finally:
        v5.close()
        v3.close()


def test_departed_member_messages_go_to_the_other_member(fanout):
    holder = Member(fanout.port, "takeover", v5=True, manual_ack=True, client_id="takeover-a")  # latest
    try:
        settle()
        vin = vins_of_partition(0, 1, "TK")[0]
        payloads = [f"t{i}".encode() for i in range(4)]
        publish(fanout.port, vin, payloads)
        wait_until(lambda: len(holder.got) == 4, 30, "the holder has all 4 in flight")
        holder.ack(holder.messages.get(timeout=1))  # only the first is acknowledged
        settle(0.3)
        other = Member(fanout.port, "takeover", v5=False, client_id="takeover-b")
    finally:
        holder.close(clean=False)
    try:
        wait_until(lambda: [p for _t, p in other.got] == payloads[1:], 30, "the unacknowledged three at the other")
    finally:
        other.close()


def test_position_survives_disconnects_and_latest_is_the_default(fanout):
    vin = vins_of_partition(1, 1, "PS")[0]
    publish(fanout.port, vin, [b"before-group"])
    first = Member(fanout.port, "position", v5=False, client_id="position-a")  # a new group: latest
    settle()
    publish(fanout.port, vin, [b"p1", b"p2"])
    wait_until(lambda: [p for _t, p in first.got] == [b"p1", b"p2"], 30, "only what came after the group started")
    settle(0.3)  # the PUBACKs are committed
    first.close()
    publish(fanout.port, vin, [b"p3"])
    again = Member(fanout.port, "position", v5=True, start="earliest", client_id="position-b")
    try:
        wait_until(lambda: [p for _t, p in again.got] == [b"p3"], 30, "the group resumes after its commits")
    finally:
        again.close()


async def test_amqtt_member_consumes(fanout):
    vin = vins_of_partition(0, 1, "AM")[0]
    c = MQTTClient(client_id="amqtt-member", config={"keep_alive": 10, "auto_reconnect": False, "plugins": {}})
    await asyncio.wait_for(c.connect(f"mqtt://127.0.0.1:{fanout.port}"), 5)
    try:
        await c.subscribe([(f"$share/amqtt/{RESPONSES.filter}", 1)])
        await asyncio.sleep(0.5)
        await asyncio.get_running_loop().run_in_executor(None, publish, fanout.port, vin, [b"a1", b"a2"])
        got = []
        for _ in range(2):
            msg = await c.deliver_message(timeout_duration=30)
            got.append((msg.topic, bytes(msg.data)))
        assert got == [(f"ecp/{vin}/response", b"a1"), (f"ecp/{vin}/response", b"a2")]
    finally:
        with contextlib.suppress(Exception):
            await asyncio.wait_for(c.disconnect(), 5)


async def test_platform_client_consume_ack_and_explicit_commit(fanout, tmp_path):
    vins = [vins_of_partition(p, 1, f"PC{p}")[0] for p in range(SHARDS)]
    loop = asyncio.get_running_loop()
    for vin in vins:
        await loop.run_in_executor(None, publish, fanout.port, vin, [f"{vin}:{i}".encode() for i in range(3)])
    async with FanoutClient("127.0.0.1", fanout.port, "platform", "platform", outbox_dir=tmp_path / "outbox") as client:
        assert (await client.topic_info("responses"))["filter"] == RESPONSES.filter
        seen = []
        mine = 0
        held = None
        async for msg in client.consume("responses", "platform", start="earliest"):  # earlier tests' too
            assert msg.topic == "responses" and msg.mqtt_topic == f"ecp/{msg.client_id}/response"
            seen.append((msg.partition, msg.offset, msg.payload))
            mine += msg.client_id in vins
            if held is None and msg.client_id in vins:
                held = msg  # acknowledged after the next one: that PUBACK waits for this one's
                continue
            await msg.ack()
            if held is not None and held._slot is not None and not held._slot[2]:
                await held.ack()
            if mine == 6:
                break
        per_partition = {}
        for p, off, payload in seen:
            per_partition.setdefault(p, []).append((off, payload))
        for p, items in per_partition.items():
            assert [o for o, _ in items] == sorted(o for o, _ in items)  # offset order per partition
        assert {payload for _p, _o, payload in seen} >= {f"{v}:{i}".encode() for v in vins for i in range(3)}
        p0_last = max(o for o, _ in per_partition[0])
        assert await client.ack("responses", "platform", 0, p0_last) == p0_last
        assert await client.ack("responses", "platform", 0, 0) == p0_last  # never back
        await loop.run_in_executor(None, publish, fanout.port, vins[0], [b"after"])
        async for msg in client.consume("responses", "platform"):
            await msg.ack()
            if msg.partition == 0:  # committed up to p0_last: the next one there is the new message
                assert (msg.offset, msg.payload) == (p0_last + 1, b"after")
                break


def test_log_polls_only_while_a_group_has_a_member(fanout):
    """The dispatchers poll the logs for their groups every 10 ms only while some group has a member: an idle
    100 Hz timer cost 10-14 ms of CPU per second per dispatcher for nothing."""
    def polls() -> list[int]:
        handles = ray.get(fanout.controller.handles.remote(), timeout=30)
        return [s["group_polls"] for s in ray.get([d.stats.remote() for d in handles["dispatchers"]], timeout=30)]

    def still() -> bool:
        first = polls()
        settle(0.3)
        return polls() == first

    wait_until(still, 30, "no member anywhere (those of earlier tests have left): no poll")
    before = polls()
    member = Member(fanout.port, "polls", v5=False, client_id="polls-a")
    try:
        wait_until(lambda: all(n > b for n, b in zip(polls(), before)), 30, "every dispatcher polls for the member")
    finally:
        member.close()
    wait_until(still, 30, "the polls stop with the member gone")
