"""The append path without Ray: the in-memory broker, NodeCore, real LMDB shards and the dispatcher's TopicCatalog.

A publish on a durable topic is routed live at once, its PUBACK waits for the append of its shard's batch; a
failed append acknowledges nothing; the pending bound refuses; a connection's PUBACKs keep its publish order.
"""
from __future__ import annotations

import asyncio
import dataclasses

import pytest

from fanout.config import load_config
from fanout.mqtt.packets import Publish, Pubrec
from fanout.topics.log_calls import TopicCatalog
from storage.topics import TopicSpec, partition_for
from tests.unit.test_node_core import Client, Cluster, FakeLink

RESPONSES = TopicSpec.build("responses", "ecp/+/response")


class AppendingLink(FakeLink):
    """FakeLink plus ``topic_append`` as the Dispatcher does it (one WriteBatch per call), with a gate per shard
    and an optional failure."""

    def __init__(self, cores, stores):
        super().__init__(cores)
        self.catalogs = [TopicCatalog(s, k, len(stores)) for k, s in enumerate(stores)]
        self.stores = stores
        self.gates: dict[int, asyncio.Event] = {}
        self.fail: BaseException | None = None
        self.appended: list[tuple[int, int]] = []

    async def topic_append(self, shard, items):
        gate = self.gates.get(shard)
        if gate is not None:
            await gate.wait()
        if self.fail is not None:
            raise self.fail
        self.stores[shard].apply(self.catalogs[shard].append_batch(items, 1_700_000_000_000))
        self.appended.append((shard, len(items)))
        return len(items)


class TopicCluster(Cluster):
    def __init__(self, tmp_path, shards=2, **fanout):
        super().__init__(tmp_path, shards)
        for k, store in enumerate(self.stores):
            cat = TopicCatalog(store, k, shards)
            store.apply(cat.create_batch(RESPONSES, 1))
        self.link = AppendingLink(self.cores, self.stores)
        cfg = self.cfg.replace("fanout", **fanout) if fanout else self.cfg
        self.cfg = dataclasses.replace(cfg, topics=(RESPONSES,))
        from fanout.config import mqtt_settings
        from fanout.mqtt.auth import AccessControl
        from fanout.mqtt.broker import Broker
        from fanout.node.core import NodeCore
        self.edge = NodeCore(self.cfg, self.node_id, self.link)
        self.broker = Broker(mqtt_settings(self.cfg), AccessControl(mqtt_settings(self.cfg), listener_is_loopback=True),
                             self.edge, now_ms=self.now)
        self.edge.attach(self.broker)

    async def appends(self) -> int:
        """Run every append batch the node has (as the actor's flush does); returns the tickets settled."""
        self.flush()
        settled = 0
        while self.edge.appends.has_work():
            settled += sum(await asyncio.gather(*(self.edge.append(b) for b in self.edge.appends.take())))
        self.flush()
        return settled

    def log(self, partition):
        shard = partition % len(self.stores)
        return self.stores[shard].topic_read("responses", partition, 0, 10_000)


@pytest.fixture
def tc(tmp_path):
    c = TopicCluster(tmp_path)
    yield c
    c.close()


def _partition(vin):
    return partition_for(RESPONSES, f"ecp/{vin}/response", vin, 2)


async def test_durable_publish_is_routed_at_once_and_acked_after_the_append(tc):
    sub = Client(tc, "platform-sub", user="platform", password=b"platform")
    sub.subscribe("ecp/+/response")
    v = Client(tc, "VIN00000000000001")
    v.send(Publish("ecp/VIN00000000000001/response", b'{"ok":1}', 1, False, False, 7))
    assert [p.payload for p in sub.publishes()] == [b'{"ok":1}']  # live at once
    assert v.acks() == []  # not before the append
    assert await tc.appends() == 1
    assert v.acks() == [7]
    [e] = tc.log(_partition("VIN00000000000001"))
    assert (e.offset, e.mqtt_topic, e.client_id, e.qos, e.payload, e.properties) == (
        0, "ecp/VIN00000000000001/response", "VIN00000000000001", 1, b'{"ok":1}', None)
    # a publish no durable topic matches is acknowledged at once and never queued
    v.send(Publish("ecp/VIN00000000000001/heartbeat", b"", 1, False, False, 8))
    assert v.acks() == [8]
    assert not tc.edge.appends.has_work()
    assert tc.edge.stats()["appends"] == 1


