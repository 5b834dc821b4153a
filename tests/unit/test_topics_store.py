"""Durable topics in the shard store (storage.topics, storage.topic_apply): catalog, append and read by offset,
bounds, group offsets, pruning, replication by batch bytes, map growth ahead of big appends."""
from __future__ import annotations

import hashlib
import zlib

import lmdb
import pytest
from structlog.testing import capture_logs

from storage import ShardStore, StoreError, WriteBatch, tables, topics
from storage.replication_protocol import Ack, ReplicaApplier
from storage.topic_apply import put_log
from storage.topics import RECEIPTS, LogEntry, TopicSpec

T0 = 1_700_000_000_000
TOPIC_TABLES = (tables.TOPICS, tables.TOPIC_LOG, tables.TOPIC_COUNTERS, tables.TOPIC_OFFSETS)


def open_store(path, shard_id=0, **kw):
    return ShardStore(path, shard_id, sync=False, **kw)


def entry(i: int, vin: str = "V1", props=None) -> tuple:
    return (f"ecp/{vin}/response", vin, 1, f"m{i}".encode(), props)


def append(store, n, partition=0, topic="resp", start=0, ts=T0):
    return store.apply(WriteBatch().topic_append(topic, partition, ts, [entry(start + i) for i in range(n)]))


def digest(store, dbs=TOPIC_TABLES) -> dict[str, str]:
    out = {}
    with store.snapshot_view() as view:
        for db in dbs:
            h = hashlib.sha1()
            for ks, vs in view.raw_chunks(db):
                for k, v in zip(ks, vs):
                    h.update(len(k).to_bytes(4, "big") + k + len(v).to_bytes(4, "big") + v)
            out[db] = h.hexdigest()
    return out


# -- catalog -----------------------------------------------------------------------------------------------
def test_receipts_is_in_the_catalog_of_a_new_store_without_a_stored_row(store):
    assert store.topic_specs() == {"receipts": RECEIPTS}
    assert store.stats()["entries"][tables.TOPICS] == 0
    assert RECEIPTS.filter == "$SDV-FANOUT/receipts/+" and RECEIPTS.key_level == 2


def test_create_topic_upserts_but_keeps_partitions_and_creation_time(store):
    spec = TopicSpec.build("resp", "ecp/+/response", partitions=4, retention_ms=60_000)
    assert spec.key_level == 1
    store.apply(WriteBatch().create_topic(spec, T0))
    assert store.topic_specs()["resp"] == spec
    changed = TopicSpec.build("resp", "ecp/+/resp2", partitions=8, retention_bytes=1 << 20)
    store.apply(WriteBatch().create_topic(changed, T0 + 5))
    got = store.topic_specs()["resp"]
    assert got.partitions == 4 and got.filter == "ecp/+/resp2" and got.retention_bytes == 1 << 20
    assert got.retention_ms is None
    [row], _ = store.scan(tables.TOPICS)
    assert row["created_ms"] == T0 and list(row) == list(tables.ROW_FIELDS[tables.TOPICS])


def test_check_create_refuses_another_partition_count():
    old = TopicSpec.build("t", "a/+", partitions=0)
    topics.check_create(old, TopicSpec.build("t", "a/+", partitions=3), shards=3)  # 0 = 3 shards: same count
    with pytest.raises(ValueError, match="never changes"):
        topics.check_create(old, TopicSpec.build("t", "a/+", partitions=4), shards=3)
    topics.check_create(None, TopicSpec.build("t", "a/+", partitions=4), shards=3)


def test_receipts_retention_may_change_but_not_its_shape(store):
    with pytest.raises(ValueError, match="built-in"):
        TopicSpec.build("receipts", "x/+")
    mine = TopicSpec.build("receipts", RECEIPTS.filter, retention_ms=1000)
    store.apply(WriteBatch().create_topic(mine, T0))
    assert store.topic_specs()["receipts"] == mine


