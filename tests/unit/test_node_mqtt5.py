"""The fanout contract on MQTT 5 through the node core (no Ray, no sockets): a trigger's Message Expiry Interval
is its request's time to live, invalid ingest gets the PUBACK reason code that says what is wrong, and
publishes forwarded between two nodes keep their properties.

The harness is test_node_core's ``Cluster`` (one node, real LMDB shards) with an MQTT 5 client, and two node
cores whose forwards go through ``pack_batch`` as on the Ray boundary.
"""
from __future__ import annotations

import json

import pytest

from fanout.dispatcher.core import DispatcherCore
from fanout.mqtt.codec import PacketReader
from fanout.mqtt.packets import Publish
from fanout.mqtt.packets5 import Connack5, Connect5, Puback5, Publish5, Suback5, Subscribe5, Subscription
from fanout.mqtt.properties import EMPTY_PROPERTIES, Properties
from fanout.mqtt.reason_codes import ReasonCode as RC
from fanout.records import IngestItem, pack_batch, unpack_batch
from storage import ShardStore

from .test_node_core import Client, Cluster, FakeLink, trigger, vehicle


class Client5(Client):
    """An MQTT 5 peer of the node's in-memory broker."""

    def __init__(self, cluster, client_id: str, *, user: str | None = None, password: bytes | None = None,
                 **props) -> None:
        self.cluster = cluster
        self.conn = cluster.broker.connection_made(cluster.now, ("127.0.0.1", 50001))
        self.conn.transport = self
        self.reader = PacketReader(protocol_level=5)
        self.inbox: list = []
        self.closed = False
        self.send(Connect5(client_id, True, 60, user, password, None, Properties(**props)))
        ack = self.inbox.pop(0)
        assert isinstance(ack, Connack5) and ack.reason_code == 0, ack

    def subscribe5(self, topic_filter: str, pid: int = 1) -> None:
        self.send(Subscribe5(pid, (Subscription(topic_filter, 1),)))
        subacks = [p for p in self.inbox if isinstance(p, Suback5)]
        assert [s.reason_codes for s in subacks] == [(1,)], self.inbox
        self.inbox.remove(subacks[0])

    def acks5(self) -> list[tuple[int, int, str | None]]:
        """(packet id, reason code, Reason String) of each PUBACK received, taken out of the inbox."""
        out = [(p.packet_id, p.reason_code, p.properties.reason_string) for p in self.inbox if isinstance(p, Puback5)]
        self.inbox = [p for p in self.inbox if not isinstance(p, Puback5)]
        return out

    def publishes5(self) -> list[Publish5]:
        out = [p for p in self.inbox if isinstance(p, Publish5)]
        self.inbox = [p for p in self.inbox if not isinstance(p, Publish5)]
        return out


class RecordingLink(FakeLink):
    """The local shard link, keeping the IngestItems it carried."""

    def __init__(self, cores) -> None:
        super().__init__(cores)
        self.items: list[IngestItem] = []
        self.shards_of: dict[int, int] = {}  # index in items -> shard

    async def ingest(self, shard, items):
        for i in items:
            self.shards_of[len(self.items)] = shard
            self.items.append(IngestItem(*i))
        return await super().ingest(shard, items)


@pytest.fixture
def cluster(tmp_path):
    c = Cluster(tmp_path)
    c.link = RecordingLink(c.cores)
    c.edge.ingest._link = c.link
    yield c
    c.close()


def platform5(c: Cluster, cid: str = "platform-5") -> Client5:
    return Client5(c, cid, user="platform", password=b"platform")


def expiry(seconds: int | None) -> Properties:
    return EMPTY_PROPERTIES if seconds is None else Properties(message_expiry_interval=seconds)


# -- 1. Message Expiry Interval = the request's time to live ----------------------------------------------------

