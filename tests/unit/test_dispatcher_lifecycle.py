"""Request lifecycle in DispatcherCore over a real ShardStore: ttl checked when a row is picked, cancel, the
GC sweep of lapsed requests, status with rows in flight, and the expiry cache rebuilt after a restart."""
from __future__ import annotations

import pytest

from fanout.dispatcher.core import DispatcherCore
from fanout.dispatcher.lifecycle import merge, request_of
from fanout.records import (
    AckEvent, BlobItem, ConnectEvent, DeliveryProps, HeartbeatEvent, IngestItem, SubscribedEvent, join_vins,
)
from storage import ShardStore
from storage.keys import ids_key


def new_core(path) -> DispatcherCore:
    store = ShardStore(path, 0, sync=False)
    c = DispatcherCore(store, 0, 1, started_ms=0)
    store.apply(c.blob_batch([BlobItem.build("d1", b"BLOB", 1)]))
    c.blobs_stored([BlobItem.build("d1", b"BLOB", 1)])
    return c


@pytest.fixture
def core(tmp_path):
    c = new_core(tmp_path / "shard-0")
    yield c
    c.store.close()


def online(core: DispatcherCore, vins: list[str]) -> None:
    core.apply_events("n0", [e for i, v in enumerate(vins) for e in (
        ConnectEvent.build(v, 10 + i, False, False, None), SubscribedEvent.build(v, 10 + i, True, None))])


def gen(vin: str, vins: list[str]) -> int:
    return 10 + vins.index(vin)


def ingest(core: DispatcherCore, request_id: str, vins: list[str], ts_ms: int, ttl_ms: int = 0) -> None:
    batch, results, vin_lists = core.ingest_batch([IngestItem.build(request_id, "d1", join_vins(vins), ts_ms, ttl_ms)])
    core.store.apply(batch)
    for vl in vin_lists:
        core.dispatch_new(vl)


def settle(core: DispatcherCore, now_ms: int) -> None:
    """Write the tick's deletes, as the actor does."""
    core.drain(now_ms)
    taken = core.take_deletes(now_ms)
    if taken is not None:
        core.store.apply(taken[0])
        core.deletes_applied(taken[1])


def sent(core: DispatcherCore, now_ms: int) -> list[tuple]:
    settle(core, now_ms)
    sends = core.take_node_batch("n0")[0]
    return [(s[0], s[3]) for s in sends]


def test_a_row_picked_after_its_ttl_is_expired_not_sent(core):
    ingest(core, "late", ["A", "B"], 1_000, ttl_ms=500)
    ingest(core, "keep", ["A"], 1_001)
    online(core, ["A", "B"])
    core.apply_events("n0", [HeartbeatEvent.build("A", 10), HeartbeatEvent.build("B", 11)])
    # picked at 1,600 > 1,000 + 500: both rows of "late" expire, A gets its next row instead
    assert sent(core, 1_600) == [("A", "keep")]
    status = core.request_status("late")
    assert (status["vins"], status["pending"], status["expired"], status["inflight"]) == (2, 0, 2, 0)
    assert core.store.next_rows("B") == []


def test_a_trigger_without_ttl_keeps_its_requests_expiry_after_the_sweep_as_after_a_restart(core):
    # Found by test_lifecycle_properties: "r" expires at 1,050 and is swept; a trigger without a ttl then names
    # it again. The store keeps the request's expires_ms, and a restarted core would load it (rows pending), so
    # the live core must not send the new row at or after 1,050 either.
    ingest(core, "r", ["B"], 1_000, ttl_ms=50)
    online(core, ["A"])
    taken = core.lifecycle.sweep_batch(1_050)
    assert taken is not None
    core.store.apply(taken[0])
    core.lifecycle.swept(taken[1])
    ingest(core, "r", ["A"], 1_050)
    restarted = DispatcherCore(core.store, 0, 1, started_ms=0)  # what a restart would know of the request
    assert core.lifecycle.expires["r"] == restarted.lifecycle.expires["r"] == 1_050
    assert sent(core, 1_050) == []
    status = core.request_status("r")
    assert (status["vins"], status["pending"], status["expired"]) == (2, 0, 2)


def test_a_row_within_its_ttl_is_sent_and_the_sweep_expires_the_rest(core):
    ingest(core, "r", ["A", "B"], 1_000, ttl_ms=500)
    online(core, ["A"])
    core.apply_events("n0", [HeartbeatEvent.build("A", 10)])
    assert sent(core, 1_200) == [("A", "r")]
    assert core.request_status("r")["inflight"] == 1
    assert core.lifecycle.sweep_batch(1_400) is None  # not lapsed yet
    batch, lapsed = core.lifecycle.sweep_batch(1_500)
    assert lapsed == ["r"] and core.store.apply(batch).counts["expired_rows"] == 2  # A's in flight, B's pending
    core.lifecycle.swept(lapsed)
    core.apply_events("n0", [AckEvent.build("A", 10, ids_key("A", 1_000, "r"))])  # the in-flight one arrives
    settle(core, 1_600)
    status = core.request_status("r")
    assert (status["delivered"], status["expired"], status["pending"], status["inflight"]) == (1, 1, 0, 0)
    assert status["first_delivery_ms"] == 1_600


