"""The hot-path records: each builder matches its record, and every producer's output is what its consumer
reads, through ``pack_batch``/``unpack_batch`` as on the Ray boundary.

The producers and consumers are the real cores: the node core (``NodeCore``) over the in-memory broker,
the dispatcher core (``DispatcherCore``) over a real LMDB shard, and the ingest rounds over the local link.
"""
from __future__ import annotations

import inspect
import json

import pytest

from benchmarks.local_link import LocalShardLink
from fanout.config import load_config, mqtt_settings
from fanout.dispatcher.core import DispatcherCore
from fanout.mqtt.auth import AccessControl
from fanout.mqtt.broker import Broker
from fanout.mqtt.codec import PacketReader, encode
from fanout.mqtt.hooks import DeliverStatus
from fanout.mqtt.packets import Connect, Puback, Publish, Subscribe, Unsubscribe
from fanout.mqtt.properties import Properties
from fanout.node.core import NodeCore
from fanout.records import (
    EVENT_RECORDS, WIRE_RECORDS, AckEvent, BlobItem, ConnectEvent, Delivery, DeliveryFailure, DeliveryProps, DeliverBatch,
    DisconnectEvent, FailedEvent, Forward, HeartbeatEvent, IngestItem, Kick, SubscribedEvent, SyncEvent,
    pack_batch, read_event, unpack_batch,
)
from storage import ShardStore

SAMPLES = {"client_id": "V1", "vin": "V1", "generation": 7, "session_present": True, "subscribed": True,
           "inflight_key": b"V1\x00k", "row_key": b"V1\x00k", "at_us": 12, "request_id": "r1", "data_id": "d1",
           "dup": True, "too_large": True, "status": 3, "blob": b"B", "ts_ms": 5, "joined_vins": "V1\nV2", "ttl_ms": 3000, "topic": "t",
           "payload": b"p", "qos": 1, "retain": False, "deliveries": [], "payloads": {}, "kicks": [],
           "expires": {"r1": 9000}, "user_properties": {"r1": (("trace", "t1"),)}, "content_types": {"d1": "text/plain"},
           "content_type": "text/plain", "props": ({"r1": 9000}, {}, {}),
           "properties": Properties(content_type="text/plain", user_properties=(("trace", "t1"),)),
           "groups": ("$share/g/jobs/+",), "plain": False}


def roundtrip(obj):
    return unpack_batch(pack_batch(obj))


@pytest.mark.parametrize("record", WIRE_RECORDS, ids=lambda r: r.__name__)
def test_each_builder_takes_the_record_fields_and_returns_its_plain_tuple(record):
    params = list(inspect.signature(record.build).parameters)
    event = record in EVENT_RECORDS.values()
    assert params == list(record._fields[1:] if event else record._fields)
    args = {p: SAMPLES[p] for p in params}
    wire = record.build(**args)
    assert type(wire) is tuple and len(wire) == len(record._fields)  # plain tuple: C-speed pickling
    read = record(*roundtrip(wire))
    assert {f: getattr(read, f) for f in params} == args
    if event:
        assert read_event(wire) == read and EVENT_RECORDS[wire[0]] is record


class Peer:
    """A fake network peer of the in-memory broker."""

    def __init__(self, broker: Broker, client_id: str, *, clean: bool = True, user: str | None = None,
                 password: bytes | None = None) -> None:
        self.broker = broker
        self.conn = broker.connection_made(1, ("127.0.0.1", 1))
        self.conn.transport = self
        self.reader = PacketReader()
        self.inbox: list = []
        self.send(Connect(client_id, clean, 60, user, password, None))

    def send(self, *packets) -> None:
        self.broker.data_received(self.conn, b"".join(encode(p) for p in packets), 1)
        flush(self.broker)


def flush(broker: Broker) -> None:
    for conn, data in broker.flush():
        if data:
            conn.transport.inbox.extend(conn.transport.reader.feed(data))