@pytest.mark.parametrize("ttl, interval, expected_ms", [
    (None, 30, 30_000),  # the expiry alone
    ("10s", 30, 10_000),  # both: the smaller wins
    ("1h", 30, 30_000),
    ("20s", None, 20_000),  # the payload's ttl alone, as for 3.1.1
    (None, None, 0),  # neither: no ttl
])
async def test_message_expiry_interval_of_a_trigger_is_its_ttl(cluster, ttl, interval, expected_ms):
    p = platform5(cluster)
    body = {"ids": ["V1", "V2", "V3"], "request_id": "r1", "data_id": "d1"}
    if ttl is not None:
        body["ttl"] = ttl
    p.send(Publish5("$SDV-FANOUT/data/d1", b"BLOB", 1, False, False, 1, expiry(3600)),  # a blob's own expiry: no ttl
           Publish5("$SDV-FANOUT/trigger", json.dumps(body).encode(), 1, False, False, 2, expiry(interval)))
    await cluster.pump()
    assert p.acks5() == [(1, 0, None), (2, 0, None)]
    assert {i.ttl_ms for i in cluster.link.items} == {expected_ms}
    for n, item in enumerate(cluster.link.items):  # the dispatcher that got the rows bounds them by it
        expires = cluster.cores[cluster.link.shards_of[n]].lifecycle.expires
        assert expires.get("r1") == (item.ts_ms + expected_ms if expected_ms else None)


@pytest.mark.parametrize("after_ms, delivered", [(4_000, True), (5_001, False)])
async def test_rows_still_pending_when_the_expiry_runs_out_are_not_delivered(cluster, after_ms, delivered):
    p = platform5(cluster)
    p.send(Publish5("$SDV-FANOUT/data/d1", b"BLOB", 1, False, False, 1),
           Publish5("$SDV-FANOUT/trigger", trigger(["V1"]), 1, False, False, 2, expiry(5)))
    await cluster.pump()
    assert [code for _pid, code, _r in p.acks5()] == [0, 0]
    (item,) = cluster.link.items
    cluster.now = item.ts_ms + after_ms  # the vehicle comes (and says so) this long after the trigger
    car = Client5(cluster, "V1")
    car.subscribe5("agent/V1/proxy/request/+")
    car.send(Publish5("ecp/V1/online", b"", 0))
    await cluster.pump()
    assert [m.payload for m in car.publishes5()] == ([b"BLOB"] if delivered else [])
    status = cluster.cores[cluster.link.shards_of[0]].lifecycle.status("r1", [])
    assert status["expires_ms"] == item.ts_ms + 5_000
    assert (status["pending"], status["expired"]) == ((1, 0) if delivered else (0, 1)), status


@pytest.mark.parametrize("interval, reason", [(0, "must be positive"), (400 * 86_400, "longer than the limit")])
async def test_an_expiry_interval_out_of_range_is_refused_with_0x83_and_writes_nothing(cluster, interval, reason):
    p = platform5(cluster)
    p.send(Publish5("$SDV-FANOUT/data/d1", b"BLOB", 1, False, False, 1))
    await cluster.pump()
    seq = [s.applied_seq for s in cluster.stores]
    p.send(Publish5("$SDV-FANOUT/trigger", trigger(["V1"]), 1, False, False, 2, expiry(interval)))
    await cluster.pump()
    (pid, code, text), = p.acks5()[1:]
    assert (pid, code) == (2, RC.IMPLEMENTATION_SPECIFIC_ERROR)
    assert text.startswith("invalid_trigger: message_expiry_interval: ") and reason in text
    assert [s.applied_seq for s in cluster.stores] == seq and not p.closed


# -- 2. reason codes of refused ingest --------------------------------------------------------------------------

REFUSALS = [  # (topic, payload, reason code, field in the Reason String)
    ("$SDV-FANOUT/trigger", b"not json", RC.PAYLOAD_FORMAT_INVALID, "payload"),
    ("$SDV-FANOUT/trigger", trigger(["bad vin!"]), RC.PAYLOAD_FORMAT_INVALID, "ids[0]"),
    ("$SDV-FANOUT/trigger", trigger(["V1", "V2", "V3"]), RC.QUOTA_EXCEEDED, "ids"),  # max_batch 2 below
    ("$SDV-FANOUT/trigger", trigger(["V1"], data_id="nope"), RC.IMPLEMENTATION_SPECIFIC_ERROR, "data_id"),
    ("$SDV-FANOUT/trigger", trigger(["V1"], data_id="other"), RC.IMPLEMENTATION_SPECIFIC_ERROR, "data_id"),  # r1 conflict
    ("$SDV-FANOUT/data/d2", b"x" * 101, RC.QUOTA_EXCEEDED, "payload"),  # max blob 100 below
    ("$SDV-FANOUT/data/d2", b"", RC.PAYLOAD_FORMAT_INVALID, "payload"),
    ("$SDV-FANOUT/data/", b"blob", RC.TOPIC_NAME_INVALID, "data_id"),
    ("$SDV-FANOUT/data/a/b", b"blob", RC.TOPIC_NAME_INVALID, "data_id"),
    ("$SDV-FANOUT/unknown", b"blob", RC.TOPIC_NAME_INVALID, "topic"),
    ("$SDV-FANOUT/requests/r1/bogus", b"", RC.TOPIC_NAME_INVALID, "topic"),
    ("$SDV-FANOUT/requests/r1/status", b"[1]", RC.PAYLOAD_FORMAT_INVALID, "payload"),
]