async def test_qos0_and_qos2_are_appended_and_a_dup_is_not_appended_twice(tc):
    v = Client(tc, "VIN00000000000002")
    v.send(Publish("ecp/VIN00000000000002/response", b"q0", 0, False, False, None))
    v.send(Publish("ecp/VIN00000000000002/response", b"q2", 2, False, False, 9))
    v.send(Publish("ecp/VIN00000000000002/response", b"q2", 2, False, True, 9))  # DUP while the append runs
    assert [p for p in v.inbox if isinstance(p, Pubrec)] == []
    await tc.appends()
    assert [p.packet_id for p in v.inbox if isinstance(p, Pubrec)] == [9]
    assert [e.payload for e in tc.log(_partition("VIN00000000000002"))] == [b"q0", b"q2"]


async def test_a_failed_append_acknowledges_nothing(tc):
    v = Client(tc, "VIN00000000000003")
    tc.link.fail = RuntimeError("dispatcher of shard 1 replaced during the call")
    v.send(Publish("ecp/VIN00000000000003/response", b"x", 1, False, False, 3))
    await tc.appends()
    assert v.acks() == []
    assert v.closed  # 3.1.1: closed without PUBACK, the client resends after reconnecting
    assert tc.log(_partition("VIN00000000000003")) == []
    assert tc.edge.stats()["appends_failed"] == 1
    tc.link.fail = None
    v2 = Client(tc, "VIN00000000000003")
    v2.send(Publish("ecp/VIN00000000000003/response", b"x", 1, False, True, 3))
    await tc.appends()
    assert v2.acks() == [3]
    assert [e.payload for e in tc.log(_partition("VIN00000000000003"))] == [b"x"]


async def test_acks_keep_the_publish_order_of_a_connection_across_shards(tc):
    vins = {}
    for i in range(40):
        vin = f"VIN{i:014d}"
        vins.setdefault(_partition(vin) % 2, vin)
    a, b = vins[0], vins[1]
    p = Client(tc, "platform-2", user="platform", password=b"platform")
    tc.link.gates[0] = asyncio.Event()
    p.send(Publish(f"ecp/{a}/response", b"first", 1, False, False, 1),
           Publish(f"ecp/{b}/response", b"second", 1, False, False, 2))
    tc.flush()
    batches = tc.edge.appends.take()
    assert sorted(x.shard for x in batches) == [0, 1]
    tasks = {x.shard: asyncio.ensure_future(tc.edge.append(x)) for x in batches}
    await tasks[1]  # shard 1 answered first: the second publish is durable, the first not yet
    tc.flush()
    assert p.acks() == []
    tc.link.gates[0].set()
    await tasks[0]
    tc.flush()
    assert p.acks() == [1, 2]


async def test_the_pending_bound_refuses_and_counts(tmp_path):
    tc = TopicCluster(tmp_path, max_pending_appends=2)
    try:
        v = Client(tc, "VIN00000000000004")
        for pid in (1, 2):
            v.send(Publish("ecp/VIN00000000000004/response", b"ok", 1, False, False, pid))
        v.send(Publish("ecp/VIN00000000000004/response", b"qos0 over", 0, False, False, None))
        assert tc.edge.stats()["appends_refused"] == 1 and not v.closed  # QoS 0: routed, not appended
        v.send(Publish("ecp/VIN00000000000004/response", b"qos1 over", 1, False, False, 3))
        assert tc.edge.stats()["appends_refused"] == 2
        await tc.appends()
        assert v.closed  # 3.1.1: refused without PUBACK (the first two were answered before the close)
        assert [e.payload for e in tc.log(_partition("VIN00000000000004"))] == [b"ok", b"ok"]
        assert tc.edge.appends.sys_values()["$SYS/fanout/appends/refused"] == 2
    finally:
        tc.close()


async def test_topics_pushed_at_run_time_start_matching(tc):
    v = Client(tc, "client-1")
    v.send(Publish("plant/line1/temp", b"20", 1, False, False, 1))
    assert v.acks() == [1]
    extra = TopicSpec.build("plant", "plant/#")
    for k, store in enumerate(tc.stores):
        store.apply(TopicCatalog(store, k, 2).create_batch(extra, 2))
    tc.link.catalogs = [TopicCatalog(s, k, 2) for k, s in enumerate(tc.stores)]
    assert tc.edge.set_durable_topics([RESPONSES, extra]) is True
    assert tc.edge.set_durable_topics([RESPONSES, extra]) is False
    v.send(Publish("plant/line1/temp", b"21", 1, False, False, 2))
    assert v.acks() == []
    await tc.appends()
    assert v.acks() == [2]
    p = partition_for(extra, "plant/line1/temp", "client-1", 2)  # no '+': keyed by the client id
    assert [e.payload for e in tc.stores[p % 2].topic_read("plant", p, 0, 10)] == [b"21"]


