"""DispatcherCore's ingest policy as the Dispatcher actor runs it: a big trigger written head first, each
part built only when the previous one is durable, new rows dispatched in slices."""
from __future__ import annotations

import pytest

from benchmarks.local_link import LocalShardLink
from fanout.dispatcher import core as core_module
from fanout.dispatcher.core import DispatcherCore
from fanout.dispatcher.ingest_batch import HEAD_WRITE_VINS, IngestJob
from fanout.dispatcher.introspection import inspect_request
from fanout.records import (
    CONFLICT_PREFIX, BlobItem, ConnectEvent, HeartbeatEvent, IngestItem, SubscribedEvent, join_vins,
)
from storage import ShardStore, WriteBatch
from storage.batch import DISCARD
from storage.keys import ids_key


@pytest.fixture
def core(tmp_path):
    store = ShardStore(tmp_path / "shard-0", 0, sync=False)
    c = DispatcherCore(store, 0, 1, started_ms=0)
    store.apply(c.blob_batch([BlobItem.build("d1", b"BLOB", 1)]))
    c.blobs_stored([BlobItem.build("d1", b"BLOB", 1)])
    yield c
    store.close()


def online(core: DispatcherCore, vins: list[str]) -> None:
    core.apply_events("n0", [e for i, v in enumerate(vins) for e in (
        ConnectEvent.build(v, 10 + i, False, False, None), SubscribedEvent.build(v, 10 + i, True, None))])


def test_big_trigger_head_is_durable_and_dispatched_before_the_rest_is_built(core):
    vins = [f"V{i:05d}" for i in range(3 * HEAD_WRITE_VINS)]
    online(core, vins[:2] + vins[-2:])
    built: list[int] = []

    def build(items):
        built.append(sum(len(i[2].split("\n")) for i in items))
        return core.ingest_batch(items)

    job = IngestJob([IngestItem.build("r1", "d1", join_vins(vins), 5)], build)
    parts = job.parts()
    head = next(parts)
    assert head.head and built == [HEAD_WRITE_VINS]  # the rest is not built before the head is written
    core.store.apply(head.batch)
    assert sum(n for n, _ in core.dispatch_slices(head.vin_lists)) == 2  # the head's online vehicles
    core.drain(20)
    assert sorted(s[0] for s in core.take_node_batch("n0")[0]) == vins[:2]
    rest = next(parts)
    assert not rest.head and built == [HEAD_WRITE_VINS, 2 * HEAD_WRITE_VINS]
    core.store.apply(rest.batch)
    assert sum(n for n, _ in core.dispatch_slices(rest.vin_lists)) == 2
    assert list(parts) == []
    assert job.results() == [{"vins": len(vins)}]
    assert core.store.pending_count() == len(vins)


def test_small_trigger_is_one_part_and_errors_are_merged_per_item(core):
    job = core.ingest_job([IngestItem.build("r1", "d1", "A1\nA2", 5), IngestItem.build("r2", "nope", "A1", 5)])
    parts = list(job.parts())
    assert [p.head for p in parts] == [False]
    assert job.results() == [{"vins": 2}, "unknown data_id 'nope' on shard 0"]
    big = core.ingest_job([IngestItem.build("r3", "nope", join_vins([f"B{i}" for i in range(600)]), 5)], 256)
    assert [(bool(p.batch), p.head) for p in big.parts()] == [(False, True), (False, False)]
    assert big.results() == ["unknown data_id 'nope' on shard 0"]  # head and rest report the error once


def test_dispatch_slices_give_way_only_inside_a_big_list(core, monkeypatch):
    monkeypatch.setattr(core_module, "DISPATCH_SLICE", 3)
    online(core, ["A1", "A7"])
    lists = [["A1", "A2"], [f"A{i}" for i in range(3, 10)]]
    assert list(core.dispatch_slices(lists)) == [(1, False), (0, True), (1, True), (0, True)]


async def test_the_local_link_runs_the_same_job_as_the_actor(core):
    link = LocalShardLink([core])
    vins = [f"C{i:04d}" for i in range(2 * HEAD_WRITE_VINS + 10)]
    assert await link.ingest(0, [IngestItem.build("r1", "d1", join_vins(vins), 5)]) == [{"vins": len(vins)}]
    assert core.commits == 2  # head, then rest