@pytest.mark.parametrize("topic, payload, code, field", REFUSALS, ids=lambda v: v if isinstance(v, str) else None)
async def test_refused_ingest_gets_the_reason_code_naming_the_problem_and_the_connection_stays(
        cluster, topic, payload, code, field):
    cluster.edge.ingest._max_batch = 2
    cluster.edge.ingest._max_blob = 100
    p = platform5(cluster)
    p.send(Publish5("$SDV-FANOUT/data/d1", b"BLOB", 1, False, False, 1),
           Publish5("$SDV-FANOUT/data/other", b"BLOB2", 1, False, False, 2),
           Publish5("$SDV-FANOUT/trigger", trigger(["V1"]), 1, False, False, 3))
    await cluster.pump()
    assert [c for _p, c, _r in p.acks5()] == [0, 0, 0]
    seq = [s.applied_seq for s in cluster.stores]
    p.send(Publish5(topic, payload, 1, False, False, 4))
    await cluster.pump()
    ((pid, got, text),) = p.acks5()
    assert (pid, got) == (4, code), text
    assert f": {field}: " in text
    assert [s.applied_seq for s in cluster.stores] == seq  # nothing written
    assert not p.closed and p.publishes5() == []  # no errors topic for MQTT 5: the PUBACK says it
    p.send(Publish5("$SDV-FANOUT/trigger", trigger(["V2"], "r2"), 1, False, False, 5))
    await cluster.pump()
    assert p.acks5() == [(5, 0, None)]  # the same connection goes on


async def test_a_publisher_the_acl_refuses_gets_0x87_from_the_broker_core(cluster):
    anonymous = Client5(cluster, "someone")  # role client: may not publish $SDV-FANOUT/#
    anonymous.send(Publish5("$SDV-FANOUT/trigger", trigger(["V1"]), 1, False, False, 1))
    await cluster.pump()
    assert anonymous.acks5() == [(1, RC.NOT_AUTHORIZED, None)] and not cluster.edge.has_tickets()


async def test_a_full_store_is_0x97_and_a_3_1_1_error_body_has_no_reason_code(tmp_path):
    c = Cluster(tmp_path / "n")
    for s in c.stores:
        s.close()
    c.stores = [ShardStore(tmp_path / f"small-{k}", k, sync=False, map_size_bytes=1 << 16, max_map_size_bytes=1 << 16)
                for k in range(2)]
    c.cores = [DispatcherCore(s, k, 2, started_ms=0) for k, s in enumerate(c.stores)]
    c.link = FakeLink(c.cores)
    c.edge.ingest._link = c.link
    try:
        p5 = platform5(c)
        p5.send(Publish5("$SDV-FANOUT/data/big", b"x" * 200_000, 1, False, False, 1))
        await c.pump()
        ((_pid, code, text),) = p5.acks5()
        assert code == RC.QUOTA_EXCEEDED and text.startswith("unavailable: blob store failed: StoreFullError")
        p3 = c.platform("platform-3")
        p3.subscribe("$SDV-FANOUT/errors/platform-3")
        p3.send(Publish("$SDV-FANOUT/data/big", b"x" * 200_000, 1, False, False, 1))
        await c.pump()
        (error,) = p3.publishes()
        body = json.loads(error.payload)
        assert body["error"] == "unavailable" and "reason_code" not in body and p3.closed
        p4 = c.platform("platform-4")
        p4.subscribe("$SDV-FANOUT/errors/platform-4")
        p4.send(Publish("$SDV-FANOUT/trigger", b"not json", 1, False, False, 1))  # alone in its round
        await c.pump()
        (error,) = p4.publishes()
        assert json.loads(error.payload)["field"] == "payload" and "reason_code" not in json.loads(error.payload)
    finally:
        c.close()


