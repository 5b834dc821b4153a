"""Storage additions the GC jobs rely on: ``repoint_ids_if`` and ``SnapshotView.raw_chunks``."""
from __future__ import annotations

import pytest

from storage import WriteBatch, keys, tables

T0 = 1_700_000_000_000


def test_repoint_ids_if_is_guarded_and_replicates(store):
    store.apply(WriteBatch().put_blob("a", b"x", T0).put_blob("b", b"x", T0).enqueue_many(["V1", "V2"], T0, "r", "a"))
    batch = (
        WriteBatch()
        .repoint_ids_if("V1", T0, "r", "a", "b")  # applies
        .repoint_ids_if("V2", T0, "r", "zz", "b")  # changed since plan: kept
        .repoint_ids_if("V3", T0, "r", "a", "b")  # gone (acked): never re-created
    )
    result = store.apply(WriteBatch.from_bytes(batch.to_bytes()))
    assert result.counts == {"repointed": 1, "guard_skipped": 2}
    assert store.next_rows("V1")[0].data_id == "b"
    assert store.next_rows("V2")[0].data_id == "a"
    assert store.next_rows("V3") == []
    assert store.get_req("r", "V1")["data_id"] == "a"  # the idempotency key stays the platform's data id
    with pytest.raises(ValueError):
        WriteBatch().repoint_ids_if("V1", T0, "r", "a", "")


@pytest.mark.parametrize("chunk", [1, 7, 25, 100])
def test_raw_chunks_cover_the_table_once_in_key_order(store, chunk):
    vins = [f"V{i:02d}" for i in range(25)]
    store.apply(WriteBatch().enqueue_many(vins, T0, "r", "d"))
    with store.snapshot_view() as view:
        chunks = list(view.raw_chunks("ids", chunk))
    assert all(0 < len(k) <= chunk and len(k) == len(v) for k, v in chunks)
    flat = [k for ks, _ in chunks for k in ks]
    assert flat == sorted(keys.ids_key(v, T0, "r") for v in vins)
    assert {tables.unpack(v) for _, vs in chunks for v in vs} == {"d"}


def test_raw_chunks_of_empty_table(store):
    with store.snapshot_view() as view:
        assert list(view.raw_chunks("ids", 10)) == []
        with pytest.raises(ValueError):
            list(view.raw_chunks("nope", 10))


def test_enqueue_refreshes_the_blob_meta_ts_so_a_stale_gc_delete_is_skipped(store):
    store.apply(WriteBatch().put_blob("d", b"x", T0))
    store.apply(WriteBatch().enqueue_many(["V1"], T0 + 50, "r", "d"))
    assert store.get_meta("d")["ts_ms"] == T0 + 50
    store.apply(WriteBatch().enqueue_many(["V2"], T0 + 10, "r2", "d"))  # older trigger: never moves back
    assert store.get_meta("d")["ts_ms"] == T0 + 50
    # a GC plan made before the trigger saw ts T0: its guarded delete no longer matches
    assert store.apply(WriteBatch().delete_blob_if("d", T0)).counts == {"guard_skipped": 1}
    assert store.get_blob("d") == b"x"
    store.apply(WriteBatch().enqueue_many(["V3"], T0, "r3", "missing"))  # no meta: nothing to refresh
    assert store.get_meta("missing") is None