def test_a_row_whose_blob_is_gone_is_recorded_discarded_not_delivered(core):
    core.store.apply(core.blob_batch([BlobItem.build("d2", b"TWO", 1)]))
    core.store.apply(WriteBatch().enqueue("V1", 5, "r1", "d1").enqueue("V1", 6, "r2", "d2"))
    core.store.apply(WriteBatch().delete_blob("d1"))  # garbage-collected before V1 came online
    core.forget_data()
    online(core, ["V1"])
    core.apply_events("n0", [HeartbeatEvent.build("V1", 10)])
    core.drain(20)
    sends = core.take_node_batch("n0")[0]
    assert [s[3] for s in sends] == ["r2"]  # r1 dropped, the next row went out
    batch, deletes = core.take_deletes(20)
    core.store.apply(batch)
    core.deletes_applied(deletes)
    assert core.store.get_req("r1", "V1")["status"] == "discarded"
    assert core.store.get_req("r2", "V1")["status"] == "pending"
    assert core.store.pending_count("V1") == 1
    assert inspect_request(core, "r1")["by_status"] == {"discarded": 1}


def test_discard_rows_is_ack_rows_with_its_own_status(core):
    core.store.apply(WriteBatch().enqueue_many(["A1", "A2"], 5, "r1", "d1"))
    keys = [ids_key("A1", 5, "r1"), ids_key("A2", 5, "r1")]
    result = core.store.apply(WriteBatch().ack_rows(keys[:1], 9).discard_rows(keys[1:], 9))
    assert (result.counts["ack_deleted"], result.counts["discard_deleted"]) == (1, 1)
    assert [core.store.get_req("r1", v)["status"] for v in ("A1", "A2")] == ["delivered", "discarded"]
    assert core.store.get_req("r1", "A2")["delivered_ts_ms"] == 9
    with pytest.raises(ValueError):
        WriteBatch().discard_rows([b"not-a-key"], 1)
    assert WriteBatch.from_bytes(WriteBatch().discard_rows(keys, 9).to_bytes()).ops[0][0] == DISCARD


def test_an_ingest_call_refuses_a_conflicting_trigger_whole_even_a_big_one(core):
    core.store.apply(core.blob_batch([BlobItem.build("d2", b"TWO", 1)]))
    vins = [f"V{i:05d}" for i in range(3 * HEAD_WRITE_VINS)]
    core.store.apply(WriteBatch().enqueue_many(vins[-1:], 5, "r1", "d1"))  # the last VIN: in the rest part
    seq = core.store.applied_seq
    assert core.requests_in_use(["r1", "r2"]) == [True, False]
    items = [IngestItem.build("r1", "d2", join_vins(vins), 6), IngestItem.build("r2", "d2", "W1", 6),
             IngestItem.build("r2", "d1", "W1\nW2", 6)]  # conflicts with the item before it in the call
    job = core.ingest_job(items)
    for part in job.parts():
        if part.batch:
            core.store.apply(part.batch)
    results = job.results()
    assert results[0].startswith(CONFLICT_PREFIX) and repr(vins[-1]) in results[0]
    assert results[1] == {"vins": 1} and results[2].startswith(CONFLICT_PREFIX) and "'W1'" in results[2]
    assert core.store.applied_seq == seq + 1 and core.store.pending_count() == 2  # only r2/W1 written
    assert core.trigger_conflicts([IngestItem.build("r1", "d1", join_vins(vins), 7)]) == [None]  # a re-send


def test_stats_and_inspect_read_a_vehicle_in_flight(core):
    core.store.apply(WriteBatch().enqueue("V1", 5, "r1", "d1"))
    online(core, ["V1"])
    core.apply_events("n0", [HeartbeatEvent.build("V1", 10)])
    core.drain(20)
    state = core.inspect_vin("V1")
    assert state["state"]["inflight"] == {"request_id": "r1", "ts_ms": 5, "sent_ms": 20}
    assert state["connection"] == {"node": "n0", "generation": 10} and state["pending_rows"] == 1
    stats = core.stats()
    assert (stats["in_flight"], stats["connected"], stats["vehicles"], stats["clients"]) == (1, 1, 1, 1)
    assert core.inspect_request("r1")["by_status"] == {"pending": 1}
    assert core.inspect_data("d1")["size"] == 4