# -- 3. forwarded publishes keep their properties ---------------------------------------------------------------

async def test_publishes_forwarded_to_another_node_keep_their_mqtt5_properties(tmp_path):
    a, b = Cluster(tmp_path / "a", node_id="A"), Cluster(tmp_path / "b", node_id="B")
    try:
        a.edge.routes.set_peers(["A", "B"])
        b.edge.routes.set_peers(["A", "B"])
        listener = Client5(b, "listener")
        listener.subscribe5("telemetry/#")
        old = Client(b, "old-3-1-1")
        old.subscribe("telemetry/#")
        added, removed, reset = b.edge.routes.announcement(10_000, filters_fn=b.broker.route_filters)
        a.edge.routes.update("B", added, removed, reset)
        props = Properties(content_type="application/json", user_properties=(("trace", "t-1"), ("campaign", "c9")),
                           response_topic="replies/x", correlation_data=b"\x01\x02", message_expiry_interval=120)
        sender = Client5(a, "sender")
        sender.send(Publish5("telemetry/car1", b"{}", 1, False, False, 1, props),
                    Publish5("telemetry/car2", b"plain", 1, False, False, 2))
        forwards = a.edge.routes.take_forwards()
        assert b.edge.apply_forwards(unpack_batch(pack_batch(forwards["B"]))) == 4  # 2 publishes x 2 subscribers
        b.flush()
        got = listener.publishes5()
        assert [m.topic for m in got] == ["telemetry/car1", "telemetry/car2"]
        first = got[0].properties
        assert (first.content_type, first.user_properties, first.response_topic, first.correlation_data) == (
            "application/json", (("trace", "t-1"), ("campaign", "c9")), "replies/x", b"\x01\x02")
        assert 119 <= first.message_expiry_interval <= 120  # the remaining interval
        assert got[1].properties.user_properties == () and got[1].properties.content_type is None
        assert [m.payload for m in old.publishes()] == [b"{}", b"plain"]  # 3.1.1: topic and payload only
    finally:
        a.close()
        b.close()


# -- a blob larger than the vehicle accepts ----------------------------------------------------------------------

async def test_a_blob_over_the_vehicles_maximum_packet_size_is_discarded_and_the_next_row_delivered(cluster):
    """Not sent (MQTT-3.1.2-25) and recorded: the row is discarded (its request says so) instead of being
    retried on every heartbeat in front of the vehicle's later rows."""
    car = Client5(cluster, "V1", maximum_packet_size=300)
    car.subscribe5("agent/V1/proxy/request/+")
    await cluster.pump()
    p = platform5(cluster)
    p.send(Publish5("$SDV-FANOUT/data/big", b"B" * 1000, 1, False, False, 1),
           Publish5("$SDV-FANOUT/trigger", trigger(["V1"], "r-big", "big"), 1, False, False, 2),
           Publish5("$SDV-FANOUT/data/small", b"small", 1, False, False, 3),
           Publish5("$SDV-FANOUT/trigger", trigger(["V1"], "r-small", "small"), 1, False, False, 4))
    await cluster.pump()
    assert [code for _pid, code, _r in p.acks5()] == [0, 0, 0, 0]
    car.send(Publish5("ecp/V1/online", b"", 0))
    await cluster.pump()
    (msg,) = car.publishes5()
    assert (msg.topic, msg.payload) == ("agent/V1/proxy/request/r-small", b"small")
    car.send(Puback5(msg.packet_id, 0))
    await cluster.pump()
    core = next(c for c in cluster.cores if c.too_large)
    assert core.too_large == 1
    status = core.lifecycle.status("r-big", [])
    assert (status["pending"], status["discarded"]) == (0, 1), status
    assert cluster.pending() == 0
    assert cluster.broker.state.too_large_dropped == 1


# -- fanout deliveries carry the request's MQTT 5 properties -----------------------------------------------------

def test_batch_props_move_the_deadline_to_the_broker_clock_and_build_each_pair_once():
    from fanout.node.delivery_props import BatchProps
    from fanout.records import DeliveryProps
    props = BatchProps(DeliveryProps.build({"r1": 1_012_500}, {}, {}), wall_now_ms=1_000_000, broker_now_ms=500)
    got = props.of("r1", "d1")
    assert got.expires_ms == 500 + 12_500 and got.remaining_s(500) == 13  # rounded up
    assert got.props is EMPTY_PROPERTIES and got.body == b""
    assert props.of("r1", "d1") is got  # one MsgProps for every delivery of the pair
    assert props.of("r2", "d1") is None  # a request without a ttl in the same batch