def test_config_bound_keys_reach_the_node():
    cfg = load_config(None, env={}).replace("fanout", max_pending_appends=5, max_pending_append_bytes="1MiB")
    assert (cfg.fanout.max_pending_appends, cfg.fanout.max_pending_append_bytes) == (5, 1 << 20)


async def test_mqtt5_publisher_gets_its_properties_kept_and_a_negative_puback_on_failure(tc):
    from fanout.mqtt.packets5 import Publish5
    from fanout.mqtt.properties import Properties
    from fanout.mqtt.reason_codes import ReasonCode as RC
    from storage.errors import StoreFullError
    from tests.unit.test_node_mqtt5 import Client5

    v = Client5(tc, "VIN00000000000005", request_problem_information=1)
    props = Properties(user_properties=(("k", "v"),), content_type="application/json", correlation_data=b"c1")
    v.send(Publish5("ecp/VIN00000000000005/response", b"{}", 1, False, False, 1, props))
    assert v.acks5() == []
    await tc.appends()
    assert v.acks5() == [(1, 0, None)]
    [e] = tc.log(_partition("VIN00000000000005"))
    assert e.properties == [["user_property", ["k", "v"]], ["content_type", "application/json"],
                            ["correlation_data", b"c1"]]
    tc.link.fail = StoreFullError("map full")
    v.send(Publish5("ecp/VIN00000000000005/response", b"{}", 1, False, False, 2))
    v.send(Publish5("ecp/VIN00000000000005/response", b"{}", 1, False, False, 3))
    await tc.appends()
    codes = [(pid, code) for pid, code, _reason in v.acks5()]
    assert codes == [(2, RC.QUOTA_EXCEEDED), (3, RC.QUOTA_EXCEEDED)] and not v.closed  # 0x97, connection kept
    tc.link.fail = RuntimeError("dispatcher gone")
    v.send(Publish5("ecp/VIN00000000000005/response", b"{}", 1, False, False, 4))
    await tc.appends()
    assert [(pid, code) for pid, code, _r in v.acks5()] == [(4, RC.UNSPECIFIED_ERROR)]
    assert len(tc.log(_partition("VIN00000000000005"))) == 1  # nothing of the refused ones was written


async def test_calls_per_shard_are_capped(tc):
    from fanout.node.topic_appends import FULL_BATCH, MAX_CALLS_PER_SHARD

    vin = "VIN00000000000006"
    shard = _partition(vin) % 2
    tc.link.gates[shard] = asyncio.Event()
    v = Client(tc, vin)
    tasks = []
    pid = 0

    def publish(n):
        nonlocal pid
        for _ in range(n):
            pid += 1
            v.send(Publish(f"ecp/{vin}/response", b"x", 1, False, False, pid))
        tasks.extend(asyncio.ensure_future(tc.edge.append(b)) for b in tc.edge.appends.take())

    publish(1)
    assert len(tasks) == 1
    publish(3)  # a call in flight and no full batch: they wait for it
    assert len(tasks) == 1 and not tc.edge.appends.has_work()
    for _ in range(MAX_CALLS_PER_SHARD + 1):
        publish(FULL_BATCH)  # full batches go out alongside, up to the cap
    assert len(tasks) == MAX_CALLS_PER_SHARD and tc.edge.stats()["append_calls"] == MAX_CALLS_PER_SHARD
    tc.link.gates[shard].set()
    await asyncio.gather(*tasks)
    await tc.appends()
    tc.flush()
    assert v.acks() == list(range(1, pid + 1))
    assert [e.offset for e in tc.log(_partition(vin))] == list(range(pid))


def test_the_second_call_threshold_follows_the_transport():
    # Over the direct channels a call costs about one or two appends: 16 queued items are worth a second call
    # (a few paho-like clients never fill 128 per shard, and their appends waited a whole round trip). A Ray
    # call costs ~1.8 ms of CPU: there it stays 128.
    from fanout.node.core import NodeCore
    from fanout.node.topic_appends import FULL_BATCH, FULL_BATCH_RAY

    class Link:
        shards = 2

    cfg = load_config(None, env={})
    assert NodeCore(cfg, "n0", Link()).appends.full_batch == FULL_BATCH == 16
    ray_calls = cfg.replace("cluster", direct_channels=False)
    assert NodeCore(ray_calls, "n0", Link()).appends.full_batch == FULL_BATCH_RAY == 128
