"""The dispatcher's durable-topic calls, Ray-free: the WriteBatches of appends, commits and topic creation, and
the batched reads consumers make (``fanout consume``, the MQTT consumer groups).

Strategy: the dispatcher actor stays a shell (:mod:`actors.dispatcher` calls these with its store and writes the
returned batch through its single writer, replicated before it answers). Every call carries a batch:

- :func:`append_batch`: the items of one node's ``topic_append`` call, grouped per (topic, partition) in arrival
  order, into ONE WriteBatch (one op per partition: offsets are assigned at apply, consecutive per partition);
- :func:`read`: one answer per :class:`fanout.topics.records.ReadRequest`, its entries as one packed page
  (:func:`fanout.topics.records.page_entries` decodes it), capped by count and by :data:`MAX_READ_BYTES` of
  stored entries per call (a consumer pages on: bounded memory on both sides);
- :func:`commit_batch`: every commit of the call in ONE WriteBatch (a commit never moves a group back);
- :func:`topic_info`: per topic its partitions held here with their bounds and each group's committed offset.

Items are checked against the shard's catalog (:class:`TopicCatalog`): a topic it does not know, or a partition
another shard holds, fails the whole call with ValueError (nothing of it is written), which the node turns into
refused publishes.
"""
from __future__ import annotations

from typing import Any, Iterable

import structlog

from fanout.topics.records import EMPTY_PAGE, ReadRequest, ReadResult

log = structlog.get_logger(__name__)

MAX_READ_BYTES = 8 << 20  # stored bytes one topic_read call returns at most (at least one entry per request)
MAX_READ_LIMIT = 10_000  # entries one request returns at most

class TopicCatalog:
    """The topics a shard knows (its store's ``topics`` table), cached: it changes only through this shard's
    own ``create_topic`` (:meth:`refresh` after it) or a restart.

    Args:
        reader: the shard's store (``topic_specs``, ``topic_read``, ``topic_bounds``, ... of ShardReader).
        shard: this shard's index.
        shards: the store shard count.
    """

    def __init__(self, reader: Any, shard: int, shards: int) -> None:
        from storage import topics

        self._topics = topics
        self.reader = reader
        self.shard = shard
        self.shards = shards
        self.specs: dict[str, Any] = {}
        self.refresh()

    def refresh(self) -> dict[str, Any]:
        self.specs = dict(self.reader.topic_specs())
        return self.specs

    def partitions_here(self, name: str) -> list[int]:
        """The partitions of ``name`` this shard holds."""
        n = self._topics.partition_count(self.specs[name], self.shards)
        return [p for p in range(n) if self._topics.shard_of_partition(p, self.shards) == self.shard]

    def check(self, topic: str, partition: int) -> None:
        """Raises ValueError unless ``topic`` exists and ``partition`` is one of its partitions held here."""
        spec = self.specs.get(topic)
        if spec is None:
            spec = self.refresh().get(topic)
            if spec is None:
                raise ValueError(f"unknown durable topic {topic!r}")
        n = self._topics.partition_count(spec, self.shards)
        if not (type(partition) is int and 0 <= partition < n):
            raise ValueError(f"topic {topic!r} has partitions 0-{n - 1}, not {partition!r}")
        if self._topics.shard_of_partition(partition, self.shards) != self.shard:
            raise ValueError(f"partition {partition} of {topic!r} is on shard "
                             f"{self._topics.shard_of_partition(partition, self.shards)}, not {self.shard}")

    # -- writes -----------------------------------------------------------------------------------------

    def create_batch(self, spec: Any, now_ms: int) -> Any:
        """The WriteBatch creating (or updating the retention of) ``spec``.

        Raises:
            ValueError: an invalid spec, or another partition count than the existing topic's.
        """
        from storage import WriteBatch

        self._topics.check_create(self.specs.get(spec.name), spec, self.shards)
        return WriteBatch().create_topic(spec, now_ms)

    def append_batch(self, items: Iterable[tuple], now_ms: int) -> Any:
        """ONE WriteBatch of :class:`fanout.topics.records.AppendItem` tuples; raises ValueError for an item this
        shard cannot take (nothing is written)."""
        from storage import WriteBatch

        groups: dict[tuple[str, int], list[tuple]] = {}
        for topic, partition, mqtt_topic, client_id, qos, payload, properties in items:
            entries = groups.get((topic, partition))
            if entries is None:
                self.check(topic, partition)
                entries = groups[(topic, partition)] = []
            entries.append((mqtt_topic, client_id, qos, payload, properties))
        batch = WriteBatch()
        for (topic, partition), entries in groups.items():
            batch.topic_append(topic, partition, now_ms, entries)
        return batch

    def commit_batch(self, items: Iterable[tuple], now_ms: int) -> Any:
        """ONE WriteBatch of :class:`fanout.topics.records.CommitItem` tuples (checked like appends)."""
        from storage import WriteBatch

        batch = WriteBatch()
        for topic, group, partition, offset in items:
            self.check(topic, partition)
            batch.topic_commit(topic, group, partition, offset, now_ms)
        return batch

    # -- reads ------------------------------------------------------------------------------------------

    def read(self, requests: Iterable[tuple]) -> list[tuple]:
        """One :class:`ReadResult` tuple per :class:`ReadRequest` (its entries as one packed page).

        Raises:
            ValueError: a request for a topic or partition this shard does not hold.
        """
        reader = self.reader
        out: list[tuple] = []
        budget = MAX_READ_BYTES
        for topic, partition, from_offset, limit in (ReadRequest(*r) for r in requests):
            self.check(topic, partition)
            low, nxt = reader.topic_bounds(topic, partition)
            page = EMPTY_PAGE
            if budget > 0 and from_offset < nxt:
                page, _n = reader.topic_read_packed(topic, partition, max(from_offset, low),
                                                    max(1, min(limit, MAX_READ_LIMIT)), max_bytes=budget)
                budget -= len(page)
            out.append(tuple(ReadResult(page, low, nxt)))
        return out

    def info(self, names: Iterable[str] | None = None) -> dict[str, Any]:
        """``{topic: {"spec": {...}, "partitions": {p: [low, next]}, "groups": {group: {p: [offset, updated_ms]}}}}``
        for the partitions held here (every topic, or those of ``names``)."""
        reader = self.reader
        out: dict[str, Any] = {}
        for name in (sorted(self.specs) if names is None else names):
            spec = self.specs.get(name)
            if spec is None:
                continue
            parts = {p: list(reader.topic_bounds(name, p)) for p in self.partitions_here(name)}
            groups = {g: {p: list(v) for p, v in ps.items() if p in parts}
                      for g, ps in reader.topic_groups(name).items()}
            out[name] = {"spec": {"filter": spec.filter, "partitions": spec.partitions,
                                  "retention_ms": spec.retention_ms, "retention_bytes": spec.retention_bytes,
                                  "key_level": spec.key_level},
                         "partitions": parts, "groups": {g: ps for g, ps in groups.items() if ps}}
        return out

def commit_items(items: Iterable[tuple]) -> list[tuple]:
    """:class:`CommitItem` wire tuples, checked for shape (a consumer's input)."""
    return [CommitItem.build(*i) for i in items]

__all__ = ["TopicCatalog", "MAX_READ_BYTES", "MAX_READ_LIMIT"]