@pytest.mark.parametrize("ttl, interval, expected_s", [(None, 30, 30), ("20s", None, 20), (None, None, None)])
async def test_a_delivery_to_an_mqtt5_vehicle_carries_the_remaining_expiry_interval(cluster, ttl, interval, expected_s):
    car = Client5(cluster, "V1")
    car.subscribe5("agent/V1/proxy/request/+")
    old = vehicle(cluster, "V2")  # MQTT 3.1.1: the same message without properties
    await cluster.pump()
    body = {"ids": ["V1", "V2"], "request_id": "r1", "data_id": "d1"}
    if ttl is not None:
        body["ttl"] = ttl
    p = platform5(cluster)
    p.send(Publish5("$SDV-FANOUT/data/d1", b"BLOB", 1, False, False, 1),
           Publish5("$SDV-FANOUT/trigger", json.dumps(body).encode(), 1, False, False, 2, expiry(interval)))
    await cluster.pump()
    (msg,) = car.publishes5()
    assert (msg.topic, msg.payload) == ("agent/V1/proxy/request/r1", b"BLOB")
    got = msg.properties.message_expiry_interval
    if expected_s is None:
        assert got is None
    else:
        assert expected_s - 1 <= got <= expected_s  # what is left of the ttl, rounded up
    assert [(m.topic, m.payload) for m in old.publishes()] == [("agent/V2/proxy/request/r1", b"BLOB")]


async def test_a_fanout_message_that_expires_in_the_vehicles_queue_is_not_sent_and_its_row_expires(cluster):
    """The broker holds the deadline: a message queued behind the vehicle's window is dropped once its request's
    ttl has run out, and the dispatcher then settles the row as expired."""
    car = Client5(cluster, "V1", receive_maximum=1)
    car.subscribe5("agent/V1/#")
    await cluster.pump()
    cluster.broker.deliver("V1", "agent/V1/other", b"x", 1, None)  # fills the vehicle's window of 1
    p = platform5(cluster)
    p.send(Publish5("$SDV-FANOUT/data/d1", b"BLOB", 1, False, False, 1),
           Publish5("$SDV-FANOUT/trigger", trigger(["V1"]), 1, False, False, 2, expiry(5)))
    await cluster.pump()
    car.send(Publish5("ecp/V1/online", b"", 0))
    await cluster.pump()
    (first,) = car.publishes5()
    assert first.topic == "agent/V1/other"  # the fanout message waits in the session's queue
    (item,) = cluster.link.items
    cluster.now = cluster.broker.state.now + 6_000  # past the ttl on the broker's clock
    car.send(Puback5(first.packet_id, 0))  # the window opens: the queued message has expired meanwhile
    await cluster.pump()
    assert car.publishes5() == [] and cluster.broker.state.expired_dropped == 1
    car.send(Publish5("ecp/V1/heartbeat", b"", 0))  # the row is picked again: past its ttl at the dispatcher too
    cluster.now = item.ts_ms + 6_000
    await cluster.pump()
    assert car.publishes5() == []
    status = cluster.cores[cluster.link.shards_of[0]].lifecycle.status("r1", [])
    assert (status["pending"], status["expired"]) == (0, 1), status


USERS = (("trace", "t-1"), ("campaign", "c9"), ("trace", "t-2"))  # in order, a name may repeat


async def publish_with_props(cluster: Cluster, p: Client5, request_id: str = "r1", vins=("V1", "V2"), pid: int = 1,
                             users=USERS, content_type: str | None = "application/octet-stream",
                             interval: int | None = 60) -> list:
    p.send(Publish5("$SDV-FANOUT/data/d1", b"BLOB", 1, False, False, pid, Properties(content_type=content_type)),
           Publish5("$SDV-FANOUT/trigger", trigger(list(vins), request_id), 1, False, False, pid + 1,
                    Properties(user_properties=users, message_expiry_interval=interval)))
    await cluster.pump()
    return p.acks5()


