"""Replication: replica apply rules, bounded log, snapshot + log replay, batch wire form."""
from __future__ import annotations

import msgpack
import pytest

from storage import BatchFormatError, FencedError, ShardStore, StoreError, WriteBatch, tables
from storage.replication_protocol import Ack, Need, ReplicaApplier, Rejected, ReplicationLog, ShardPrimary

T0 = 1_700_000_000_000


def open_store(path, shard_id=0):
    return ShardStore(path, shard_id, sync=False)


def tables_of(store: ShardStore) -> dict[str, list[dict]]:
    out = {}
    with store.snapshot_view() as view:
        for db in tables.USER_DBS:
            out[db] = list(view.rows(db, chunk_rows=50))
    return out


def sample_batch(i: int) -> WriteBatch:
    b = WriteBatch()
    b.put_blob(f"d{i % 3}", f"blob-{i % 3}".encode(), T0 + i)
    b.enqueue_many([f"V{j}" for j in range(i % 5, i % 5 + 4)], T0 + i, f"req{i % 4}", f"d{i % 3}")
    if i % 2:
        b.ack(f"V{i % 5}", T0 + i - 1, f"req{(i - 1) % 4}", T0 + i)
    b.put_metric("batches", i, T0 + i).put_retained(f"r/{i % 2}", bytes([i % 256]), 1, T0 + i)
    if i % 7 == 0:
        b.delete_retained("r/1").delete_blob_if("d1", T0 + i - 3)
    return b


@pytest.fixture
def replica(tmp_path):
    store = open_store(tmp_path / "replica")
    applier = ReplicaApplier(store)
    yield applier
    applier.store.close()


def payload(vin: str = "V1") -> bytes:
    return WriteBatch().enqueue(vin, T0, "req", "d").to_bytes()


def test_in_order_batch_is_applied_and_acked(replica):
    assert replica.apply(1, 1, payload("V1")) == Ack(1)
    assert replica.apply(1, 2, payload("V2")) == Ack(2)
    assert replica.store.applied_seq == 2 and replica.store.pending_count() == 2


def test_duplicate_is_reacked_without_applying(replica):
    replica.apply(1, 1, payload("V1"))
    replica.apply(1, 2, payload("V2"))
    before = tables_of(replica.store)
    assert replica.apply(1, 1, payload("OTHER")) == Ack(2)
    assert replica.apply(1, 2, payload("OTHER")) == Ack(2)
    assert tables_of(replica.store) == before and replica.store.applied_seq == 2


def test_gap_asks_for_the_next_seq(replica):
    replica.apply(1, 1, payload())
    assert replica.apply(1, 5, payload("V5")) == Need(2)
    assert replica.store.applied_seq == 1 and replica.store.pending_count("V5") == 0


def test_lower_epoch_is_rejected(replica):
    replica.apply(3, 1, payload())
    assert replica.apply(2, 2, payload("V2")) == Rejected(3)
    assert replica.apply(2, 1, payload("V2")) == Rejected(3)
    assert replica.store.applied_seq == 1


def test_higher_epoch_is_adopted_and_persisted(tmp_path):
    applier = ReplicaApplier(open_store(tmp_path / "r"))
    assert applier.apply(1, 1, payload()) == Ack(1)
    assert applier.apply(4, 1, payload()) == Ack(1)  # re-ack still adopts the epoch
    assert applier.epoch == 4
    assert applier.apply(6, 9, payload()) == Need(2)  # so does a gap
    assert applier.epoch == 6
    assert applier.apply(7, 2, payload("V2")) == Ack(2)  # and an apply, in the same transaction
    applier.store.close()
    with open_store(tmp_path / "r") as reopened:
        assert reopened.epoch == 7 and reopened.applied_seq == 2
        assert ReplicaApplier(reopened).apply(6, 3, payload()) == Rejected(7)


def test_applier_resyncs_when_the_store_was_written_behind_its_back(replica):
    replica.apply(1, 1, payload())
    replica.store.apply(WriteBatch(), seq=2)
    assert replica.apply(1, 2, payload("V2")) == Ack(2)
    assert replica.store.pending_count("V2") == 0
    assert replica.apply(1, 3, payload("V3")) == Ack(3)


