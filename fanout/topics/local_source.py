"""The stores of a stopped cluster as a :class:`fanout.topics.consume.LogSource` (``fanout consume --data-dir``).

Strategy: the data dir lock (:mod:`storage.data_dir_lock`) is taken first, so nothing writes the shards meanwhile
and a running cluster makes this refuse at once (:class:`storage.data_dir_lock.DataDirBusy` names the holder).
Each ``shard-<k>`` store is opened as the dispatcher opens it and served by the same
:class:`fanout.topics.log_calls.TopicCatalog`; a commit (``--ack``) is one WriteBatch applied to the shard, as the
offline GC writes (the replicas catch up from the primary when the cluster starts again).
"""
from __future__ import annotations

import os
import time
from typing import Any

from fanout.topics.log_calls import TopicCatalog
from fanout.topics.records import by_shard, in_order
from fanout.topics.summary import merge_info


class LocalLogSource:
    """Every shard of ``data_dir``, locked and open (a context manager).

    Raises:
        FileNotFoundError: no shard directory there; DataDirBusy: a cluster (or offline GC) holds the data dir.
    """

    def __init__(self, data_dir: str | os.PathLike[str], holder: str = "fanout consume", *, sync: bool = True) -> None:
        from storage.data_dir_lock import DataDirLock
        from storage.jobs.cycle import open_shards

        self._lock = DataDirLock(data_dir, holder).acquire()
        try:
            self.stores = open_shards(data_dir, sync=sync)
            if not self.stores:
                raise FileNotFoundError(f"no shard-<k> store under {data_dir}")
            shards = len(self.stores)
            self.catalogs = [TopicCatalog(self.stores[k], k, shards) for k in range(shards)]
        except BaseException:
            self.close()
            raise

    def close(self) -> None:
        for store in getattr(self, "stores", {}).values():
            store.close()
        self.stores = {}
        self._lock.release()

    def __enter__(self) -> LocalLogSource:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def info(self, names: list[str] | None = None) -> dict[str, Any]:
        return merge_info(cat.info(names) for cat in self.catalogs)

    def read(self, requests: list[tuple]) -> list[tuple]:
        per = by_shard((r[1] for r in requests), len(self.catalogs))
        return in_order(per, (self.catalogs[s].read([requests[i] for i in idx]) for s, idx in per.items()),
                        len(requests))

    def commit(self, items: list[tuple]) -> int:
        now = time.time_ns() // 1_000_000
        for shard, idx in by_shard((i[2] for i in items), len(self.catalogs)).items():
            self.stores[shard].apply(self.catalogs[shard].commit_batch([items[i] for i in idx], now))
        return len(items)


__all__ = ["LocalLogSource"]
