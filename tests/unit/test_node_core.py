"""NodeCore + DispatcherCore without Ray or sockets: the in-memory broker, real LMDB shards, the local link.

``Cluster`` below plays the two actors: it moves the node core's event batches into
``DispatcherCore.apply_events``, the dispatcher's per-node batches into ``NodeCore.apply_deliveries``, and
applies write batches on the stores, until nothing moves. Every test reads as an MQTT conversation with
fake clients.
"""
from __future__ import annotations

import json
from typing import Callable

import pytest

from benchmarks.local_link import LocalShardLink
from fanout.config import load_config, mqtt_settings
from fanout.dispatcher.core import DispatcherCore
from fanout.generations import GenerationClock
from fanout.mqtt.auth import AccessControl
from fanout.mqtt.broker import Broker
from fanout.mqtt.codec import PacketReader, encode
from fanout.mqtt.connection import CLOSED
from fanout.mqtt.hooks import DeliverStatus
from fanout.mqtt.packets import Connack, Connect, Puback, Publish, Suback, Subscribe, Unsubscribe
from fanout.node.core import NodeCore
from fanout.node.delivery_topic import DeliveryTopics
from fanout.records import (
    EV_CONNECT, EV_HEARTBEAT, EV_SUBSCRIBED, EV_SYNC, ConnectEvent, DisconnectEvent, HeartbeatEvent, SubscribedEvent,
    Forward, join_vins, read_event, split_vins,
)
from storage import ShardStore
from storage.keys import shard_of, split_by_shard

PREFIX = "agent/{VIN}/proxy/request"


class FakeLink(LocalShardLink):
    """The in-process shard link, recording its calls."""

    def __init__(self, cores: list[DispatcherCore]) -> None:
        super().__init__(cores)
        self.calls: list[tuple[str, int]] = []

    async def put_blobs(self, shard, items):
        self.calls.append(("put_blobs", shard))
        return await super().put_blobs(shard, items)

    async def has_data(self, shard, data_ids):
        self.calls.append(("has_data", shard))
        return await super().has_data(shard, data_ids)

    async def requests_in_use(self, shard, request_ids):
        self.calls.append(("requests_in_use", shard))
        return await super().requests_in_use(shard, request_ids)

    async def trigger_conflicts(self, shard, items):
        self.calls.append(("trigger_conflicts", shard))
        return await super().trigger_conflicts(shard, items)

    async def ingest(self, shard, items):
        self.calls.append(("ingest", shard))
        return await super().ingest(shard, items)


class Client:
    """A fake network peer of the in-memory broker."""

    def __init__(self, cluster: "Cluster", client_id: str, *, clean: bool = True, user: str | None = None,
                 password: bytes | None = None) -> None:
        self.cluster = cluster
        self.conn = cluster.broker.connection_made(cluster.now, ("127.0.0.1", 50000))
        self.conn.transport = self
        self.reader = PacketReader()
        self.inbox: list = []
        self.closed = False
        self.send(Connect(client_id, clean, 60, user, password, None))
        ack = self.inbox.pop(0)
        assert isinstance(ack, Connack) and ack.return_code == 0, ack
        self.session_present = ack.session_present

    def send(self, *packets) -> None:
        self.cluster.broker.data_received(self.conn, b"".join(encode(p) for p in packets), self.cluster.now)
        self.cluster.flush()

    def subscribe(self, topic_filter: str, pid: int = 1) -> None:
        self.send(Subscribe(pid, ((topic_filter, 1),)))
        subacks = [p for p in self.inbox if isinstance(p, Suback)]
        assert [s.packet_id for s in subacks] == [pid], self.inbox
        self.inbox.remove(subacks[0])

    def publishes(self) -> list[Publish]:
        out = [p for p in self.inbox if isinstance(p, Publish)]
        self.inbox = [p for p in self.inbox if not isinstance(p, Publish)]
        return out

    def acks(self) -> list[int]:
        out = [p.packet_id for p in self.inbox if isinstance(p, Puback)]
        self.inbox = [p for p in self.inbox if not isinstance(p, Puback)]
        return out

    def drop(self) -> None:
        self.cluster.broker.connection_lost(self.conn, self.cluster.now)
        self.closed = True
        self.cluster.flush()