@pytest.fixture
def pair(request, tmp_path):
    """One node core over the in-memory broker, one dispatcher core over a real shard (extra mqtt settings
    by indirect parametrization)."""
    cfg = load_config(None, env={}).replace("mqtt", sys_interval="0s", **getattr(request, "param", {}))
    store = ShardStore(tmp_path / "shard-0", 0, sync=False)
    core = DispatcherCore(store, 0, 1, started_ms=0)
    clock = iter(range(10**15, 10**16, 1000))
    node = NodeCore(cfg, "n0", LocalShardLink([core]), clock_us=lambda: next(clock))
    broker = Broker(mqtt_settings(cfg), AccessControl(mqtt_settings(cfg), listener_is_loopback=True), node, now_ms=1)
    node.attach(broker)
    yield node, core, broker
    store.close()


def ship_events(node: NodeCore, core: DispatcherCore) -> list:
    events = node.take_events().get(0, [])
    core.apply_events("n0", roundtrip(events))  # the consumer reads what crossed the boundary
    return events


def test_every_node_event_is_a_record_the_dispatcher_core_consumes(pair):
    node, core, broker = pair
    core.store.apply(core.blob_batch([BlobItem.build("d1", b"BLOB", 1)]).enqueue_many(["V1"], 2, "r1", "d1"))
    car = Peer(broker, "V1", clean=False)
    car.send(Subscribe(1, (("agent/V1/proxy/request/+", 1),)), Publish("ecp/V1/online", b"", 0, False, False, None))
    events = ship_events(node, core)
    kinds = [type(read_event(e)) for e in events]
    assert kinds == [ConnectEvent, SubscribedEvent, HeartbeatEvent]
    gen = node.generation_of("V1")
    core.drain(10)
    sends, payloads, kicks, props = core.take_node_batch("n0")
    assert props is None  # no request with a ttl or properties
    assert [Delivery(*s) for s in sends] == [Delivery("V1", gen, sends[0][2], "r1", "d1", False)]
    failures = node.apply_deliveries(*roundtrip(DeliverBatch.build(sends, payloads, kicks, props)))
    assert failures == []
    flush(broker)
    pid = next(p.packet_id for p in car.inbox if isinstance(p, Publish))
    car.send(Puback(pid))
    (ack,) = ship_events(node, core)
    assert read_event(ack) == AckEvent(ack[0], "V1", gen, sends[0][2])
    car.send(Unsubscribe(2, ("agent/V1/proxy/request/+",)))
    (unsub,) = ship_events(node, core)
    assert read_event(unsub) == SubscribedEvent(unsub[0], "V1", gen, False, None)
    (sync,) = node.sync_events(0)
    assert read_event(sync) == SyncEvent(sync[0], "V1", gen, False, None)
    ship_events(node, core)
    broker.connection_lost(car.conn, 1)
    flush(broker)
    (gone,) = ship_events(node, core)
    assert read_event(gone) == DisconnectEvent(gone[0], "V1", gen)
    assert core.vd.vehicle("V1").node is None


@pytest.mark.parametrize("pair", [{"max_inflight": 1, "max_offline_messages": 0}], indirect=True)
def test_a_dropped_fanout_message_is_a_failure_and_a_failed_event(pair):
    node, core, broker = pair
    car = Peer(broker, "V1", clean=False)
    car.send(Subscribe(1, (("agent/V1/#", 1),)))
    ship_events(node, core)
    gen = node.generation_of("V1")
    broker.deliver("V1", "agent/V1/x", b"x", 1, None)  # fills the inflight window; the queue holds nothing
    failures = node.apply_deliveries(*roundtrip(DeliverBatch.build(
        [Delivery.build("V1", gen, b"V1\x00k", "r1", "d1", False)], {"d1": b"BLOB"}, [])))
    assert [DeliveryFailure(*f) for f in failures] == [DeliveryFailure("V1", gen, b"V1\x00k", DeliverStatus.DROPPED)]
    core.delivery_failures("n0", roundtrip(failures))  # the dispatcher core reads the node's failures
    flush(broker)
    (failed,) = ship_events(node, core)
    assert read_event(failed) == FailedEvent(failed[0], "V1", gen, b"V1\x00k", False)


