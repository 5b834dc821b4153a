"""The connection node's shard link over in-process DispatcherCores: what the Dispatcher actor does for
blobs and ingest (the same core calls, in the same order), minus Ray, replication and the event loop.
The Ray-free benchmark (:mod:`benchmarks.hotpath_bench`) and the node-core unit tests drive a NodeCore
with it.
"""
from __future__ import annotations

import time
from typing import Any

from fanout.dispatcher.core import DispatcherCore


class LocalShardLink:
    """:class:`fanout.node.ingest_rounds.ShardLink` over in-process cores.

    Args:
        cores: one DispatcherCore per shard, index = shard.
    """

    def __init__(self, cores: list[DispatcherCore]) -> None:
        self.cores = cores
        self.shards = len(cores)

    async def put_blobs(self, shard: int, items: list[tuple]) -> list[None]:
        core = self.cores[shard]
        core.applied(core.store.apply(core.blob_batch(items)).counts)
        core.blobs_stored(items)
        return [None] * len(items)

    async def has_data(self, shard: int, data_ids: list[str]) -> list[bool]:
        return self.cores[shard].has_data(data_ids)

    async def requests_in_use(self, shard: int, request_ids: list[str]) -> list[bool]:
        return self.cores[shard].requests_in_use(request_ids)

    async def trigger_conflicts(self, shard: int, items: list[tuple]) -> list[str | None]:
        return self.cores[shard].trigger_conflicts(items)

    async def ingest(self, shard: int, items: list[tuple]) -> list[Any]:
        core = self.cores[shard]
        job = core.ingest_job(items)
        for part in job.parts():
            if part.batch:
                core.applied(core.store.apply(part.batch).counts)
                for _ready, _give_way in core.dispatch_slices(part.vin_lists):
                    pass
        return job.results()

    async def request_control(self, shard: int, ops: list[tuple[str, str]]) -> list[Any]:
        core = self.cores[shard]
        out = []
        for verb, request_id in ops:
            if verb == "cancel":
                core.applied(core.store.apply(core.begin_cancel(request_id, time.time_ns() // 1_000_000)).counts)
                core.end_cancel(request_id)
            out.append(core.request_status(request_id))
        return out


__all__ = ["LocalShardLink"]
