"""The hot-path helpers: tick-scoped queue cursor, key-based acks, head/rest split, batch packing, the
covering-filter shortcut of ``Broker.deliver``."""
from __future__ import annotations

import pytest

from fanout.config import load_config, mqtt_settings
from fanout.mqtt.auth import AccessControl
from fanout.mqtt.broker import Broker
from fanout.mqtt.codec import encode
from fanout.mqtt.hooks import DeliverStatus
from fanout.mqtt.packets import Connect, Subscribe
from fanout.dispatcher.ingest_batch import merge_head_result, split_head
from fanout.dispatcher.rows import TickRows
from fanout.records import IngestItem, join_vins, pack_batch, split_vins, unpack_batch
from storage import WriteBatch
from storage.keys import ids_key


def _queue(store, vin: str, n: int) -> list[bytes]:
    batch = WriteBatch()
    for i in range(n):
        batch.enqueue_many([vin], 1000 + i, f"r{i}", "d1")
    store.apply(batch)
    return [ids_key(vin, 1000 + i, f"r{i}") for i in range(n)]


def test_queue_cursor_skips_keys_and_stays_within_the_vin(store):
    keys = _queue(store, "A1", 3)
    _queue(store, "A10", 1)  # "A1" + NUL never prefixes "A10"'s rows
    with store.queue_cursor() as qc:
        assert qc.first_row("A1").key == keys[0]
        row = qc.first_row("A1", {keys[0], keys[1]})
        assert (row.key, row.vin, row.ts_ms, row.request_id, row.data_id) == (keys[2], "A1", 1002, "r2", "d1")
        assert qc.first_row("A1", set(keys)) is None
        assert qc.row_after("A1", keys[1]).key == keys[2]
        assert qc.row_after("A1", keys[2]) is None
        assert qc.first_row("NOPE") is None


def test_tick_rows_same_answers_inside_and_outside_a_block(store):
    keys = _queue(store, "V1", 3)
    rows = TickRows(store)
    outside = [rows.next_row_skipping("V1", {keys[0]}).key, rows.next_row("V1", after=keys[0]).key]
    with rows.reading():
        inside = [rows.next_row_skipping("V1", {keys[0]}).key, rows.next_row("V1", after=keys[0]).key]
    assert outside == inside == [keys[1], keys[1]]


def test_ack_rows_equals_ack(store):
    keys = _queue(store, "V1", 2)
    by_key = WriteBatch().ack_rows(keys, 5000)
    by_parts = WriteBatch()
    for i in range(2):
        by_parts.ack("V1", 1000 + i, f"r{i}", 5000)
    assert by_key.ops == by_parts.ops
    store.apply(by_key)
    assert store.next_rows("V1") == [] and store.get_req("r1", "V1")["status"] == "delivered"
    with pytest.raises(ValueError):
        WriteBatch().ack_rows([b"no-separator"], 1)


def test_split_head_keeps_every_vin_once_and_merges_results():
    vins = [f"V{i:03d}" for i in range(10)]
    items = [IngestItem.build("r1", "d1", join_vins(vins), 7, 60_000, (("trace", "t1"),)),
             IngestItem.build("r2", "d1", "X1", 8, 0)]
    assert split_head(items, 5) is None  # not much bigger than the head
    head, rest = split_head(items, 3)
    assert split_vins(head[0][2]) == vins[:3] and split_vins(rest[0][2]) == vins[3:]
    assert head[0][::3] == rest[0][::3] == ("r1", 7) and rest[1] == items[1]
    assert head[0][4] == rest[0][4] == 60_000  # the ttl goes with both parts
    assert head[0][5] == rest[0][5] == (("trace", "t1"),)  # and the trigger's User Properties
    assert merge_head_result({"vins": 3}, {"vins": 7}) == {"vins": 10}
    assert merge_head_result("unknown data_id", "unknown data_id") == "unknown data_id"


def test_pack_batch_roundtrip_and_passthrough():
    batch = [(4, "V1", 12345678901234, b"V1\x00key"), (3, "V2", 1)]
    assert unpack_batch(pack_batch(batch)) == batch
    assert unpack_batch(batch) is batch


def test_deliver_covering_hint_falls_back_to_the_full_match():
    cfg = load_config(None, env={})
    broker = Broker(mqtt_settings(cfg), AccessControl(mqtt_settings(cfg), listener_is_loopback=True), None, now_ms=1)
    conn = broker.connection_made(1, ("127.0.0.1", 1))
    broker.data_received(conn, encode(Connect("V1", True, 60, None, None, None))
                         + encode(Subscribe(1, (("agent/V1/proxy/request/+", 0), ("agent/V1/proxy/request/r1", 1)))), 1)
    broker.flush()
    # The covering filter grants QoS 0 only: the exact filter's QoS 1 still wins (the full scan decides).
    assert broker.deliver("V1", "agent/V1/proxy/request/r1", b"x", 1, b"k",
                          covering={"agent/V1/proxy/request/+"}) == DeliverStatus.SENT
    assert broker.sessions["V1"].inflight  # sent at QoS 1
    # A covering filter no longer subscribed is ignored, not trusted.
    assert broker.deliver("V1", "agent/V1/proxy/request/r2", b"x", 1, b"k2",
                          covering={"agent/V1/gone/+"}) == DeliverStatus.SENT
    assert broker.deliver("V1", "other/topic", b"x", 1, b"k3", covering=set()) == DeliverStatus.NOT_SUBSCRIBED
