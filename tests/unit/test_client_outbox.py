"""Outbox: durable LMDB queue, retry state, dead letters, prune, replay, lock (real LMDB in tmp_path)."""
from __future__ import annotations

import multiprocessing
import os
from pathlib import Path

import lmdb
import pytest

from fanout.client.backoff import RetryPolicy
from fanout.client.errors import OutboxLocked
from fanout.client.outbox import Failure, Outbox, OutboxBatch
from fanout.client.submission import Submission, make_submission

DAY_MS = 86_400_000


def sub(seq: int, n: int = 3, payload: bytes = b"blob", ts: int = 1000) -> Submission:
    return make_submission(seq, [f"VIN{seq:05d}{i:08d}" for i in range(n)], payload, f"req-{seq}", None, ts + seq)


def seqs(items: list[Submission]) -> list[int]:
    return [s.seq for s in items]


@pytest.fixture
def outbox(tmp_path: Path) -> Outbox:
    ob = Outbox(tmp_path / "ob", policy=RetryPolicy(max_attempts=3, base_s=1.0))
    yield ob
    ob.close()


def test_env_is_fsynced(outbox: Outbox) -> None:
    flags = outbox._env.flags()
    assert flags["sync"] and flags["metasync"]


def test_append_load_in_seq_order_and_survives_reopen(tmp_path: Path) -> None:
    ob = Outbox(tmp_path / "ob")
    assert ob.next_seq == 1 and ob.depth == 0 and ob.oldest_ts_ms is None
    ob.apply(OutboxBatch(appends=[sub(3), sub(1), sub(2, n=2500, payload=os.urandom(5000))]))
    assert ob.depth == 3
    ob.close()
    ob = Outbox(tmp_path / "ob")
    assert ob.depth == 3 and ob.next_seq == 4 and ob.oldest_ts_ms == 1001
    loaded = ob.load_ready(now=0, exclude=(), limit=10)
    assert seqs(loaded) == [1, 2, 3]
    big = loaded[1]
    assert len(big.vins) == 2500 and big.durable and big.request_id == "req-2" and big.vins == sub(2, n=2500).vins
    ob.close()


def test_load_ready_excludes_and_limits(outbox: Outbox) -> None:
    outbox.apply(OutboxBatch(appends=[sub(i) for i in range(1, 8)]))
    assert seqs(outbox.load_ready(0, {1, 3}, 3)) == [2, 4, 5]


def test_remove_after_ack(outbox: Outbox) -> None:
    outbox.apply(OutboxBatch(appends=[sub(1), sub(2)]))
    outbox.apply(OutboxBatch(removes=[1, 99]))
    assert outbox.depth == 1 and outbox.oldest_ts_ms == 1002
    outbox.apply(OutboxBatch(removes=[2]))
    assert outbox.depth == 0 and outbox.oldest_ts_ms is None


def test_failure_sets_backoff_and_skips_until_due(outbox: Outbox) -> None:
    outbox.apply(OutboxBatch(appends=[sub(1), sub(2)]))
    res = outbox.apply(OutboxBatch(failures=[Failure(1, "boom")]), now=10_000)
    assert res.retry == {1: 11_000} and not res.dead
    assert outbox.retry[1] == (1, 11_000, "boom")
    assert seqs(outbox.load_ready(10_500, (), 10)) == [2]  # a waiting item never blocks later ones
    due = outbox.load_ready(11_000, (), 10)
    assert seqs(due) == [1, 2] and due[0].attempts == 1 and due[0].last_error == "boom"
    assert outbox.next_retry_ms() == 11_000
    res = outbox.apply(OutboxBatch(failures=[Failure(1, "boom again")]), now=20_000)
    assert res.retry == {1: 22_000}  # 2 s after the second failure


def test_dead_letter_after_max_attempts_with_last_error(outbox: Outbox) -> None:
    outbox.apply(OutboxBatch(appends=[sub(1), sub(2)]))
    for i, now in enumerate((0, 10_000)):
        assert 1 in outbox.apply(OutboxBatch(failures=[Failure(1, f"err{i}")]), now=now).retry
    res = outbox.apply(OutboxBatch(failures=[Failure(1, "final straw")]), now=50_000)
    assert res.dead == {1: (3, "final straw")}
    assert outbox.depth == 1 and outbox.dead_count == 1 and 1 not in outbox.retry
    [dl] = outbox.dead_letters()
    assert (dl.seq, dl.request_id, dl.attempts, dl.last_error, dl.dead_at_ms, dl.vins) == (1, "req-1", 3, "final straw", 50_000, 3)
    assert seqs(outbox.load_ready(10**12, (), 10)) == [2]


def test_final_failure_dead_letters_at_once_and_failure_of_unknown_is_ignored(outbox: Outbox) -> None:
    s = sub(5)
    res = outbox.apply(OutboxBatch(appends=[s], failures=[Failure(5, "rejected: ids[17]", final=True), Failure(77, "gone")]))
    assert res.dead == {5: (1, "rejected: ids[17]")} and outbox.depth == 0 and outbox.dead_count == 1


def test_append_with_failure_in_same_batch_charges_a_hot_item(outbox: Outbox) -> None:
    res = outbox.apply(OutboxBatch(appends=[sub(4)], failures=[Failure(4, "publish refused")]), now=0)
    assert res.retry == {4: 1000} and outbox.depth == 1