async def test_deliveries_carry_the_triggers_user_properties_and_the_blobs_content_type(cluster):
    car = Client5(cluster, "V1")
    car.subscribe5("agent/V1/proxy/request/+")
    old = vehicle(cluster, "V2")
    await cluster.pump()
    assert await publish_with_props(cluster, platform5(cluster)) == [(1, 0, None), (2, 0, None)]
    (msg,) = car.publishes5()
    assert (msg.topic, msg.payload) == ("agent/V1/proxy/request/r1", b"BLOB")
    props = msg.properties
    assert (props.user_properties, props.content_type) == (USERS, "application/octet-stream")
    assert 59 <= props.message_expiry_interval <= 60
    assert [m.payload for m in old.publishes()] == [b"BLOB"]  # 3.1.1: the same message without properties
    # a request without properties in the same vehicle's queue: a plain MQTT 5 delivery
    car.send(Puback5(msg.packet_id, 0))
    p = platform5(cluster, "platform-b")
    p.send(Publish5("$SDV-FANOUT/data/d2", b"TWO", 1, False, False, 1),
           Publish5("$SDV-FANOUT/trigger", trigger(["V1"], "r2", "d2"), 1, False, False, 2))
    await cluster.pump()
    (plain,) = car.publishes5()
    assert plain.payload == b"TWO" and plain.properties == EMPTY_PROPERTIES


async def test_a_blob_published_again_takes_the_content_type_of_its_latest_publish(cluster):
    car = Client5(cluster, "V1")
    car.subscribe5("agent/V1/proxy/request/+")
    await cluster.pump()
    p = platform5(cluster)
    await publish_with_props(cluster, p, users=(), content_type="text/plain", interval=None)
    (first,) = car.publishes5()
    assert first.properties.content_type == "text/plain"
    car.send(Puback5(first.packet_id, 0))
    await publish_with_props(cluster, p, "r2", pid=3, users=(), content_type=None, interval=None)  # same blob, no type
    (second,) = car.publishes5()
    assert second.properties == EMPTY_PROPERTIES


@pytest.mark.parametrize("users, reason", [
    (tuple(("k", str(i)) for i in range(33)), "33 user properties, at most 32"),
    ((("big", "v" * 4094),), "4097 bytes of user properties, at most 4096"),
])
async def test_user_properties_over_the_bounds_are_refused_with_0x97_and_write_nothing(cluster, users, reason):
    p = platform5(cluster)
    p.send(Publish5("$SDV-FANOUT/data/d1", b"BLOB", 1, False, False, 1))
    await cluster.pump()
    seq = [s.applied_seq for s in cluster.stores]
    p.send(Publish5("$SDV-FANOUT/trigger", trigger(["V1"]), 1, False, False, 2, Properties(user_properties=users)))
    await cluster.pump()
    (_blob, (pid, code, text)) = p.acks5()
    assert (pid, code) == (2, RC.QUOTA_EXCEEDED)
    assert text == f"invalid_trigger: user_properties: {reason}"
    assert [s.applied_seq for s in cluster.stores] == seq and not p.closed
    at_bound = users[:32] if len(users) > 32 else (("big", "v" * 4093),)
    p.send(Publish5("$SDV-FANOUT/trigger", trigger(["V1"]), 1, False, False, 3, Properties(user_properties=at_bound)))
    await cluster.pump()
    assert p.acks5() == [(3, 0, None)]


async def test_a_restarted_dispatcher_still_sends_the_properties_from_its_store(cluster):
    """The properties are durable: a dispatcher started afresh on the same store (a restart, a promoted replica)
    reads them from the ``reqprops``/``blobprops`` tables, not from anything the ingest left in memory."""
    assert [c for _p, c, _r in await publish_with_props(cluster, platform5(cluster), vins=("V1",))] == [0, 0]
    shard = cluster.link.shards_of[0]
    cluster.cores[shard] = DispatcherCore(cluster.stores[shard], shard, 2, started_ms=0)
    cluster.link.cores = cluster.cores
    assert cluster.cores[shard].lifecycle.user_properties == {"r1": USERS}
    car = Client5(cluster, "V1")
    car.subscribe5("agent/V1/proxy/request/+")
    car.send(Publish5("ecp/V1/online", b"", 0))
    await cluster.pump()
    (msg,) = car.publishes5()
    assert (msg.properties.user_properties, msg.properties.content_type) == (USERS, "application/octet-stream")
    assert 59 <= msg.properties.message_expiry_interval <= 60
