"""Fixtures shared by the unit tests: shard stores on real LMDB files in the test's ``tmp_path``."""
from __future__ import annotations

from typing import Any, Callable, Iterator

import pytest

from storage import ShardStore, shard_dir


@pytest.fixture
def make_store(tmp_path) -> Iterator[Callable[..., ShardStore]]:
    """``make_store(shard_id=0, **options)``: a :class:`ShardStore` at ``shard_dir(tmp_path, shard_id)`` without
    fsync (a unit test checks what is stored, not its durability), closed when the test ends."""
    opened: list[ShardStore] = []

    def make(shard_id: int = 0, **options: Any) -> ShardStore:
        store = ShardStore(shard_dir(tmp_path, shard_id), shard_id, sync=False, **options)
        opened.append(store)
        return store

    yield make
    for store in opened:
        store.close()


@pytest.fixture
def store(make_store) -> ShardStore:
    """Shard 0, empty (a test module with other needs defines its own ``store`` from ``make_store``)."""
    return make_store(0)
