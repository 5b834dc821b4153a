"""Applying a GC plan (``storage.jobs.plan_apply``) to real LMDB stores; plans are written by hand, no Spark."""
from __future__ import annotations

import json

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from storage import ShardStore, WriteBatch, tables
from storage.jobs import plan_apply as A
from storage.jobs import plan as P

T0 = 1_700_000_000_000
OLD = T0 - 10_000


def write_plan(plan_dir, actions: dict[int, list[dict]], watermarks: dict[int, int], plan_id="p1"):
    """A plan as ``compute_plan`` writes it: actions Parquet per shard plus ``_plan.json``."""
    schema = pa.schema([("phase", pa.int32()), ("op", pa.string()), ("reason", pa.string()), ("vin", pa.string()),
                        ("ts_ms", pa.int64()), ("request_id", pa.string()), ("data_id", pa.string()),
                        ("new_data_id", pa.string()), ("status", pa.string())])
    counts = {}
    plan_dir.mkdir(parents=True, exist_ok=True)
    for shard, rows in actions.items():
        full = [{c: r.get(c) for c in P.ACTION_COLUMNS} | {"phase": P.PHASES.index(r["op"])} for r in rows]
        full.sort(key=lambda r: r["phase"])
        d = plan_dir / P.ACTIONS / f"shard={shard}"
        d.mkdir(parents=True)
        pq.write_table(pa.Table.from_pylist(full, schema=schema), d / "part-00000.parquet", row_group_size=3)
        counts[shard] = {}
        for r in full:
            key = f"{r['op']}/{r['reason']}"
            counts[shard][key] = counts[shard].get(key, 0) + 1
    info = P.PlanInfo(plan_id=plan_id, plan_dir=str(plan_dir), export_dir="", now_ms=T0, cutoff_ms=T0 - 5_000,
                      retention_ms=5_000, dedup_content=True,
                      watermarks={k: {"shard": k, "applied_seq": s} for k, s in watermarks.items()},
                      counts=counts, content_dup_groups={k: 0 for k in watermarks})
    (plan_dir / P.PLAN_FILE).write_text(json.dumps(info.as_dict()))
    return info


def ids(vin, ts, rid, did, reason="expired"):
    return {"op": P.OP_DELETE_IDS, "reason": reason, "vin": vin, "ts_ms": ts, "request_id": rid, "data_id": did}


def reqs(rid, vin, ts, status="pending"):
    return {"op": P.OP_DELETE_REQS, "reason": "expired", "vin": vin, "ts_ms": ts, "request_id": rid, "status": status}


def blob(did, ts, reason="expired"):
    return {"op": P.OP_DELETE_BLOB, "reason": reason, "data_id": did, "ts_ms": ts}


def repoint(vin, ts, rid, did, new):
    return {"op": P.OP_REPOINT_IDS, "reason": "content_duplicate", "vin": vin, "ts_ms": ts, "request_id": rid,
            "data_id": did, "new_data_id": new}


def dump(store: ShardStore) -> dict[str, list]:
    """Every user table of a store (for comparing end states)."""
    out = {}
    for db in (tables.DATA, tables.META, tables.IDS, tables.REQS):
        rows, cursor = [], None
        while True:
            step, cursor = store.scan(db, cursor, 1000)
            rows.extend(step)
            if cursor is None:
                break
        out[db] = rows
    return out


def build(store: ShardStore) -> None:
    """Old rows and blob (expired), a young row, a content twin."""
    store.apply(WriteBatch().put_blob("old", b"O", OLD).put_blob("young", b"Y", T0).put_blob("twin", b"Y", T0))
    store.apply(WriteBatch().enqueue_many([f"V{i}" for i in range(6)], OLD, "r-old", "old"))
    store.apply(WriteBatch().enqueue_many(["W1", "W2"], T0, "r-young", "twin"))
    assert store.get_meta("old")["ts_ms"] == OLD


def full_plan() -> list[dict]:
    vins = [f"V{i}" for i in range(6)]
    return ([ids(v, OLD, "r-old", "old") for v in vins] + [reqs("r-old", v, OLD) for v in vins]
            + [repoint(v, T0, "r-young", "twin", "young") for v in ("W1", "W2")]
            + [blob("old", OLD), blob("twin", T0, "content_duplicate")])


@pytest.fixture
def store(make_store):
    s = make_store(0)
    build(s)
    return s


def test_apply_deletes_and_repoints_in_phase_order(store, tmp_path):
    write_plan(tmp_path / "plan", {0: full_plan()}, {0: store.applied_seq})
    batches = list(A.plan_batches(tmp_path / "plan", 0, chunk_ops=5))
    assert [len(b) for b in batches] == [6, 6, 6, 2]  # 16 ops, 5 per batch + the progress marker
    codes = [op[0] for b in batches for op in b.ops if op[0] != 13]
    phase = {14: 0, 6: 1, 19: 1, 8: 2, 10: 3}  # repoint, ids (delete, settle: expired rows), reqs, blobs
    assert codes == sorted(codes, key=phase.__getitem__) and 19 in codes
    assert batches[-1].ops[-1] == (13, A.PROGRESS_METRIC, "p1:4", T0)

    info = A.apply_plan(store, tmp_path / "plan", chunk_ops=5)
    assert (info.batches, info.ops, info.deleted, info.repointed, info.skipped) == (4, 16, 14, 2, 0)
    assert store.pending_count() == 2 and store.next_rows("W1")[0].data_id == "young"
    assert store.get_blob("old") is None and store.get_blob("twin") is None and store.get_blob("young") == b"Y"
    assert store.request_rows("r-old") == [] and len(store.request_rows("r-young")) == 2
    assert A.resume_chunk(store, "p1") == 4 and A.resume_chunk(store, "other") == 0


