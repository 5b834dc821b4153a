"""fanout.node.retained_writes: a write whose caller is cancelled (drain cancels the route loop mid-write) still
lands, and the next persist (drain's own) returns only after it: the changes it took are not lost when the actor
is killed right after drain. Real LMDB file; the write is held at its start by an event to make the interleaving
certain."""
from __future__ import annotations

import asyncio
import threading

from fanout.mqtt.retained import RetainedStore
from fanout.node.retained_writes import RetainedWrites
from storage.retained import RetainedFile, load_retained


class HeldFile(RetainedFile):
    """A RetainedFile whose writes wait for ``release`` (set by the test) once they have started."""

    def __init__(self, path) -> None:
        super().__init__(path)
        self.started, self.release = threading.Event(), threading.Event()

    def write(self, changes, now_ms=None):
        self.started.set()
        assert self.release.wait(10), "the test never released the write"
        return super().write(changes, now_ms)


def writes_to(file: RetainedFile) -> tuple[RetainedStore, RetainedWrites]:
    """A broker's retained store tracking its changes, and the writes of those changes to ``file``."""
    store = RetainedStore()
    store.track_changes()
    return store, RetainedWrites(store, file, "node-0")


def read_back(file: RetainedFile, data_dir) -> dict:
    file.close()  # LMDB opens an environment once per process: close before reading it back
    return load_retained(data_dir)


def test_drains_persist_waits_for_a_write_whose_caller_was_cancelled(tmp_path):
    async def main() -> dict:
        file = HeldFile(tmp_path / "retained" / "node-0.lmdb")
        store, writes = writes_to(file)
        store.set("fleet/config", b"v2", 1)
        route_tick = asyncio.get_running_loop().create_task(writes.persist())
        await asyncio.get_running_loop().run_in_executor(None, file.started.wait, 10)
        route_tick.cancel()  # drain cancels the route loop while its write runs
        await asyncio.gather(route_tick, return_exceptions=True)
        asyncio.get_running_loop().call_later(0.2, file.release.set)
        await writes.persist()  # drain's persist: must not return before the cancelled write landed
        return read_back(file, tmp_path)

    assert asyncio.run(main()) == {"fleet/config": (b"v2", 1)}


def test_a_failed_write_gives_its_changes_back_for_the_next(tmp_path):
    class FailingOnce(RetainedFile):
        failed = False

        def write(self, changes, now_ms=None):
            if not self.failed:
                self.failed = True
                raise OSError("disk hiccup")
            return super().write(changes, now_ms)

    async def main() -> dict:
        file = FailingOnce(tmp_path / "retained" / "node-0.lmdb")
        store, writes = writes_to(file)
        store.set("fleet/a", b"1", 0)
        await writes.persist()  # fails: the change is given back
        store.set("fleet/b", b"2", 1)
        await writes.persist()
        return read_back(file, tmp_path)

    assert asyncio.run(main()) == {"fleet/a": (b"1", 0), "fleet/b": (b"2", 1)}