def test_deliveries_failures_and_kicks_round_trip_between_the_cores(pair):
    node, core, broker = pair
    core.store.apply(core.blob_batch([BlobItem.build("d1", b"BLOB", 1)]).enqueue_many(["V1", "V2"], 2, "r1", "d1"))
    cars = [Peer(broker, vin) for vin in ("V1", "V2")]
    for car in cars:
        car.send(Subscribe(1, ((f"agent/{car.conn.client_id}/proxy/request/+", 1),)),
                 Publish(f"ecp/{car.conn.client_id}/online", b"", 0, False, False, None))
    ship_events(node, core)
    core.apply_events("other", [ConnectEvent.build("V2", node.generation_of("V2") + 1, False, False, None)])
    core.drain(10)
    sends, payloads, kicks, _props = roundtrip(core.take_node_batch("n0"))
    assert [Kick(*k) for k in kicks] == [Kick("V2", node.generation_of("V2"))]
    assert payloads == {"d1": b"BLOB"} and [s[0] for s in sends] == ["V1"]
    stale = Delivery.build("V1", 1, b"V1\x00old", "r0", "d1", False)
    failures = node.apply_deliveries(sends + [stale], payloads, kicks)
    assert [DeliveryFailure(*f) for f in failures] == [DeliveryFailure("V1", 1, b"V1\x00old", DeliverStatus.NOT_CONNECTED)]
    assert cars[1].conn.close_reason is not None  # kicked
    core.delivery_failures("n0", roundtrip(failures))


def test_call_failed_reads_the_deliveries_of_the_failed_call(pair):
    node, core, broker = pair
    core.store.apply(core.blob_batch([BlobItem.build("d1", b"BLOB", 1)]).enqueue_many(["V1"], 2, "r1", "d1"))
    car = Peer(broker, "V1")
    car.send(Subscribe(1, (("agent/V1/proxy/request/+", 1),)), Publish("ecp/V1/online", b"", 0, False, False, None))
    ship_events(node, core)
    core.drain(10)
    sends, _payloads, _kicks, _props = core.take_node_batch("n0")
    assert core.vd.vehicle("V1").inflight is not None
    core.call_failed("n0", roundtrip(sends))
    assert core.vd.vehicle("V1").inflight is None  # the row stays pending, the next trigger resends it
    car.send(Publish("ecp/V1/heartbeat", b"", 0, False, False, None))
    ship_events(node, core)
    core.drain(11)
    assert [s[3] for s in core.take_node_batch("n0")[0]] == ["r1"]


async def test_ingest_items_and_blob_items_from_the_rounds_are_what_the_dispatcher_core_reads(pair):
    node, core, broker = pair
    seen: dict[str, list] = {"put_blobs": [], "ingest": [], "trigger_conflicts": []}
    link = node.ingest._link

    class PackingLink:
        shards = 1

        async def put_blobs(self, shard, items):
            seen["put_blobs"] += items
            return await link.put_blobs(shard, roundtrip(items))

        async def has_data(self, shard, data_ids):
            return await link.has_data(shard, data_ids)

        async def requests_in_use(self, shard, request_ids):
            return await link.requests_in_use(shard, roundtrip(request_ids))

        async def trigger_conflicts(self, shard, items):
            seen["trigger_conflicts"] += items
            return await link.trigger_conflicts(shard, roundtrip(items))

        async def ingest(self, shard, items):
            seen["ingest"] += items
            return await link.ingest(shard, roundtrip(items))

    node.ingest._link = PackingLink()
    plat = Peer(broker, "platform-1", user="platform", password=b"platform")
    body = json.dumps({"ids": ["V1", "V2"], "request_id": "r1", "data_id": "d1"}).encode()
    plat.send(Publish("$SDV-FANOUT/data/d1", b"BLOB", 1, False, False, 1),
              Publish("$SDV-FANOUT/trigger", body, 1, False, False, 2))
    await node.process_ingest()
    (blob,) = [BlobItem(*i) for i in seen["put_blobs"]]
    (item,) = [IngestItem(*i) for i in seen["ingest"]]
    assert (blob.data_id, blob.blob) == ("d1", b"BLOB")
    assert (item.request_id, item.data_id, sorted(item.joined_vins.split("\n"))) == ("r1", "d1", ["V1", "V2"])
    assert core.store.pending_count("V1") == core.store.pending_count("V2") == 1
    plat.send(Publish("$SDV-FANOUT/trigger", body, 1, False, False, 3))  # re-sent: its request id is known
    await node.process_ingest()
    (check,) = [IngestItem(*i) for i in seen["trigger_conflicts"]]
    assert (check.request_id, check.data_id, sorted(check.joined_vins.split("\n"))) == ("r1", "d1", ["V1", "V2"])
    assert core.store.pending_count() == 2  # nothing queued twice


