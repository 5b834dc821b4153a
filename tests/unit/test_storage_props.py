"""The ``reqprops``/``blobprops`` tables: the MQTT 5 properties a fanout delivery carries are written by the
replicated write path, survive a reopen, reach a replica through the shipped batch bytes, follow the blob's latest
publish, go with the request's counters and the blob, and an old store opens with the tables empty."""
from __future__ import annotations

import pytest

from storage import ShardStore, WriteBatch, shard_dir, tables
from storage.keys import ids_key
from storage.replication_protocol import table_digests

from .test_request_stats import PRE_COUNTER_ROWS, write_pre_counter_store

T0 = 1_700_000_000_000
USERS = (("trace", "t-1"), ("campaign", "c9"), ("trace", "t-2"))


def ingest(request_id: str = "r1", users=USERS, content_type: str | None = "application/json") -> WriteBatch:
    return (WriteBatch().put_blob("d1", b"BLOB", T0, content_type).set_request_props(request_id, users)
            .enqueue_many(["V1", "V2"], T0, request_id, "d1"))


def test_properties_survive_a_reopen_and_reach_a_replica(tmp_path):
    primary_dir, replica_dir = shard_dir(tmp_path / "p", 0), shard_dir(tmp_path / "r", 0)
    with ShardStore(primary_dir, 0, sync=False) as primary, ShardStore(replica_dir, 0, sync=False) as replica:
        batch = ingest()
        result = primary.apply(batch)
        replica.apply(WriteBatch.from_bytes(batch.to_bytes()), seq=result.seq)  # what replication ships
        assert table_digests(replica) == table_digests(primary)
    for path in (primary_dir, replica_dir):
        with ShardStore(path, 0, sync=False) as s:
            assert s.get_user_properties("r1") == USERS  # in order, a repeated name kept
            assert s.user_properties_all() == {"r1": USERS}
            assert s.get_content_type("d1") == "application/json"
            assert s.get_user_properties("other") == () and s.get_content_type("other") is None
            assert s.scan(tables.REQPROPS)[0] == [{"request_id": "r1", "user_properties": USERS}]
            assert s.scan(tables.BLOBPROPS)[0] == [{"data_id": "d1", "content_type": "application/json"}]


def test_a_blob_has_the_content_type_of_its_latest_publish_and_loses_it_with_the_blob(tmp_path):
    with ShardStore(shard_dir(tmp_path, 0), 0, sync=False) as s:
        s.apply(WriteBatch().put_blob("d1", b"BLOB", T0, "text/plain"))
        s.apply(WriteBatch().put_blob("d1", b"BLOB", T0 + 1))  # the same bytes again, without a content type
        assert s.get_content_type("d1") is None
        s.apply(WriteBatch().put_blob("d1", b"NEW", T0 + 2, "image/png"))
        assert s.get_content_type("d1") == "image/png"
        s.apply(WriteBatch().delete_blob_if("d1", T0 + 2))
        assert s.get_meta("d1") is None and s.get_content_type("d1") is None
        s.apply(WriteBatch().put_blob("d2", b"X", T0, "a/b"))
        s.apply(WriteBatch().delete_blob("d2"))
        assert s.get_content_type("d2") is None and s.stats()["entries"][tables.BLOBPROPS] == 0


def test_a_later_trigger_with_properties_replaces_them_and_one_without_keeps_them(tmp_path):
    with ShardStore(shard_dir(tmp_path, 0), 0, sync=False) as s:
        s.apply(ingest())
        s.apply(WriteBatch().set_request_props("r1", ()).enqueue_many(["V3"], T0 + 5, "r1", "d1"))  # no op at all
        assert s.get_user_properties("r1") == USERS
        s.apply(WriteBatch().set_request_props("r1", [("trace", "t-9")]))
        assert s.get_user_properties("r1") == (("trace", "t-9"),)


def test_the_properties_go_with_the_requests_counters_and_a_cancelled_request_gets_none(tmp_path):
    with ShardStore(shard_dir(tmp_path, 0), 0, sync=False) as s:
        s.apply(ingest())
        s.apply(WriteBatch().ack_rows([ids_key("V1", T0, "r1"), ids_key("V2", T0, "r1")], T0 + 10))
        assert s.get_user_properties("r1") == USERS  # delivered rows keep the counters row, and the properties
        s.apply(WriteBatch().delete_reqs("r1", "V1").delete_reqs("r1", "V2"))  # GC removed every row
        assert s.request_counters("r1") is None and s.get_user_properties("r1") == ()
        s.apply(WriteBatch().settle_pending("r2", "cancelled", T0))
        s.apply(ingest("r2"))  # a cancel is final: neither rows nor properties
        assert s.get_user_properties("r2") == () and s.pending_count() == 0


def test_a_store_written_before_the_property_tables_opens_with_them_empty(tmp_path):
    path = shard_dir(tmp_path, 0)
    write_pre_counter_store(path, PRE_COUNTER_ROWS, seq=7)
    with ShardStore(path, 0, sync=False) as s:
        assert s.user_properties_all() == {} and s.get_content_type("d") is None
        assert s.applied_seq == 7
        s.apply(ingest())
        assert s.get_user_properties("r1") == USERS


def test_set_request_props_checks_its_arguments():
    with pytest.raises(ValueError):
        WriteBatch().set_request_props("r1", [("k", 1)])
    with pytest.raises(ValueError):
        WriteBatch().put_blob("d1", b"x", T0, content_type=b"text/plain")
    assert WriteBatch().set_request_props("r1", []).ops == []