def test_row_requeued_or_changed_after_the_snapshot_survives(store, tmp_path):
    write_plan(tmp_path / "plan", {0: full_plan()}, {0: store.applied_seq})
    # between export and apply: V0's old row re-queued with another blob (same key, new value), the
    # r-old request re-sent for V1 with a new blob (reqs row refreshed), V2 acked, the old blob
    # named by a fresh trigger (meta.ts refreshed), W1 acked (its repoint must not re-create it)
    store.apply(WriteBatch().enqueue("V0", OLD, "r-old", "young"))
    store.apply(WriteBatch().enqueue("V1", T0 + 1, "r-old", "young"))
    store.apply(WriteBatch().ack("V2", OLD, "r-old", T0))
    store.apply(WriteBatch().enqueue("X", T0 + 2, "r-new", "old"))
    store.apply(WriteBatch().ack("W1", T0, "r-young", T0 + 3))

    info = A.apply_plan(store, tmp_path / "plan")
    assert store.next_rows("V0")[0].data_id == "young"  # changed value: kept
    assert [r.ts_ms for r in store.next_rows("V1", 5)] == [T0 + 1]  # the re-queued row survives
    assert store.get_req("r-old", "V1")["ts_ms"] == T0 + 1  # refreshed reqs row: kept
    assert store.get_req("r-old", "V2")["status"] == "delivered"  # changed status: kept
    assert store.get_blob("old") == b"O" and store.next_rows("X")[0].data_id == "old"  # blob in use: kept
    assert store.next_rows("W1") == [] and store.next_rows("W2")[0].data_id == "young"
    assert info.skipped == 6 and info.deleted + info.repointed + info.skipped == 16


def test_second_apply_deletes_nothing_more(store, tmp_path):
    write_plan(tmp_path / "plan", {0: full_plan()}, {0: store.applied_seq})
    A.apply_plan(store, tmp_path / "plan", chunk_ops=4)
    after = dump(store)
    again = A.apply_plan(store, tmp_path / "plan", chunk_ops=4)  # resumes past the end
    assert (again.batches, again.deleted) == (0, 0) and again.resumed_at_chunk == 4
    forced = A.apply_plan(store, tmp_path / "plan", chunk_ops=4, resume=False)  # every guard now fails
    assert forced.deleted == forced.repointed == 0 and forced.skipped == 16
    assert dump(store) == after


def test_crash_mid_apply_then_rerun_gives_the_same_end_state(tmp_path):
    ref = ShardStore(tmp_path / "ref" / "shard-0", 0, sync=False)
    crashed = ShardStore(tmp_path / "crash" / "shard-0", 0, sync=False)
    try:
        for s in (ref, crashed):
            build(s)
        write_plan(tmp_path / "plan", {0: full_plan()}, {0: ref.applied_seq})
        A.apply_plan(ref, tmp_path / "plan", chunk_ops=3)

        def crash(shard, done, total):
            if done >= 9:
                raise KeyboardInterrupt("power cut")

        with pytest.raises(KeyboardInterrupt):
            A.apply_plan(crashed, tmp_path / "plan", chunk_ops=3, progress=crash)
        assert A.resume_chunk(crashed, "p1") == 3 and dump(crashed) != dump(ref)
        rerun = A.apply_plan(crashed, tmp_path / "plan", chunk_ops=3)
        assert rerun.resumed_at_chunk == 3 and rerun.ops == 7 and rerun.skipped == 0
        assert dump(crashed) == dump(ref)
        # the same without the progress marker: a full re-run only meets failing guards
        assert A.apply_plan(crashed, tmp_path / "plan", chunk_ops=3, resume=False).deleted == 0
        assert dump(crashed) == dump(ref)
    finally:
        ref.close()
        crashed.close()


def test_plan_is_refused_by_a_store_behind_the_watermark(store, tmp_path):
    write_plan(tmp_path / "plan", {0: full_plan()}, {0: store.applied_seq + 5})
    with pytest.raises(A.PlanRefusedError, match="below the plan's watermark"):
        A.apply_plan(store, tmp_path / "plan")
    assert store.pending_count() == 8