def test_a_node_makes_forward_events_only_while_it_has_peers(pair):
    """Alone, a node has nobody to forward to: no LocalPublish per publish (one per heartbeat was an event
    object and a PeerRoutes.forward call for nothing); with a peer it forwards; when the last one leaves
    it stops again."""
    from fanout.mqtt.hooks import Heartbeat, LocalPublish

    node, core, broker = pair
    kinds: list[type] = []

    class Recording:  # the node's hooks, with each batch of events seen on the way (NodeCore may be compiled)
        def __getattr__(self, name: str) -> object:
            return getattr(node, name)

        def on_events(self, events: list) -> None:
            kinds.extend(type(e) for e in events)
            node.on_events(events)

    broker.hooks = Recording()
    car = Peer(broker, "V1")
    beat = Publish("ecp/V1/heartbeat", b"1", 0, False, False, None)

    def beat_kinds() -> list[type]:
        kinds.clear()
        car.send(beat)
        return [k for k in kinds if k in (Heartbeat, LocalPublish)]

    assert beat_kinds() == [Heartbeat]
    node.routes.set_peers(["n0", "n1"])
    node.routes.update("n1", ["ecp/#"], [], reset=True)
    assert beat_kinds() == [Heartbeat, LocalPublish]
    assert [Forward(*f).topic for f in node.routes.take_forwards()["n1"]] == ["ecp/V1/heartbeat"]
    node.routes.remove_node("n1")
    assert beat_kinds() == [Heartbeat]
    node.routes.set_peers(["n0", "n2"])
    assert beat_kinds() == [Heartbeat, LocalPublish]
    node.routes.set_peers(["n0"])
    assert beat_kinds() == [Heartbeat] and node.routes.take_forwards() == {}


def test_forwards_from_the_route_table_are_what_the_peer_node_core_delivers(pair):
    node, core, broker = pair
    node.routes.set_peers(["n0", "n1"])
    node.routes.update("n1", ["sensors/#"], [], reset=True)
    assert node.routes.forward("sensors/t", b"1", 1, False) == 1
    (fw,) = roundtrip(node.routes.take_forwards())["n1"]
    assert Forward(*fw) == Forward("sensors/t", b"1", 1, False, None)
    sub = Peer(broker, "c1")
    sub.send(Subscribe(1, (("sensors/#", 1),)))
    assert node.apply_forwards([fw]) == 1
    flush(broker)
    assert [p.topic for p in sub.inbox if isinstance(p, Publish)] == ["sensors/t"]


def test_delivery_props_built_by_the_dispatcher_core_are_read_by_the_node(pair):
    """The fourth field of a DeliverBatch: the dispatcher core names each request's ttl deadline and User
    Properties and each blob's Content Type once; the node core reads them (BatchProps) after pack_batch."""
    from fanout.node.delivery_props import BatchProps
    node, core, broker = pair
    core.store.apply(core.blob_batch([BlobItem.build("d1", b"BLOB", 1, "text/plain")]))
    core.blobs_stored([BlobItem.build("d1", b"BLOB", 1, "text/plain")])
    users = (("trace", "t-1"), ("campaign", "c9"))
    now_ms = 10**12  # the node's test clock
    batch, _results, _vins = core.ingest_batch([IngestItem.build("r1", "d1", "V1", now_ms, 60_000, users)])
    core.store.apply(batch)
    car = Peer(broker, "V1")
    car.send(Subscribe(1, (("agent/V1/proxy/request/+", 1),)), Publish("ecp/V1/online", b"", 0, False, False, None))
    ship_events(node, core)
    core.drain(10)
    wire = roundtrip(core.take_node_batch("n0"))
    read = DeliverBatch(*wire)
    assert DeliveryProps(*read.props) == DeliveryProps({"r1": now_ms + 60_000}, {"r1": users}, {"d1": "text/plain"})
    msg = BatchProps(read.props, wall_now_ms=now_ms, broker_now_ms=1).of("r1", "d1")
    assert (msg.props.user_properties, msg.props.content_type, msg.expires_ms) == (users, "text/plain", 60_001)
    assert node.apply_deliveries(*wire) == []
    flush(broker)
    assert [p.payload for p in car.inbox if isinstance(p, Publish)] == [b"BLOB"]  # 3.1.1: the payload only