@pytest.mark.parametrize("kwargs, field", [
    ({"name": "bad name"}, "topic name"), ({"name": ""}, "topic name"), ({"filter": "a/#/b"}, "'#'"),
    ({"filter": "a/b+"}, "'\\+'"), ({"filter": "$share/g/a"}, "shared"), ({"partitions": -1}, "partitions"),
    ({"partitions": 5000}, "partitions"), ({"retention_ms": 0}, "retention_ms"),
    ({"retention_bytes": "1GiB"}, "retention_bytes"), ({"key_level": 3}, "key_level"),
])
def test_invalid_specs_are_refused_naming_the_field(kwargs, field):
    args = {"name": "t", "filter": "a/+", **kwargs}
    with pytest.raises(ValueError, match=field):
        TopicSpec.build(**args)
    with pytest.raises(ValueError, match=field):
        WriteBatch().create_topic(TopicSpec(**{"partitions": 0, **args}), T0)


# -- append, read, bounds ----------------------------------------------------------------------------------
def test_append_assigns_offsets_from_the_counter_and_reports_them(store):
    b = WriteBatch().topic_append("resp", 0, T0, [entry(0), entry(1)]).topic_append("resp", 1, T0, [entry(2)])
    b.topic_append("resp", 0, T0, [entry(3)])
    res = store.apply(b)
    assert res.topic_offsets == [("resp", 0, 0, 1), ("resp", 1, 0, 0), ("resp", 0, 2, 2)]
    assert res.counts["topic_appended"] == 4
    assert append(store, 2, start=4, ts=T0 + 1).topic_offsets == [("resp", 0, 3, 4)]
    got = store.topic_read("resp", 0, 0, 100)
    assert [e.offset for e in got] == [0, 1, 2, 3, 4]
    assert [e.payload for e in got] == [b"m0", b"m1", b"m3", b"m4", b"m5"]
    assert got[0] == LogEntry("resp", 0, 0, T0, "ecp/V1/response", "V1", 1, b"m0", None)
    assert store.topic_bounds("resp", 0) == (0, 5) and store.topic_bounds("resp", 1) == (0, 1)
    assert store.topic_bounds("resp", 2) == (0, 0) and store.topic_bounds("other", 0) == (0, 0)


def test_read_from_offset_limit_and_max_bytes(store):
    append(store, 10)
    assert [e.offset for e in store.topic_read("resp", 0, 4, 3)] == [4, 5, 6]
    assert [e.offset for e in store.topic_read("resp", 0, 8, 100)] == [8, 9]
    assert store.topic_read("resp", 0, 10, 100) == [] and store.topic_read("resp", 0, 0, 0) == []
    assert [e.offset for e in store.topic_read("resp", 0, 0, 100, max_bytes=5)] == [0, 1]  # 2 bytes each
    assert [e.offset for e in store.topic_read("resp", 0, 0, 100, max_bytes=1)] == [0]  # at least one
    assert store.topic_read("resp", 1, 0, 100) == []  # another partition of the same topic


def test_properties_are_kept_and_bad_entries_refused(store):
    props = [["user_property", ["k", "v"]], ["content_type", "text/plain"], ["correlation_data", b"\x01"],
             ["payload_format_indicator", 1], ["response_topic", "r/1"]]
    store.apply(WriteBatch().topic_append("resp", 0, T0, [entry(0, props=props)]))
    assert store.topic_read("resp", 0, 0, 1)[0].properties == props
    for bad, match in [((("a/b", "c", 3, b"", None),), "qos"), ((("", "c", 1, b"", None),), "mqtt_topic"),
                       ((("a", "c", 1, "text", None),), "payload"), ((("a", 5, 1, b"", None),), "client_id"),
                       ((("a", "c", 1, b""),), "entry 0"), ((("a", "c", 1, b"", [["session_expiry", 1]]),), "kept"),
                       ((("a", "c", 1, b"", [["user_property", ["k"]]]),), "pair")]:
        with pytest.raises(ValueError, match=match):
            WriteBatch().topic_append("resp", 0, T0, bad)
    with pytest.raises(ValueError, match="partition"):
        WriteBatch().topic_append("resp", -1, T0, [entry(0)])
    with pytest.raises(ValueError, match="topic name"):
        WriteBatch().topic_append("a\x00b", 0, T0, [entry(0)])
    assert not WriteBatch().topic_append("resp", 0, T0, [])  # nothing to append: no op


