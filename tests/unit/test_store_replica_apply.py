"""StoreReplica.apply_many, the actor's class run in this process (no Ray; direct channels off): a small batch
is applied on the event loop when the writer thread is idle, a large one on the writer thread, and a small
batch arriving while the writer thread still has a job waits behind it, so batches keep their seq order."""
from __future__ import annotations

import asyncio
import threading

import pytest

from actors.store_replica import INLINE_APPLY_BYTES, StoreReplica
from fanout import log as fanout_log
from fanout.config import load_config
from storage import WriteBatch
from storage.replication_protocol import Ack

EPOCH = 1


def _entry(seq: int, size: int) -> tuple[int, bytes]:
    return seq, WriteBatch().put_blob(f"d{seq}", b"x" * size, 1_000 + seq).to_bytes()


@pytest.fixture
def replica_class(monkeypatch):
    # the constructor's ensure_configured() would cache this test process's loggers for the whole session
    monkeypatch.setattr(fanout_log, "_configured", True)
    return StoreReplica.__ray_metadata__.modified_class


def test_small_batches_on_the_loop_large_on_the_writer_and_seq_order_kept(replica_class, tmp_path):
    cfg = load_config(None, env={}).replace("cluster", direct_channels=False)

    async def main() -> list[tuple[int, str]]:
        replica = replica_class(cfg, 0, "r0", str(tmp_path / "replica"))
        applier = replica._live()
        threads: list[tuple[int, str]] = []
        real = applier.apply_many

        def recording(epoch, entries):
            threads.append((entries[0][0], threading.current_thread().name))
            return real(epoch, entries)

        applier.apply_many = recording
        gate = threading.Event()
        try:
            assert await replica.apply_many(EPOCH, [_entry(1, 100)]) == Ack(1)
            assert await replica.apply_many(EPOCH, [_entry(2, INLINE_APPLY_BYTES + 1)]) == Ack(2)
            busy = asyncio.ensure_future(replica._run(gate.wait, 10))  # the writer thread has a job
            await asyncio.sleep(0.01)
            small = asyncio.ensure_future(replica.apply_many(EPOCH, [_entry(3, 100)]))
            await asyncio.sleep(0.05)
            assert not small.done(), "a small batch did not wait for the writer thread's job"
            gate.set()
            await busy
            assert await small == Ack(3)
            assert applier.applied_seq == 3 and applier.store.get_blob("d3") is not None
        finally:
            gate.set()  # a failed assertion must not leave close() behind a 10 s job
            await replica.close()
        return threads

    threads = asyncio.run(main())
    assert threads == [(1, "MainThread"), (2, "replica-0-writer"), (3, "replica-0-writer")]