def dispatcher_round(cores: list, now: int, edge_of: Callable[[str], NodeCore]) -> bool:
    """One round of the dispatcher cores' output to the nodes (``edge_of(node_id)``): sends and kicks, then
    the deletes they made; whether anything moved."""
    moved = False
    for core in cores:
        core.drain(now)
        for node_id in core.nodes_with_output():
            sends, payloads, kicks, props = core.take_node_batch(node_id)
            core.delivery_failures(node_id, edge_of(node_id).apply_deliveries(sends, payloads, kicks, props))
            moved = True
        taken = core.take_deletes(now)
        if taken:
            core.store.apply(taken[0])
            core.deletes_applied(taken[1])
            moved = True
    return moved


def hand_output(broker: Broker) -> None:
    """Give each fake client (a connection's transport) what the broker wrote for it; mark closed ones."""
    for conn, data in broker.flush():
        peer: Client = conn.transport
        if data and not peer.closed:
            peer.inbox.extend(peer.reader.feed(data))
        if conn.state >= CLOSED:
            peer.closed = True


class Cluster:
    """One node (broker + edge) and N shards, pumped by hand."""

    def __init__(self, tmp_path, shards: int = 2, prefix: str = PREFIX, node_id: str = "n0") -> None:
        cfg = load_config(None, env={}).replace("mqtt", sys_interval="0s").replace("fanout", topic_prefix=prefix)
        self.cfg = cfg
        self.now = 1_000_000
        self.stores = [ShardStore(tmp_path / f"shard-{k}", k, sync=False) for k in range(shards)]
        self.cores = [DispatcherCore(s, k, shards, started_ms=0) for k, s in enumerate(self.stores)]
        self.link = FakeLink(self.cores)
        clock = iter(range(10**15, 10**16, 1000))
        self.edge = NodeCore(cfg, node_id, self.link, clock_us=lambda: next(clock))
        self.broker = Broker(mqtt_settings(cfg), AccessControl(mqtt_settings(cfg), listener_is_loopback=True), self.edge, now_ms=self.now)
        self.edge.attach(self.broker)
        self.node_id = node_id

    def close(self) -> None:
        for s in self.stores:
            s.close()

    def flush(self) -> None:
        hand_output(self.broker)

    async def pump(self, rounds: int = 20) -> None:
        """Move everything until quiet: ingest, events, sends, deletes."""
        for _ in range(rounds):
            moved = False
            self.flush()
            if self.edge.has_tickets():
                await self.edge.process_ingest()
                moved = True
            for shard, events in self.edge.take_events().items():
                self.cores[shard].apply_events(self.node_id, events)
                moved = True
            if dispatcher_round(self.cores, self.now, lambda node_id: self.edge):
                moved = True
            self.flush()
            if not moved:
                return

    def pending(self) -> int:
        return sum(s.pending_count() for s in self.stores)

    def platform(self, cid: str = "platform-1") -> Client:
        return Client(self, cid, user="platform", password=b"platform")


@pytest.fixture
def cluster(tmp_path):
    c = Cluster(tmp_path)
    yield c
    c.close()


def trigger(ids, request_id="r1", data_id="d1") -> bytes:
    return json.dumps({"ids": ids, "request_id": request_id, "data_id": data_id}).encode()


async def publish_batch(c: Cluster, ids, request_id="r1", data_id="d1", blob=b"BLOB", pid=1) -> Client:
    p = c.platform()
    p.send(Publish(f"$SDV-FANOUT/data/{data_id}", blob, 1, False, False, pid),
           Publish("$SDV-FANOUT/trigger", trigger(ids, request_id, data_id), 1, False, False, pid + 1))
    assert p.acks() == []  # nothing acknowledged before the round ran
    await c.pump()
    assert p.acks() == [pid, pid + 1]
    return p


def vehicle(c: Cluster, vin: str, *, clean: bool = True, subscribe: bool = True) -> Client:
    v = Client(c, vin, clean=clean)
    if subscribe:
        v.subscribe(f"agent/{vin}/proxy/request/+")
    return v


# -- wire helpers -----------------------------------------------------------------------------------------

def test_split_by_shard_and_join_roundtrip():
    vins = [f"VIN{i:05d}" for i in range(1000)]
    buckets = split_by_shard(vins, 3)
    assert sum(map(len, buckets)) == 1000
    for k, b in enumerate(buckets):
        assert all(shard_of(v, 3) == k for v in b)
        assert split_vins(join_vins(b)) == b
    assert split_by_shard(vins, 1) == [vins]
    assert split_vins("") == []