# -- groups ------------------------------------------------------------------------------------------------
def test_commit_never_moves_a_group_back_and_reset_does(store):
    assert store.topic_committed("resp", "g", 0) is None
    store.apply(WriteBatch().topic_commit("resp", "g", 0, 5, T0))
    res = store.apply(WriteBatch().topic_commit("resp", "g", 0, 3, T0 + 1))
    assert res.counts == {"topic_commit_behind": 1}
    assert store.topic_committed("resp", "g", 0) == 5
    store.apply(WriteBatch().topic_commit("resp", "g", 0, 7, T0 + 2).topic_commit("resp", "h", 1, 0, T0 + 3))
    assert store.topic_groups("resp") == {"g": {0: (7, T0 + 2)}, "h": {1: (0, T0 + 3)}}
    store.apply(WriteBatch().topic_reset("resp", "g", 0, 2, T0 + 4))
    assert store.topic_committed("resp", "g", 0) == 2
    assert store.topic_groups("resp2") == {} and store.topic_groups("res") == {}  # no prefix bleed
    for bad in ("", "a/b", "a+", "#", "x\x00"):
        with pytest.raises(ValueError, match="group"):
            WriteBatch().topic_commit("resp", bad, 0, 1, T0)


# -- pruning -----------------------------------------------------------------------------------------------
def test_prune_drops_old_entries_and_never_moves_the_counter_back(store):
    append(store, 10)
    append(store, 3, partition=1)
    res = store.apply(WriteBatch().topic_prune_if("resp", 0, 4))
    assert res.counts == {"topic_pruned": 4}
    assert store.topic_bounds("resp", 0) == (4, 10)
    assert [e.offset for e in store.topic_read("resp", 0, 0, 3)] == [4, 5, 6]  # skips the pruned
    assert store.topic_bounds("resp", 1) == (0, 3)  # the other partition untouched
    assert store.apply(WriteBatch().topic_prune_if("resp", 0, 2)).counts == {"topic_pruned": 0}
    store.apply(WriteBatch().topic_prune_if("resp", 0, 1_000))
    assert store.topic_bounds("resp", 0) == (10, 10) and store.topic_read("resp", 0, 0, 10) == []
    assert append(store, 1, start=10).topic_offsets == [("resp", 0, 10, 10)]  # offsets are never reused
    assert store.topic_bounds("resp", 0) == (10, 11)


def test_prune_of_the_last_partition_of_the_table_stops_at_its_end(store):
    append(store, 3, topic="zz", partition=7)
    store.apply(WriteBatch().topic_prune_if("zz", 7, 3))
    assert store.stats()["entries"][tables.TOPIC_LOG] == 0 and store.topic_bounds("zz", 7) == (3, 3)


# -- partitioning ------------------------------------------------------------------------------------------
def test_partition_by_the_vin_level_else_by_client_id():
    spec = TopicSpec.build("resp", "ecp/+/response")
    assert topics.partition_for(spec, "ecp/VIN1/response", "other", 4) == zlib.crc32(b"VIN1") % 4
    by_client = TopicSpec.build("all", "tele/#")
    assert by_client.key_level is None
    assert topics.partition_for(by_client, "tele/x", "cid", 4) == zlib.crc32(b"cid") % 4
    fixed = TopicSpec.build("f", "ecp/+/response", partitions=16)
    assert topics.partition_for(fixed, "ecp/VIN1/response", "c", 4) == zlib.crc32(b"VIN1") % 16
    short = TopicSpec.build("s", "a/+/#", key_level=1)
    assert topics.partition_for(short, "a", "cid", 4) == zlib.crc32(b"cid") % 4  # no such level: client id
    assert topics.shard_of_partition(13, 4) == 1
    with pytest.raises(ValueError):
        topics.partition_for(spec, "ecp/V/response", "c", 0)


def test_keys_round_trip_and_sort_by_partition_then_offset():
    assert topics.decode_log_key(topics.log_key("t", 3, 2**40)) == ("t", 3, 2**40)
    assert topics.decode_counter_key(topics.counter_key("t", 3)) == ("t", 3)
    assert topics.decode_offsets_key(topics.offsets_key("t", "grp", 9)) == ("t", "grp", 9)
    ordered = [("t", 0, 5), ("t", 0, 256), ("t", 1, 0), ("t2", 0, 0)]
    assert sorted(ordered, key=lambda k: topics.log_key(*k)) == ordered
    with pytest.raises(ValueError):
        topics.decode_log_key(b"t\x00\x00")