def test_bad_batch_bytes_apply_nothing(replica):
    with pytest.raises(BatchFormatError):
        replica.apply(1, 1, b"\xc1 not msgpack")
    assert replica.apply(1, 1, payload()) == Ack(1)


def test_log_bounds_and_since():
    log = ReplicationLog(base_seq=10, max_entries=3, max_bytes=1_000)
    assert log.since(11) == [] and log.since(10) is None
    for seq in range(11, 16):
        log.append(seq, bytes(10))
    assert (log.base_seq, log.last_seq, len(log)) == (12, 15, 3)
    assert [s for s, _ in log.since(13)] == [13, 14, 15]
    assert log.since(12) is None and log.since(16) == []
    with pytest.raises(ValueError):
        log.since(17)
    with pytest.raises(ValueError):
        log.append(17, b"")
    log.append(16, bytes(995))  # bytes bound: only the newest entry fits
    assert (log.base_seq, len(log), log.size_bytes) == (15, 1, 995)
    log.append(17, bytes(5_000))  # the newest entry is kept even when alone over the bound
    assert [s for s, _ in log.since(17)] == [17] and log.since(16) is None


def test_since_returns_every_entry_from_the_seq_on_in_order_across_trims():
    log = ReplicationLog(max_entries=50)
    for seq in range(1, 131):  # trimmed 80 times: the deque's left end moved
        log.append(seq, seq.to_bytes(2, "big"))
    assert log.base_seq == 80
    for start in range(81, 132):
        got = log.since(start)
        assert [s for s, _ in got] == list(range(start, 131))
        assert all(int.from_bytes(data, "big") == s for s, data in got)


def test_primary_ships_what_replicas_apply(tmp_path):
    primary = ShardPrimary(open_store(tmp_path / "p"), epoch=1)
    replica = ReplicaApplier(open_store(tmp_path / "r"))
    for i in range(1, 12):
        ship = primary.write(sample_batch(i))
        assert ship.seq == i and replica.apply(ship.epoch, ship.seq, ship.batch_bytes) == Ack(i)
    assert tables_of(primary.store) == tables_of(replica.store)
    primary.store.close()
    replica.store.close()


def test_snapshot_then_log_replay_rebuilds_a_replica(tmp_path):
    primary = ShardPrimary(open_store(tmp_path / "p"), epoch=2, log=ReplicationLog(0, max_entries=5))
    for i in range(1, 21):
        primary.write(sample_batch(i))
    replica = ReplicaApplier(open_store(tmp_path / "r"))
    # a fresh replica sees seq 21 first, asks for 1, which the log no longer has
    ship = primary.write(sample_batch(21))
    reply = replica.apply(ship.epoch, ship.seq, ship.batch_bytes)
    assert reply == Need(1) and primary.catch_up(reply.seq) is None
    info = primary.snapshot(tmp_path / "snap")
    assert info.applied_seq == 21 and info.epoch == 2
    for i in range(22, 25):  # the primary keeps writing meanwhile
        primary.write(sample_batch(i))
    assert replica.install_snapshot(info.path) == Ack(21)
    entries = primary.catch_up(22)
    assert [s for s, _ in entries] == [22, 23, 24]
    assert replica.apply_many(primary.epoch, entries) == Ack(24)
    assert replica.store.applied_seq == primary.store.applied_seq == 24
    primary_tables, replica_tables = tables_of(primary.store), tables_of(replica.store)
    for db in tables.USER_DBS:
        assert replica_tables[db] == primary_tables[db], db
    assert primary_tables["ids"] and primary_tables["reqs"] and primary_tables["data"]
    primary.store.close()
    replica.store.close()