def test_shard_without_actions_and_bad_arguments(store, tmp_path):
    write_plan(tmp_path / "plan", {}, {0: store.applied_seq, 1: 0})
    assert list(A.plan_batches(tmp_path / "plan", 0)) == []
    info = A.apply_plan(store, tmp_path / "plan")
    assert info.batches == 0 and info.counts == {}
    write_plan(tmp_path / "p2", {}, {1: 0})
    assert A.apply_plan(store, tmp_path / "p2").batches == 0  # shard 0 is not in that plan
    with pytest.raises(ValueError):
        list(A.plan_batches(tmp_path / "plan", 0, chunk_ops=0))
    with pytest.raises(FileNotFoundError):
        list(A.plan_batches(tmp_path / "nowhere", 0))


def test_start_chunk_skips_committed_chunks(store, tmp_path):
    write_plan(tmp_path / "plan", {0: full_plan()}, {0: store.applied_seq})
    all_ops = [op for b in A.plan_batches(tmp_path / "plan", 0, chunk_ops=6) for op in b.ops]
    tail = [op for b in A.plan_batches(tmp_path / "plan", 0, chunk_ops=6, start_chunk=2) for op in b.ops]
    assert tail == all_ops[-len(tail):] and len(tail) == 4 + 1


def stranded(store: ShardStore) -> list[tuple[str, str]]:
    """``reqs`` rows still pending whose ``ids`` row is gone: rows the request would count pending forever."""
    out = []
    for row in dump(store)[tables.REQS]:
        if row["status"] == tables.STATUS_PENDING and not any(
                r.request_id == row["request_id"] for r in store.next_rows(row["vin"], 99)):
            out.append((row["request_id"], row["vin"]))
    return out


def test_every_gc_row_delete_moves_the_request_counters_in_its_own_batch(store, tmp_path):
    """Retention: the 6 old rows count expired from their ids delete on, then leave with their reqs rows (the
    reqs phase runs in later batches); a young row whose blob is gone counts discarded; a duplicate delete and
    the older row of a re-queued VIN leave the VIN's pending reqs row alone. After every committed batch the
    counters equal a recount of the rows and no pending reqs row has lost its queued row."""
    from .test_request_stats import counters, recount

    store.apply(WriteBatch().enqueue_many(["O1", "O2"], T0, "r-orph", "gone"))  # blob never stored
    store.apply(WriteBatch().enqueue("D", T0, "r-dup", "young"))
    store.apply(WriteBatch().enqueue("Q", OLD, "r-q", "old").enqueue("Q", T0, "r-q", "young"))  # re-queued
    # a duplicate row of D (same request and blob, later ts) as a store of an earlier release could hold
    store.apply(WriteBatch().enqueue("D", T0 + 1, "r-dup", "other").repoint_ids_if("D", T0 + 1, "r-dup", "other", "young"))
    plan = (full_plan() + [ids("O1", T0, "r-orph", "gone", "orphan"), ids("O2", T0, "r-orph", "gone", "orphan"),
                           ids("D", T0 + 1, "r-dup", "young", "duplicate"), ids("Q", OLD, "r-q", "old")])
    write_plan(tmp_path / "plan", {0: plan}, {0: store.applied_seq})
    seen = []

    def check(_shard, done, _total):
        assert counters(store) == recount(store) and stranded(store) == []
        seen.append(done)

    info = A.apply_plan(store, tmp_path / "plan", chunk_ops=4, progress=check)
    assert len(seen) == info.batches == 5 and info.skipped == 0
    c = {rid: counters(store).get(rid) for rid in ("r-old", "r-orph", "r-dup", "r-q")}
    assert c["r-old"] is None  # retention: the request's rows are gone, and its counters with them
    assert c["r-orph"]["discarded"] == 2 and c["r-orph"]["pending"] == 0
    assert store.get_req("r-orph", "O1")["delivered_ts_ms"] == T0  # settled at the plan's now
    assert c["r-dup"]["pending"] == 1 and [r.ts_ms for r in store.next_rows("D", 5)] == [T0]
    assert c["r-q"]["pending"] == 1 and [r.ts_ms for r in store.next_rows("Q", 5)] == [T0]
    assert (info.counts["discarded_rows"], info.counts["expired_rows"]) == (2, 6)


def test_a_row_expired_by_retention_counts_expired_until_its_reqs_row_goes(store, tmp_path):
    """Between the ids batch and the reqs batch (or after a crash between them) the request counts the rows
    expired, not pending; the reqs delete then takes the settled rows (seen pending, settled undelivered)."""
    write_plan(tmp_path / "plan", {0: [ids("V0", OLD, "r-old", "old"), reqs("r-old", "V0", OLD)]},
               {0: store.applied_seq})
    batches = list(A.plan_batches(tmp_path / "plan", 0, chunk_ops=1))
    store.apply(batches[0])
    c = store.request_counters("r-old")
    assert (c["pending"], c["expired"], c["vins"]) == (5, 1, 6) and store.get_req("r-old", "V0")["status"] == "expired"
    assert store.apply(batches[1]).counts["deleted"] == 1
    assert store.get_req("r-old", "V0") is None and store.request_counters("r-old")["vins"] == 5
    # an ack after the snapshot still keeps its row (the guard), as before
    store.apply(WriteBatch().ack("V1", OLD, "r-old", T0))
    assert store.apply(WriteBatch().delete_reqs_if("r-old", "V1", OLD, "pending")).counts == {"guard_skipped": 1}