def test_replay_resets_attempts_and_keeps_seq(outbox: Outbox, tmp_path: Path) -> None:
    outbox.apply(OutboxBatch(appends=[sub(1), sub(2), sub(3)]))
    outbox.apply(OutboxBatch(failures=[Failure(1, "x", final=True), Failure(3, "y", final=True)]))
    assert outbox.dead_count == 2
    assert outbox.replay_dead_letters([3]) == [3]
    assert outbox.dead_count == 1 and outbox.depth == 2
    assert outbox.replay_dead_letters() == [1]
    loaded = outbox.load_ready(0, (), 10)
    assert seqs(loaded) == [1, 2, 3] and all(s.attempts == 0 for s in loaded)


def test_next_seq_counts_dead_letters(tmp_path: Path) -> None:
    ob = Outbox(tmp_path / "ob")
    ob.apply(OutboxBatch(appends=[sub(1), sub(9)], failures=[Failure(9, "x", final=True)]))
    ob.close()
    ob = Outbox(tmp_path / "ob")
    assert ob.next_seq == 10 and ob.dead_count == 1
    ob.close()


def test_prune_dead_letters_after_retention(tmp_path: Path) -> None:
    ob = Outbox(tmp_path / "ob", dead_letter_retain_days=30)
    ob.apply(OutboxBatch(appends=[sub(1), sub(2)], failures=[Failure(1, "a", final=True)]), now=0)
    ob.apply(OutboxBatch(failures=[Failure(2, "b", final=True)]), now=20 * DAY_MS)
    assert ob.prune_dead_letters(now=30 * DAY_MS - 1) == 0
    assert ob.prune_dead_letters(now=30 * DAY_MS + 1) == 1
    assert [d.seq for d in ob.dead_letters()] == [2] and ob.dead_count == 1
    ob.close()


def test_retry_state_survives_reopen(tmp_path: Path) -> None:
    ob = Outbox(tmp_path / "ob")
    ob.apply(OutboxBatch(appends=[sub(1)], failures=[Failure(1, "boom")]), now=0)
    ob.close()
    ob = Outbox(tmp_path / "ob")
    assert ob.retry == {1: (1, 1000, "boom")} and ob.status().retrying == 1
    ob.close()


def test_map_grows_on_demand(tmp_path: Path) -> None:
    ob = Outbox(tmp_path / "ob", map_size=1 << 16)
    ob.apply(OutboxBatch(appends=[sub(i, payload=os.urandom(50_000)) for i in range(1, 11)]))
    assert ob.depth == 10 and ob._env.info()["map_size"] > 1 << 16
    ob.close()


def _try_lock(path: str, q: multiprocessing.Queue) -> None:
    try:
        Outbox(path).close()
        q.put("opened")
    except OutboxLocked as exc:
        q.put(str(exc))
    reader = Outbox(path, exclusive=False)  # read-only tools (fanout outbox status) take no lock
    q.put(reader.depth)
    reader.close()


def test_one_client_per_outbox_and_lock_released_on_close(tmp_path: Path) -> None:
    ob = Outbox(tmp_path / "ob")
    ctx = multiprocessing.get_context("spawn")
    q = ctx.Queue()
    p = ctx.Process(target=_try_lock, args=(str(tmp_path / "ob"), q))
    ob.apply(OutboxBatch(appends=[]))
    p.start()
    p.join(60)
    assert f"in use by process {os.getpid()}" in q.get(timeout=5)
    assert q.get(timeout=5) == 0
    ob.close()
    Outbox(tmp_path / "ob").close()


def test_write_error_applies_nothing(outbox: Outbox, monkeypatch: pytest.MonkeyPatch) -> None:
    outbox.apply(OutboxBatch(appends=[sub(1)]))

    def broken(self: Submission) -> bytes:
        raise lmdb.DiskError("disk gone")

    monkeypatch.setattr(Submission, "pack", broken)
    with pytest.raises(lmdb.Error):
        outbox.apply(OutboxBatch(appends=[sub(2)], removes=[1]))
    assert outbox.depth == 1 and seqs(outbox.load_ready(0, (), 5)) == [1]


def test_map_grows_while_readers_scan_without_errors_or_lost_entries(tmp_path: Path) -> None:
    """Issue 12: ``set_mapsize`` while another thread had a read transaction open failed those reads
    (``mdb_txn_begin: Invalid argument``, "closed/deleted/dropped object": 7,482 errors in 0.8 s of
    growth here). Readers run as the client runs them (``load_ready`` and ``dead_letters`` on another
    thread than the writes) while 40 appends of 100 KB grow a 64 KiB map six times over."""
    import threading

    ob = Outbox(tmp_path / "ob", map_size=1 << 16)
    committed = 0  # appends committed so far; a scan must see at least those committed before it began
    errors: list[str] = []
    short: list[tuple[int, int]] = []
    scans = [0]
    stop = threading.Event()

    def reader() -> None:
        while not stop.is_set():
            floor = committed
            try:
                seen = len(ob.load_ready(0, (), 10_000))
                ob.dead_letters()
            except Exception as exc:  # noqa: BLE001 - the test counts them
                errors.append(repr(exc))
                continue
            scans[0] += 1
            if seen < floor:
                short.append((floor, seen))

    threads = [threading.Thread(target=reader) for _ in range(2)]
    for t in threads:
        t.start()
    try:
        for i in range(1, 41):
            ob.apply(OutboxBatch(appends=[sub(i, payload=os.urandom(100_000))]))
            committed = i
    finally:
        stop.set()
        for t in threads:
            t.join(30)
    assert ob._env.info()["map_size"] >= 1 << 22 and scans[0] > 0
    assert errors == [] and short == []
    assert seqs(ob.load_ready(0, (), 1000)) == list(range(1, 41)) and ob.depth == 40
    ob.close()