def test_scans_decode_every_topic_table(store):
    store.apply(WriteBatch().create_topic(TopicSpec.build("resp", "ecp/+/response"), T0)
                .topic_append("resp", 2, T0, [entry(0)]).topic_commit("resp", "g", 2, 0, T0 + 1))
    for db in TOPIC_TABLES:
        rows, _ = store.scan(db)
        assert rows and all(list(r) == list(tables.ROW_FIELDS[db]) for r in rows)
    assert store.scan(tables.TOPIC_LOG)[0][0]["payload"] == b"m0"
    assert store.scan(tables.TOPIC_COUNTERS)[0] == [{"topic": "resp", "partition": 2, "next_offset": 1}]


# -- replication, old stores, map growth ---------------------------------------------------------------------
def test_a_replica_fed_the_batch_bytes_holds_byte_identical_topic_tables(tmp_path):
    primary, replica_store = open_store(tmp_path / "p", 3), open_store(tmp_path / "r", 3)
    replica = ReplicaApplier(replica_store)
    batches = [
        WriteBatch().create_topic(TopicSpec.build("resp", "ecp/+/response"), T0).put_blob("d", b"B", T0)
        .enqueue_many(["V1", "V2", "V3"], T0, "r1", "d"),
        WriteBatch().topic_append("resp", 3, T0 + 1, [entry(i) for i in range(5)]).ack("V1", T0, "r1", T0 + 2),
        WriteBatch().topic_commit("resp", "g", 3, 2, T0 + 3).topic_prune_if("resp", 3, 2)
        .topic_append("resp", 3, T0 + 4, [entry(9)]).settle_pending("r1", "cancelled", T0 + 5),
    ]
    for seq, b in enumerate(batches, 1):
        primary.apply(b)
        assert replica.apply(1, seq, WriteBatch.from_bytes(b.to_bytes()).to_bytes()) == Ack(seq)
    assert digest(primary) == digest(replica_store)
    assert replica_store.topic_bounds("resp", 3) == (2, 6)
    assert [e.offset for e in replica_store.topic_read("receipts", 3, 0, 10)] == [0, 1, 2]
    primary.close()
    replica_store.close()


def test_an_old_store_gets_empty_topic_tables_at_open(tmp_path):
    path = tmp_path / "old"
    path.mkdir()
    env = lmdb.open(str(path), max_dbs=20)
    old = [db for db in tables.ALL_DBS if db not in TOPIC_TABLES]
    handles = {name: env.open_db(name.encode()) for name in old}
    with env.begin(write=True) as txn:
        txn.put(tables.SYS_SHARD_ID, tables.pack(0), db=handles[tables.SYS])
    env.close()
    with pytest.raises(StoreError, match="written before table 'topics' existed: open it once writable"):
        open_store(path, readonly=True)
    s = open_store(path)
    assert s.topic_specs() == {"receipts": RECEIPTS}
    assert append(s, 2).topic_offsets == [("resp", 0, 0, 1)]
    s.close()


def test_big_appends_grow_the_map_ahead_instead_of_failing_once(tmp_path):
    big = [("ecp/V1/response", "V1", 1, bytes(1024), None)] * 5_000
    b = WriteBatch().topic_append("resp", 0, T0, big)
    sized = open_store(tmp_path / "sized", map_size_bytes=64 << 20)
    used_before = sized.stats()["used_bytes"]
    sized.apply(b)
    assert b.space_estimate()[0] >= sized.stats()["used_bytes"] - used_before
    sized.close()
    tiny = open_store(tmp_path / "tiny", map_size_bytes=64 << 10)
    with capture_logs() as logs:
        tiny.apply(b)
    reasons = [e["reason"] for e in logs if e["event"] == "store_map_grown"]
    assert reasons and set(reasons) == {"grow_ahead"}
    assert tiny.topic_bounds("resp", 0) == (0, 5_000)
    tiny.close()


def test_outcome_ops_estimate_their_receipts(make_store):
    vins = [f"VIN{i:06d}" for i in range(20_000)]
    s = make_store(0, map_size_bytes=64 << 20)
    s.apply(WriteBatch().enqueue_many(vins, T0, "r", "d"))
    acks = WriteBatch()
    for v in vins:
        acks.ack(v, T0, "r", T0 + 1)
    used_before = s.stats()["used_bytes"]
    s.apply(acks)
    assert s.topic_bounds("receipts", 0) == (0, 20_000)
    assert acks.space_estimate()[0] >= s.stats()["used_bytes"] - used_before
    s.close()