def test_delivery_topics_for_any_prefix():
    assert DeliveryTopics().topic("VIN1", "r1") == "agent/VIN1/proxy/request/r1"
    assert DeliveryTopics("fleet/{VIN}/in").topic("X", "task_1") == "fleet/X/in/task_1"
    assert DeliveryTopics("all").topic("X", "r") == "all/r"
    assert DeliveryTopics("a/{VIN}/b/{VIN}").topic("X", "r") == "a/X/b/X/r"  # not the inline fast path
    assert DeliveryTopics().filter("VIN1") == "agent/VIN1/proxy/request/+"


# -- event translation ------------------------------------------------------------------------------------

async def test_connect_subscribe_heartbeat_become_dispatcher_events(cluster):
    v = vehicle(cluster, "V1", subscribe=False)
    v.subscribe("agent/V1/other/+")  # does not cover the delivery filter
    v.subscribe("agent/V1/#", pid=2)  # covers agent/V1/proxy/request/+
    v.send(Publish("ecp/V1/online", b"", 0, False, False, None))
    v.send(Publish("ecp/V1/status", b"", 0, False, False, None))  # not a trigger topic
    v.send(Publish("ecp/V2/online", b"", 0, False, False, None))  # another VIN's topic
    v.send(Unsubscribe(3, ("agent/V1/#",)))
    events = cluster.edge.take_events()[shard_of("V1", 2)]
    gen = cluster.edge.generation_of("V1")
    assert events[1][4] >= 10**15  # the subscription time: the injected wall clock
    assert [read_event(e) for e in events] == [
        ConnectEvent(EV_CONNECT, "V1", gen, False, False, None),
        SubscribedEvent(EV_SUBSCRIBED, "V1", gen, True, events[1][4]),
        HeartbeatEvent(EV_HEARTBEAT, "V1", gen),
        SubscribedEvent(EV_SUBSCRIBED, "V1", gen, False, None),
    ]
    v.drop()
    assert cluster.edge.take_events()[shard_of("V1", 2)] == [DisconnectEvent.build("V1", gen)]


async def test_generations_are_cluster_wide_and_increase_per_connection(cluster):
    a = vehicle(cluster, "V1")
    g1 = cluster.edge.generation_of("V1")
    b = vehicle(cluster, "V1")  # takeover on the same node
    assert a.closed and not b.closed
    assert cluster.edge.generation_of("V1") > g1


# -- ingest and dispatch ----------------------------------------------------------------------------------

async def test_realtime_batch_is_puback_ed_after_durable_write_then_delivered(cluster):
    vins = [f"V{i}" for i in range(6)]
    cars = {vin: vehicle(cluster, vin) for vin in vins}
    await cluster.pump()
    await publish_batch(cluster, vins)
    for vin, car in cars.items():
        pubs = car.publishes()
        assert [(p.topic, p.payload, p.qos, p.dup) for p in pubs] == [(f"agent/{vin}/proxy/request/r1", b"BLOB", 1, False)]
        car.send(Puback(pubs[0].packet_id))
    await cluster.pump()
    assert cluster.pending() == 0
    assert sum(c.stats()["delivered"] for c in cluster.cores) == 6
    # every shard got the blob in one call, the trigger in one call per involved shard, and the request
    # check (new request id: no conflict check follows) in one call per involved shard
    assert sorted(cluster.link.calls) == [("ingest", 0), ("ingest", 1), ("put_blobs", 0), ("put_blobs", 1),
                                          ("requests_in_use", 0), ("requests_in_use", 1)]


async def test_one_in_flight_per_vehicle_oldest_first_next_after_puback(cluster):
    car = vehicle(cluster, "V1")
    await cluster.pump()
    p = cluster.platform()
    p.send(Publish("$SDV-FANOUT/data/d1", b"one", 1, False, False, 1))
    for i, rid in enumerate(("r1", "r2", "r3")):
        p.send(Publish("$SDV-FANOUT/trigger", trigger(["V1"], rid), 1, False, False, 10 + i))
        await cluster.pump()
    assert p.acks() == [1, 10, 11, 12]
    got = []
    for _ in range(3):
        pubs = car.publishes()
        assert len(pubs) == 1, pubs
        got.append(pubs[0].topic.rsplit("/", 1)[1])
        car.send(Puback(pubs[0].packet_id))
        await cluster.pump()
    assert got == ["r1", "r2", "r3"]
    assert car.publishes() == [] and cluster.pending() == 0