def test_install_snapshot_keeps_the_higher_epoch_and_survives_a_bad_snapshot(tmp_path):
    primary = ShardPrimary(open_store(tmp_path / "p"), epoch=1)
    primary.write(sample_batch(1))
    info = primary.snapshot(tmp_path / "snap")
    replica = ReplicaApplier(open_store(tmp_path / "r"))
    replica.apply(5, 1, payload())
    replica.install_snapshot(info.path)
    assert replica.epoch == 5 and replica.store.epoch == 5 and replica.applied_seq == 1
    with pytest.raises(StoreError):
        replica.install_snapshot(tmp_path / "missing")
    assert replica.store.applied_seq == 1  # reopened, still usable
    other = ShardPrimary(open_store(tmp_path / "p7", shard_id=7), epoch=1)
    other.write(WriteBatch())
    with pytest.raises(StoreError, match="shard 7"):
        replica.install_snapshot(other.snapshot(tmp_path / "snap7").path)
    for s in (primary.store, replica.store, other.store):
        s.close()


def test_deposed_primary_is_fenced(tmp_path):
    store = open_store(tmp_path / "p")
    old = ShardPrimary(store, epoch=1)
    replica = ReplicaApplier(open_store(tmp_path / "r"))
    replica.apply(2, 1, payload())  # a newer primary reached the replica first
    ship = old.write(WriteBatch().enqueue("V9", T0, "r", "d"))
    reply = replica.apply(ship.epoch, ship.seq, ship.batch_bytes)
    assert reply == Rejected(2)
    with pytest.raises(FencedError):
        old.check_reply(reply)
    old.check_reply(Ack(1))
    ShardPrimary(store, epoch=3)
    with pytest.raises(FencedError):
        old.write(WriteBatch())  # the store now knows epoch 3
    with pytest.raises(FencedError):
        ShardPrimary(store, epoch=2)
    store.close()
    replica.store.close()


def test_write_batch_bytes_round_trip(tmp_path):
    b = WriteBatch()
    b.put_blob("d", b"\x00\xffblob", T0).touch_meta("d", T0 + 1)
    b.enqueue_many(["V2", "V1"], T0, "r", "d").enqueue("V3", T0, "r", "d").enqueue("V4", T0 + 1, "r", "d")
    b.ack("V1", T0, "r", T0 + 2).delete_ids("V2", T0, "r").delete_ids_if("V3", T0, "r", "d")
    b.delete_reqs("r", "V2").delete_reqs_if("r", "V3", T0, "pending").delete_blob("x").delete_blob_if("d", 1)
    b.put_retained("t/x", b"\x01", 2, T0).delete_retained("t/y").put_metric("m", 1.25, T0).put_metric("s", "up", T0)
    again = WriteBatch.from_bytes(b.to_bytes())
    assert again.ops == [list(op) for op in b.ops]
    assert again.counts() == b.counts() and len(again) == len(b) == 17
    assert again.to_bytes() == b.to_bytes()
    with open_store(tmp_path / "a") as one, open_store(tmp_path / "b") as two:
        assert one.apply(b).counts == two.apply(again).counts
        assert tables_of(one) == tables_of(two)


def test_from_bytes_rejects_bad_envelopes():
    for raw in (b"", b"\xc1", msgpack.packb([99, []]), msgpack.packb({"ops": []}), msgpack.packb([1, "x"])):
        with pytest.raises(BatchFormatError):
            WriteBatch.from_bytes(raw)


def test_snapshot_taken_during_writes_matches_its_seq(tmp_path):
    import threading

    store = open_store(tmp_path / "p")
    stop = threading.Event()

    def writer():
        i = 0
        while not stop.is_set():
            i += 1
            store.apply(WriteBatch().enqueue(f"S{i:06d}", T0, "r", "d"))

    thread = threading.Thread(target=writer)
    thread.start()
    try:
        infos = []
        for k in range(5):
            infos.append(store.copy_to(tmp_path / f"snap{k}"))
    finally:
        stop.set()
        thread.join()
    for k, info in enumerate(infos):
        with ShardStore.restore_from(info.path, tmp_path / f"copy{k}", 0, sync=False) as copy:
            assert copy.applied_seq == info.applied_seq == copy.pending_count()
    assert infos[-1].applied_seq >= infos[0].applied_seq
    store.close()
