"""The Controller's durable-topic desk: create topics on every shard, push the topic list to the connection nodes,
route consumers' reads and commits to the shards holding the partitions, and report offsets and lag.

Strategy: partition ``p`` of every topic lives in shard ``p % shards`` (:func:`storage.topics.shard_of_partition`),
so a consumer's batched request is split per shard (one call per shard, concurrently) and the answers put back
in request order. A topic is created by every primary through its single writer (replicated); the nodes then get
the new list (:meth:`TopicDesk.push`) and start appending matching publishes. The nodes also get the list when
they are placed (config topics are in their config; topics created at run time come with :meth:`push`).
"""
from __future__ import annotations

import asyncio
from typing import Any, Callable

import structlog

from fanout.topics.records import ReadRequest, by_shard, in_order
from fanout.topics.summary import merge_info, summarize

log = structlog.get_logger(__name__)

CALL_TIMEOUT_S = 30.0


class TopicDesk:
    """Durable topics across the shards.

    Args:
        config: the loaded config (``topics``, ``builtin_topics``).
        dispatchers: returns the current primary handle of each shard (it changes on failover).
        nodes: returns the live connection node handles ``{node_id: handle}``.
    """

    def __init__(self, config: Any, dispatchers: Callable[[], list[Any]], nodes: Callable[[], dict[str, Any]]) -> None:
        self._config = config
        self._dispatchers = dispatchers
        self._nodes = nodes
        self.specs: dict[str, Any] = {}

    def _all(self) -> list[Any]:
        found = self._dispatchers()
        if not found:
            raise RuntimeError("the fanout cluster is not started")
        return found

    async def _each(self, method: str, *args: Any) -> list[Any]:
        return await asyncio.gather(*(asyncio.wait_for(getattr(d, method).remote(*args), CALL_TIMEOUT_S)
                                      for d in self._all()))

    async def start(self) -> dict[str, Any]:
        """At ``fanout up``: create the config's topics (and the built-in ones' retention) on every shard
        (idempotent), then push the list to the nodes. Returns the specs by name."""
        from storage.topics import RECEIPTS

        wanted = list(self._config.topics)
        for name, (ms, size) in self._config.builtin_topics.items():
            if name == RECEIPTS.name:
                wanted.append(RECEIPTS.__class__(RECEIPTS.name, RECEIPTS.filter, RECEIPTS.partitions, ms, size,
                                                 RECEIPTS.key_level))
        for spec in wanted:
            await self._each("create_topic", spec)
        await self.refresh()
        await self.push()
        if wanted:
            log.info("durable topics created", topics=[s.name for s in wanted])
        return self.specs

    async def refresh(self) -> dict[str, Any]:
        """Re-read the catalog (shard 0's; every shard has the same)."""
        specs = await asyncio.wait_for(self._all()[0].topic_specs.remote(), CALL_TIMEOUT_S)
        self.specs = {s.name: s for s in specs}
        return self.specs

    async def push(self, nodes: dict[str, Any] | None = None) -> None:
        """Give the connection nodes (all live ones, or ``nodes``) the topic list."""
        specs = list(self.specs.values())
        targets = self._nodes() if nodes is None else nodes
        results = await asyncio.gather(*(asyncio.wait_for(h.set_topics.remote(specs), CALL_TIMEOUT_S)
                                         for h in targets.values()), return_exceptions=True)
        for node, r in zip(targets, results):
            if isinstance(r, BaseException):
                log.warning("topic list not pushed to node", node=node, error=str(r)[:200])

    async def create(self, spec: Any) -> dict[str, Any]:
        """Create ``spec`` on every shard, then push the list to the nodes; returns :meth:`show` of it.

        Raises:
            ValueError: invalid, or another partition count than the existing topic's.
        """
        await self._each("create_topic", spec)
        await self.refresh()
        await self.push()
        log.info("durable topic created", topic=spec.name, filter=spec.filter, partitions=spec.partitions)
        return await self.show(spec.name)

    async def info(self, names: list[str] | None = None) -> dict[str, Any]:
        """Every shard's ``topic_info`` merged: ``{topic: {spec, partitions: {p: [low, next]}, groups: {g: {p:
        [offset, updated_ms]}}}}``."""
        return merge_info(await self._each("topic_info", names))

    async def show(self, name: str) -> dict[str, Any] | None:
        """One topic: spec, partitions (low, next), groups with committed offset and lag per partition."""
        got = (await self.info([name])).get(name)
        return None if got is None else summarize(name, got)

    async def list(self) -> list[dict[str, Any]]:
        """Every topic, summarized as :meth:`show`."""
        return [summarize(name, t) for name, t in sorted((await self.info()).items())]

    async def read(self, requests: list[tuple]) -> list[tuple]:
        """:class:`fanout.topics.records.ReadRequest` tuples -> one ``ReadResult`` each, in order."""
        ds = self._all()
        per = by_shard((ReadRequest(*r).partition for r in requests), len(ds))
        answers = await asyncio.gather(*(asyncio.wait_for(ds[s].topic_read.remote([requests[i] for i in idx]),
                                                          CALL_TIMEOUT_S) for s, idx in per.items()))
        return in_order(per, answers, len(requests))

    async def commit(self, items: list[tuple]) -> int:
        """:class:`fanout.topics.records.CommitItem` tuples, one WriteBatch per shard involved."""
        ds = self._all()
        per = by_shard((i[2] for i in items), len(ds))
        done = await asyncio.gather(*(asyncio.wait_for(ds[s].topic_commit.remote([items[i] for i in idx]),
                                                       CALL_TIMEOUT_S) for s, idx in per.items()))
        return sum(done)

    async def sys_values(self) -> dict[str, Any]:
        """``$SYS/fanout/topics/<topic>/high`` (messages appended so far, the sum of the next offsets) and per group
        ``.../groups/<group>/committed`` (messages acknowledged) and ``.../groups/<group>/lag``."""
        out: dict[str, Any] = {}
        for t in await self.list():
            base = f"$SYS/fanout/topics/{t['name']}"
            out[f"{base}/high"] = t["high"]
            out[f"{base}/retained"] = t["retained"]
            for g in t["groups"]:
                out[f"{base}/groups/{g['group']}/committed"] = g["committed"]
                out[f"{base}/groups/{g['group']}/lag"] = g["lag"]
        return out


__all__ = ["TopicDesk"]