async def test_late_subscriber_gets_nothing_until_heartbeat(cluster):
    await publish_batch(cluster, ["V1"])
    car = vehicle(cluster, "V1")
    await cluster.pump()
    assert car.publishes() == []
    car.send(Publish("ecp/V1/heartbeat", b"", 1, False, False, 5))
    await cluster.pump()
    assert [p.topic for p in car.publishes()] == ["agent/V1/proxy/request/r1"]


async def test_resumed_session_gets_dup_once_and_heartbeat_does_not_resend(cluster):
    car = vehicle(cluster, "V1", clean=False)
    await cluster.pump()
    await publish_batch(cluster, ["V1"])
    first = car.publishes()
    assert len(first) == 1 and not first[0].dup
    car.drop()  # killed before PUBACK
    await cluster.pump()
    car = Client(cluster, "V1", clean=False)
    assert car.session_present
    await cluster.pump()
    again = car.publishes()
    assert [(p.topic, p.dup) for p in again] == [("agent/V1/proxy/request/r1", True)]
    car.send(Publish("ecp/V1/online", b"", 1, False, False, 7))
    await cluster.pump()
    assert car.publishes() == []  # no second copy
    car.send(Puback(again[0].packet_id))
    await cluster.pump()
    assert cluster.pending() == 0


async def test_resend_of_same_trigger_queues_nothing_twice(cluster):
    await publish_batch(cluster, ["V1", "V2"])
    await publish_batch(cluster, ["V1", "V2"], pid=5)
    assert cluster.pending() == 2


@pytest.mark.parametrize("payload, field", [
    (b"not json", "payload"),
    (json.dumps({"ids": ["V1"], "request_id": "r/1", "data_id": "d1"}).encode(), "request_id"),
    (json.dumps({"ids": ["bad vin!"], "request_id": "r1", "data_id": "d1"}).encode(), "ids[0]"),
    (json.dumps({"ids": ["V1"], "request_id": "r1", "data_id": "nope"}).encode(), "data_id"),
])
async def test_invalid_trigger_writes_nothing_publishes_error_and_closes(cluster, payload, field):
    p = cluster.platform()
    p.subscribe("$SDV-FANOUT/errors/platform-1")  # a platform may only read its own errors
    p.send(Publish("$SDV-FANOUT/data/d1", b"x", 1, False, False, 1))
    await cluster.pump()
    seq_before = [s.applied_seq for s in cluster.stores]
    p.send(Publish("$SDV-FANOUT/trigger", payload, 1, False, False, 2))
    p.send(Publish("$SDV-FANOUT/trigger", trigger(["V9"], "r9"), 1, False, False, 3))  # after the bad one
    await cluster.pump()
    assert p.closed and p.acks() == [1]
    assert [s.applied_seq for s in cluster.stores] == seq_before  # nothing written
    assert cluster.pending() == 0
    errors = p.publishes()
    assert [e.topic for e in errors] == ["$SDV-FANOUT/errors/platform-1"]
    body = json.loads(errors[0].payload)
    assert body["field"] == field and body["client_id"] == "platform-1" and body["packet_id"] == 2


async def test_oversize_blob_is_rejected(tmp_path):
    c = Cluster(tmp_path)
    c.edge.ingest._max_blob = 10
    try:
        p = c.platform()
        p.send(Publish("$SDV-FANOUT/data/d1", b"x" * 11, 1, False, False, 1))
        await c.pump()
        assert p.closed and c.stores[0].get_meta("d1") is None
    finally:
        c.close()


async def test_configurable_prefix(tmp_path):
    c = Cluster(tmp_path, prefix="fleet/{VIN}/cmd")
    try:
        car = Client(c, "V1")
        car.subscribe("fleet/V1/cmd/+")
        await c.pump()
        await publish_batch(c, ["V1"], request_id="job7")
        assert [p.topic for p in car.publishes()] == ["fleet/V1/cmd/job7"]
    finally:
        c.close()


# -- deliveries and kicks ------------------------------------------------------------------------------------

async def test_apply_deliveries_refuses_stale_generation_and_unsubscribed(cluster):
    vehicle(cluster, "V1")
    vehicle(cluster, "V2", subscribe=False)
    g1, g2 = cluster.edge.generation_of("V1"), cluster.edge.generation_of("V2")
    failures = cluster.edge.apply_deliveries(
        [("V1", g1 - 1, b"k1", "r1", "d", False), ("V2", g2, b"k2", "r1", "d", False),
         ("V3", 1, b"k3", "r1", "d", False), ("V1", g1, b"k4", "r1", "d", True)],
        {"d": b"blob"},
    )
    assert failures == [("V1", g1 - 1, b"k1", DeliverStatus.NOT_CONNECTED),
                        ("V2", g2, b"k2", DeliverStatus.NOT_SUBSCRIBED),
                        ("V3", 1, b"k3", DeliverStatus.NOT_CONNECTED)]