def test_envelope_properties_from_an_mqtt5_properties_object(store):
    from fanout.mqtt.properties import Properties

    props = Properties(user_properties=(("a", "1"), ("a", "2")), content_type="text/plain", correlation_data=b"\x00",
                       payload_format_indicator=1, response_topic="r/1", message_expiry_interval=30)
    kept = topics.envelope_properties(props)
    assert kept == [["user_property", ["a", "1"]], ["user_property", ["a", "2"]], ["content_type", "text/plain"],
                    ["payload_format_indicator", 1], ["response_topic", "r/1"], ["correlation_data", b"\x00"]]
    store.apply(WriteBatch().topic_append("resp", 0, T0, [("a/b", "c", 1, b"", kept)]))
    assert store.topic_read("resp", 0, 0, 1)[0].properties == kept
    assert topics.envelope_properties(None) is None and topics.envelope_properties(Properties()) is None


def test_read_many_in_one_transaction_and_the_partitions_of_a_topic(store):
    append(store, 5)
    append(store, 3, partition=4)
    append(store, 2, topic="resp2")
    store.apply(WriteBatch().topic_prune_if("resp", 0, 2))
    got = store.topic_read_many([("resp", 0, 0, 2), ("resp", 4, 1, 10), ("resp", 9, 0, 10)])
    assert [[e.offset for e in part] for part in got] == [[2, 3], [1, 2], []]
    assert store.topic_partitions("resp") == {0: (2, 5), 4: (0, 3)}
    assert store.topic_partitions("resp2") == {0: (0, 2)} and store.topic_partitions("nope") == {}


# -- log pages (storage.topic_apply.put_log) ----------------------------------------------------------------
def _log_pages(store) -> dict:
    return store._read(lambda txn: txn.stat(store._dbs.topic_log))


def test_kilobyte_messages_fill_the_log_pages_of_the_last_partition(store):
    """~1 KiB entries: three to a 4 KiB leaf when appended (MDB_APPEND), two when every full leaf is split in
    the middle (the ordinary put, before put_log)."""
    body = bytes(range(256)) * 4
    for start in range(0, 600, 30):
        store.apply(WriteBatch().topic_append("resp", 0, T0, [("ecp/V1/response", "V1", 1, body + b"%d" % (start + i),
                                                               None) for i in range(30)]))
    stat = _log_pages(store)
    assert stat["entries"] == 600
    assert stat["leaf_pages"] <= 600 // 3 + 2, stat  # the ordinary put made 300
    got = store.topic_read("resp", 0, 0, 1000, max_bytes=1 << 30)
    assert [e.offset for e in got] == list(range(600)) and got[599].payload == body + b"599"


def test_appends_to_partitions_that_are_not_the_last_keep_every_entry_in_order(store):
    """Partitions written in turn: only the table's last range takes MDB_APPEND; the others the ordinary put."""
    for round_ in range(5):
        b = WriteBatch()
        for topic, partition in (("zz", 0), ("resp", 1), ("resp", 0), ("aa", 3)):
            b.topic_append(topic, partition, T0, [entry(round_ * 10 + i) for i in range(10)])
        store.apply(b)
    for topic, partition in (("zz", 0), ("resp", 1), ("resp", 0), ("aa", 3)):
        got = store.topic_read(topic, partition, 0, 100)
        assert [e.offset for e in got] == list(range(50))
        assert [e.payload for e in got] == [f"m{i}".encode() for i in range(50)]
    assert _log_pages(store)["entries"] == 200


def test_put_log_stores_entries_out_of_key_order_by_ordinary_puts(tmp_path):
    """MDB_APPEND skips a key that does not sort after the last one without an error: put_log must not lose it."""
    env = lmdb.open(str(tmp_path / "env"), max_dbs=1)
    db = env.open_db(b"log")
    try:
        with capture_logs() as logs, env.begin(write=True) as txn:
            put_log(txn.cursor(db), [(b"b", b"2"), (b"a", b"1"), (b"c", b"3")])
        with env.begin() as txn:
            assert list(txn.cursor(db)) == [(b"a", b"1"), (b"b", b"2"), (b"c", b"3")]
        assert [e["event"] for e in logs if e["log_level"] == "error"] == [
            "topic log entries not in key order: stored by ordinary puts"]
    finally:
        env.close()