def test_cancel_stops_queued_sends_records_a_late_puback_and_frees_the_vehicles(core):
    vins = ["A", "B", "C"]
    ingest(core, "r", vins, 1_000)
    ingest(core, "next", ["B"], 1_001)
    online(core, ["A", "B"])
    core.apply_events("n0", [HeartbeatEvent.build("A", 10)])
    assert sent(core, 1_100) == [("A", "r")]  # A's row is in flight on the node
    core.apply_events("n0", [HeartbeatEvent.build("B", 11)])
    core.drain(1_150)  # B's row of r is queued for the node, not shipped yet
    batch = core.begin_cancel("r", 1_200)
    assert core.take_node_batch("n0")[0] == []  # B's queued delivery of r is dropped
    assert core.store.apply(batch).counts["cancelled_rows"] == 3
    assert core.end_cancel("r") == 1  # B was held back: it is ready again
    assert sent(core, 1_300) == [("B", "next")]  # nothing more of r; B gets its next request
    core.apply_events("n0", [AckEvent.build("A", 10, ids_key("A", 1_000, "r"))])
    settle(core, 1_400)
    status = core.request_status("r")
    assert (status["vins"], status["delivered"], status["cancelled"], status["pending"]) == (3, 1, 2, 0)
    assert merge([status])["state"] == "cancelled"
    online(core, ["C"])
    core.apply_events("n0", [HeartbeatEvent.build("C", 10)])
    assert sent(core, 1_500) == []


def test_a_send_picked_while_a_cancel_is_under_way_is_held_back(core):
    ingest(core, "r", ["A"], 1_000)
    ingest(core, "s", ["A"], 1_001)
    online(core, ["A"])
    batch = core.begin_cancel("r", 1_050)  # not durable yet: A's heartbeat picks r's row, which is held back
    core.apply_events("n0", [HeartbeatEvent.build("A", 10)])
    assert sent(core, 1_100) == []
    core.store.apply(batch)
    assert core.end_cancel("r") == 1
    assert sent(core, 1_200) == [("A", "s")]


def test_expiry_cache_and_counters_survive_a_restart(tmp_path):
    c = new_core(tmp_path / "shard-0")
    ingest(c, "r", ["A"], 1_000, ttl_ms=500)
    ingest(c, "done", ["B"], 1_000, ttl_ms=500)
    online(c, ["B"])
    c.apply_events("n0", [HeartbeatEvent.build("B", 10)])
    sent(c, 1_100)
    c.apply_events("n0", [AckEvent.build("B", 10, ids_key("B", 1_000, "done"))])
    settle(c, 1_200)
    c.store.close()
    c = new_core(tmp_path / "shard-0")
    try:
        assert c.lifecycle.expires == {"r": 1_500}  # "done" has nothing pending
        online(c, ["A"])
        c.apply_events("n0", [HeartbeatEvent.build("A", 10)])
        assert sent(c, 2_000) == []
        assert c.request_status("r")["expired"] == 1 and c.request_status("done")["delivered"] == 1
        assert [r["request_id"] for r in c.list_requests(10)] == ["done", "r"]
    finally:
        c.store.close()


def test_request_of_an_ids_key():
    assert request_of(ids_key("VIN1", 123, "req/1")) == "req/1"


# -- User Properties of requests (MQTT 5) ---------------------------------------------------------------------------

def ingest_props(core: DispatcherCore, request_id: str, vins: list[str], ts_ms: int, users: tuple) -> None:
    item = IngestItem.build(request_id, "d1", join_vins(vins), ts_ms, 0, users)
    batch, _results, vin_lists = core.ingest_batch([item])
    core.store.apply(batch)
    for vl in vin_lists:
        core.dispatch_new(vl)


def test_user_properties_go_with_their_deliveries_and_are_forgotten_when_the_request_is_done(core):
    users = (("trace", "t-1"),)
    online(core, ["A", "B"])
    ingest_props(core, "r", ["A"], 100, users)
    ingest(core, "plain", ["B"], 100)
    settle(core, 200)
    sends, _payloads, _kicks, props = core.take_node_batch("n0")
    assert sorted((s[0], s[3]) for s in sends) == [("A", "r"), ("B", "plain")]
    assert DeliveryProps(*props) == DeliveryProps({}, {"r": users}, {})  # only the request that has some
    core.lifecycle.forget_done()
    assert core.lifecycle.user_properties == {"r": users}  # pending (in flight), and fresh
    core.apply_events("n0", [AckEvent.build("A", gen("A", ["A", "B"]), sends[0][2] if sends[0][0] == "A" else sends[1][2])])
    settle(core, 300)
    core.lifecycle.forget_done()
    assert core.lifecycle.user_properties == {}  # delivered everywhere on the shard: forgotten
    ingest_props(core, "r2", ["A"], 400, users)
    core.store.apply(core.lifecycle.begin_cancel("r2", 401))  # nothing pending, but ingested since the last call
    core.lifecycle.user_properties["r2"] = users  # (a cancel forgets it: put back to see forget_done keep it)
    core.lifecycle.forget_done()
    assert core.lifecycle.user_properties == {"r2": users}  # its rows may not be written yet: kept once
    core.lifecycle.forget_done()
    assert core.lifecycle.user_properties == {}
    assert DispatcherCore(core.store, 0, 1).lifecycle.user_properties == {}  # a restart does not load it either


def test_a_restarted_core_loads_the_user_properties_of_requests_with_rows_pending(core):
    ingest_props(core, "r", ["A"], 100, (("campaign", "c9"),))
    again = DispatcherCore(core.store, 0, 1, started_ms=0)
    assert again.lifecycle.user_properties == {"r": (("campaign", "c9"),)}
    assert again.inspect_request("r")["user_properties"] == (("campaign", "c9"),)  # fanout inspect request
    assert again.inspect_data("d1")["content_type"] is None
    online(again, ["A"])
    again.apply_events("n0", [HeartbeatEvent.build("A", 10)])  # connecting alone sends nothing
    settle(again, 200)
    sends, _payloads, _kicks, props = again.take_node_batch("n0")
    assert [s[3] for s in sends] == ["r"]
    assert DeliveryProps(*props).user_properties == {"r": (("campaign", "c9"),)}