async def test_a_deliver_batch_applied_twice_puts_one_copy_towards_the_vehicle(cluster):
    """A dispatcher's deliver call that runs twice (its reply lost on the direct channel, then made again over
    Ray) hands each row to the session once: one PUBLISH per row, one row in flight."""
    car = vehicle(cluster, "V1")
    gen = cluster.edge.generation_of("V1")
    batch = [("V1", gen, b"k1", "r1", "d", False)]
    assert cluster.edge.apply_deliveries(batch, {"d": b"blob"}) == []
    assert cluster.edge.apply_deliveries(batch, {"d": b"blob"}) == []  # not a failure: the session has it
    cluster.flush()
    assert [p.topic for p in car.publishes()] == ["agent/V1/proxy/request/r1"]


async def test_kick_only_closes_the_named_generation(cluster):
    car = vehicle(cluster, "V1")
    gen = cluster.edge.generation_of("V1")
    assert cluster.edge.kick([("V1", gen - 1)]) == 0 and not car.closed
    assert cluster.edge.kick([("V1", gen)]) == 1
    cluster.flush()
    assert car.closed


async def test_sync_events_describe_live_connections_of_a_shard(cluster):
    car = vehicle(cluster, "V1", clean=False)
    await cluster.pump()
    await publish_batch(cluster, ["V1"])
    car.publishes()
    shard = shard_of("V1", 2)
    sync = cluster.edge.sync_events(shard)
    gen = cluster.edge.generation_of("V1")
    event = next(e for e in sync if e[1] == "V1")
    assert event[:4] == (EV_SYNC, "V1", gen, True) and event[4].startswith(b"V1\x00")


async def test_restarted_shard_sends_pending_rows_to_resynced_vehicles(cluster, tmp_path):
    car = vehicle(cluster, "V1")
    await cluster.pump()
    shard = shard_of("V1", 2)
    # the dispatcher of V1 restarts (fresh state, same store) before a batch for V1 arrives
    cluster.cores[shard] = DispatcherCore(cluster.stores[shard], shard, 2, started_ms=0)
    cluster.link.cores = cluster.cores
    await publish_batch(cluster, ["V1"])
    assert car.publishes() == []  # the new dispatcher does not know V1 is connected
    cluster.edge.sync_events(shard)
    await cluster.pump()
    assert [p.topic for p in car.publishes()] == ["agent/V1/proxy/request/r1"]


# -- takeover registry (DispatcherCore) -----------------------------------------------------------------------------

def test_registry_kicks_the_connection_reported_earlier_on_another_node(tmp_path):
    a, b, c = (GenerationClock(incarnation=i).next() for i in (30, 20, 10))  # three node processes
    with ShardStore(tmp_path / "s", 0, sync=False) as store:
        core = DispatcherCore(store, 0, 1)
        core.apply_events("A", [ConnectEvent.build("V1", a, False, False, None)])
        core.apply_events("B", [ConnectEvent.build("V1", b, False, False, None)])
        assert core.take_node_batch("A") == ([], {}, [("V1", a)], None)
        assert core.vd.vehicle("V1").node == "B"
        # across nodes the generations carry no order (fanout.generations): the later report wins, even
        # when it is a delayed report of an older connection (its client reconnects once more)
        core.apply_events("C", [ConnectEvent.build("V1", c, False, False, None)])
        assert core.take_node_batch("B") == ([], {}, [("V1", b)], None)
        assert core.vd.vehicle("V1").node == "C"
        core.apply_events("A", [DisconnectEvent.build("V1", a)])
        assert core.vd.vehicle("V1").node == "C"


# -- forwarding -------------------------------------------------------------------------------------------------

