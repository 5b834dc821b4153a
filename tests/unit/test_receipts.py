"""Delivery receipts: the ops that settle a (request, VIN) row append exactly one entry to the built-in ``receipts``
topic in the same transaction (storage.batch_apply, storage.topic_apply)."""
from __future__ import annotations

import json

import pytest

from storage import WriteBatch, keys, tables, topics

T0 = 1_700_000_000_000
R = topics.RECEIPTS_NAME


@pytest.fixture
def store(make_store):
    s = make_store(2)
    s.apply(WriteBatch().put_blob("d", b"B", T0))
    return s


def receipts(store, shard=2) -> list[dict]:
    return [json.loads(e.payload) for e in store.topic_read(R, shard, 0, 10_000)]


def row_key(vin, request_id="r1", ts=T0):
    return keys.ids_key(vin, ts, request_id)


def test_an_ack_writes_one_delivered_receipt_in_the_shards_partition(store):
    store.apply(WriteBatch().enqueue_many(["V1", "V2"], T0, "r1", "d"))
    store.apply(WriteBatch().ack_rows([row_key("V1")], T0 + 7))
    [entry] = store.topic_read(R, 2, 0, 10)
    assert (entry.offset, entry.ts_ms, entry.mqtt_topic, entry.client_id, entry.qos, entry.properties) == (
        0, T0 + 7, "$SDV-FANOUT/receipts/V1", "", 1, None)
    assert entry.payload == b'{"request_id":"r1","vin":"V1","data_id":"d","status":"delivered","ts_ms":%d}' % (T0 + 7)
    assert store.topic_bounds(R, 2) == (0, 1) and store.topic_bounds(R, 0) == (0, 0)


def test_the_envelope_is_the_msgpack_of_the_entry(store):
    """The receipt's value is built from cached parts: it must be exactly what packing the envelope gives."""
    vins = ["V1", "WVW-ZZZ_1", 'Q"x\\y']
    store.apply(WriteBatch().enqueue_many(vins, T0, 'r"ü', "d"))
    store.apply(WriteBatch().ack_rows([row_key(v, 'r"ü') for v in vins], T0 + 1))
    rows, _ = store.scan(tables.TOPIC_LOG)
    with store.snapshot_view() as view:
        [(_, raw_values)] = list(view.raw_chunks(tables.TOPIC_LOG))
    for row, raw in zip(rows, raw_values):
        assert raw == topics.pack([row["ts_ms"], row["mqtt_topic"], row["client_id"], row["qos"], row["payload"],
                                   row["properties"]])
        assert json.loads(row["payload"])["request_id"] == 'r"ü'
    assert sorted(r["vin"] for r in receipts(store)) == sorted(vins)


def test_a_repeated_or_unknown_ack_writes_no_second_receipt(store):
    store.apply(WriteBatch().enqueue_many(["V1"], T0, "r1", "d"))
    store.apply(WriteBatch().ack_rows([row_key("V1")], T0 + 1))
    store.apply(WriteBatch().ack_rows([row_key("V1")], T0 + 2).ack("V9", T0, "r1", T0 + 2))
    assert [r["status"] for r in receipts(store)] == ["delivered"]


def test_discard_and_expire_write_their_status_once(store):
    store.apply(WriteBatch().enqueue_many(["V1", "V2"], T0, "r1", "d"))
    store.apply(WriteBatch().discard_rows([row_key("V1")], T0 + 1).expire_rows([row_key("V2")], T0 + 2))
    store.apply(WriteBatch().discard_rows([row_key("V1")], T0 + 3).expire_rows([row_key("V2")], T0 + 4))
    assert [(r["vin"], r["status"], r["ts_ms"]) for r in receipts(store)] == [
        ("V1", "discarded", T0 + 1), ("V2", "expired", T0 + 2)]


def test_settle_pending_writes_one_receipt_per_pending_row(store):
    store.apply(WriteBatch().enqueue_many(["V1", "V2", "V3"], T0, "r1", "d"))
    store.apply(WriteBatch().ack_rows([row_key("V2")], T0 + 1))
    store.apply(WriteBatch().settle_pending("r1", "cancelled", T0 + 2))
    store.apply(WriteBatch().settle_pending("r1", "cancelled", T0 + 3))
    assert [(r["vin"], r["status"]) for r in receipts(store)] == [
        ("V2", "delivered"), ("V1", "cancelled"), ("V3", "cancelled")]
    store.apply(WriteBatch().enqueue_many(["V1"], T0, "r2", "d"))
    store.apply(WriteBatch().settle_pending("r2", "expired", T0 + 4))
    assert receipts(store)[-1] == {"request_id": "r2", "vin": "V1", "data_id": "d", "status": "expired",
                                   "ts_ms": T0 + 4}


def test_settle_ids_if_writes_a_receipt_only_for_a_pending_row(store):
    store.apply(WriteBatch().enqueue_many(["V1", "V2"], T0, "r1", "d"))
    store.apply(WriteBatch().ack_rows([row_key("V2")], T0 + 1))
    b = WriteBatch().settle_ids_if("V1", T0, "r1", "d", "expired", T0 + 5)
    b.settle_ids_if("V2", T0, "r1", "d", "discarded", T0 + 5)  # acked: its ids row is gone, guard skips it
    store.apply(b)
    store.apply(WriteBatch().settle_ids_if("V1", T0, "r1", "d", "expired", T0 + 6))
    assert [(r["vin"], r["status"]) for r in receipts(store)] == [("V2", "delivered"), ("V1", "expired")]


def test_a_late_puback_of_a_cancelled_row_records_its_delivery(store):
    store.apply(WriteBatch().enqueue_many(["V1"], T0, "r1", "d"))
    store.apply(WriteBatch().settle_pending("r1", "cancelled", T0 + 1))
    store.apply(WriteBatch().ack_rows([row_key("V1")], T0 + 2))
    store.apply(WriteBatch().ack_rows([row_key("V1")], T0 + 3))
    assert [r["status"] for r in receipts(store)] == ["cancelled", "delivered"]
    assert store.get_req("r1", "V1")["status"] == "delivered"


def test_receipts_and_appends_of_one_batch_share_the_counter(store):
    store.apply(WriteBatch().enqueue_many(["V1", "V2"], T0, "r1", "d"))
    b = WriteBatch().ack_rows([row_key("V1")], T0 + 1)
    b.topic_append(R, 2, T0 + 1, [("$SDV-FANOUT/receipts/X", "", 1, b"{}", None)])
    b.ack_rows([row_key("V2")], T0 + 2).topic_prune_if(R, 2, 1)
    res = store.apply(b)
    assert res.topic_offsets == [(R, 2, 1, 1)]
    assert [e.offset for e in store.topic_read(R, 2, 0, 10)] == [1, 2]  # offset 0 pruned in the same batch
    assert store.topic_bounds(R, 2) == (1, 3)


def test_a_cancel_bigger_than_the_pending_buffer_writes_every_receipt_in_order(store, monkeypatch):
    from storage import topic_apply

    monkeypatch.setattr(topic_apply, "_PENDING_MAX", 7)
    vins = [f"V{i:03d}" for i in range(50)]
    store.apply(WriteBatch().enqueue_many(vins, T0, "r1", "d"))
    store.apply(WriteBatch().ack_rows([row_key("V000")], T0 + 1).settle_pending("r1", "cancelled", T0 + 2))
    got = receipts(store)
    assert [r["vin"] for r in got] == vins and [r["status"] for r in got].count("cancelled") == 49
    assert store.topic_bounds(R, 2) == (0, 50)