async def test_local_publishes_are_forwarded_to_matching_peers_and_retained_mirrored(cluster):
    routes = cluster.edge.routes
    routes.set_peers(["n0", "n1", "n2"])
    routes.update("n1", ["sensors/#"], [], reset=True)
    c = Client(cluster, "c1")
    c.send(Publish("sensors/t", b"1", 0, False, False, None),
           Publish("other/t", b"2", 1, False, False, 9),
           Publish("cfg/x", b"3", 1, True, False, 10))
    fw = routes.take_forwards()
    assert fw == {"n1": [Forward.build("sensors/t", b"1", 0, False), Forward.build("cfg/x", b"3", 1, True)],
                  "n2": [Forward.build("cfg/x", b"3", 1, True)]}
    # announcements: the whole set first, then diffs
    c.subscribe("a/+")
    ann = routes.announcement(10_000, filters_fn=cluster.broker.route_filters)
    assert ann == (["a/+"], [], True)
    c.subscribe("b/#", pid=2)
    assert routes.announcement(20_000, filters_fn=cluster.broker.route_filters) == (["b/#"], [], False)


# -- trust model (a): only vehicle principals are vehicles ---------------------------------------------------


def test_a_connection_is_reported_as_a_vehicle_only_when_its_principal_is_that_vehicle(cluster):
    from fanout.mqtt.hooks import ClientConnected as Connected
    from fanout.records import Delivery

    edge = cluster.edge
    edge.on_events([Connected("V7", 1, False, "alice", "client")])  # a client user whose id looks like a VIN
    assert edge.take_events() == {}
    assert edge.generation_of("V7") is not None
    gen = edge.generation_of("V7")
    failures = edge.apply_deliveries([Delivery.build("V7", gen, b"key", "r1", "d1", False)], {"d1": b"x"})
    assert [f[0] for f in failures] == ["V7"]  # refused as not connected, never handed to the broker
    edge.on_events([Connected("V8", 2, False, "fleet", "vehicle", (), (), True)])
    assert sum(len(v) for v in edge.take_events().values()) == 1


# -- request ids re-used with another data id -------------------------------------------------------------

async def rejected_conflict(c: Cluster, ids, request_id: str, data_id: str, cid: str) -> dict:
    p = c.platform(cid)
    p.subscribe(f"$SDV-FANOUT/errors/{cid}")
    p.send(Publish("$SDV-FANOUT/trigger", trigger(ids, request_id, data_id), 1, False, False, 9))
    await c.pump()
    assert p.closed and p.acks() == []
    (error,) = p.publishes()
    return json.loads(error.payload)


async def test_a_request_id_reused_with_another_data_id_is_rejected_and_writes_nothing(cluster):
    vins = [f"C{i}" for i in range(8)]  # over both shards
    await publish_batch(cluster, vins, "r1", "dA", blob=b"A")
    p = await publish_batch(cluster, ["Z1"], "other", "dB", blob=b"B")
    p.drop()
    seqs = [s.applied_seq for s in cluster.stores]
    body = await rejected_conflict(cluster, vins, "r1", "dB", "platform-2")
    assert body["error"] == "invalid_trigger" and body["field"] == "data_id" and body["request_id"] == "r1"
    assert "'dA'" in body["reason"] and "'dB'" in body["reason"]  # names the conflict
    # only C0 is known on its shard with dA: the trigger is rejected whole, the other shard writes nothing
    body = await rejected_conflict(cluster, ["C0", "FRESH1", "FRESH2", "FRESH3"], "r1", "dB", "platform-3")
    assert "'C0'" in body["reason"]
    assert [s.applied_seq for s in cluster.stores] == seqs
    await publish_batch(cluster, vins, "r1", "dA", blob=b"A", pid=20)  # the same trigger again: accepted
    await publish_batch(cluster, ["C90"], "r1", "dB", blob=b"B", pid=30)  # no common VIN: accepted
    assert cluster.pending() == len(vins) + 2


async def test_conflicting_triggers_in_one_round_keep_the_first(cluster):
    p = cluster.platform()
    p.send(Publish("$SDV-FANOUT/data/dA", b"A", 1, False, False, 1),
           Publish("$SDV-FANOUT/data/dB", b"B", 1, False, False, 2),
           Publish("$SDV-FANOUT/trigger", trigger(["V1", "V2"], "r1", "dA"), 1, False, False, 3),
           Publish("$SDV-FANOUT/trigger", trigger(["V2", "V3"], "r1", "dB"), 1, False, False, 4))
    await cluster.pump()
    assert p.acks() == [1, 2, 3] and p.closed
    assert cluster.pending() == 2
    assert {s.get_req("r1", "V2")["data_id"] for s in cluster.stores if s.get_req("r1", "V2")} == {"dA"}
