"""Which durable topics a publish goes to, and into which partition: the node's side of the append path.

Strategy: the durable topics' filters live in the broker's own subscription trie (:mod:`fanout.mqtt.trie`),
keyed by topic name. Before the walk, one C call rejects most publishes: when every filter ends in a literal
level, a matching topic ends with one of those levels (``str.endswith`` of a tuple), so a vehicle's
``ecp/<VIN>/heartbeat`` against ``ecp/+/response`` costs ~0.15 us instead of a ~3 us walk (measured here). The set of topics changes rarely (start-up, ``fanout topics create``): :meth:`DurableTopics.set_specs`
rebuilds the trie. The partition is :func:`storage.topics.partition_for` (the VIN level where the filter has
one, so a vehicle's messages stay in order in one partition).

The names a topic matched are remembered per topic (``mqtt.match_cache_entries`` topics, the bound of the
broker's match cache; past it the newest is evicted, as there): a publisher sends on the same few topics again
and again, and the walk was the largest single item of a durable publish on the node (``trie.match``, ~10 % of
the node's in-process cost per appended message). So are its targets when no partition of them depends on the client id (each
matched topic is keyed by a level of the published topic, the VIN of ``ecp/<VIN>/response``).
"""
from __future__ import annotations

from typing import Any, Iterable

from fanout.mqtt.trie import SubscriptionTrie
from fanout.topics.settings import RECEIPTS


MATCHED_MAX = 65_536  # topics whose matched names are remembered, unless told (``mqtt.match_cache_entries``)


class DurableTopics:
    """The durable topics a node appends to.

    Args:
        shards: the store shard count (``partitions = 0`` means one partition per shard).
        specs: initial :class:`storage.topics.TopicSpec` (the built-in ``receipts`` is skipped: the store
            appends to it).
        memo_entries: topics whose matched names (and, apart, targets) are remembered.
    """

    def __init__(self, shards: int, specs: Iterable[Any] = (), memo_entries: int = MATCHED_MAX) -> None:
        from storage.topics import partition_for, shard_of_partition

        self.shards = shards
        self._memo_entries = memo_entries
        self._partition_for = partition_for
        self._shard_of = shard_of_partition
        self._trie: SubscriptionTrie[str] = SubscriptionTrie()
        self._suffixes: tuple[str, ...] | None = None
        # topic -> the names its walk matched (empty: none), for the topics that passed the last-level check
        self._matched: dict[str, dict[str, int]] = {}
        # topic -> its targets, when every topic it goes to is partitioned by a level of it (not by client id)
        self._targets: dict[str, list[tuple[str, int, int]]] = {}
        self.specs: dict[str, Any] = {}
        self.set_specs(specs)

    def set_specs(self, specs: Iterable[Any]) -> bool:
        """Replace the topic set. Returns True when it changed."""
        new = {s.name: s for s in specs if s.name != RECEIPTS}
        if new == self.specs:
            return False
        trie: SubscriptionTrie[str] = SubscriptionTrie()
        for spec in new.values():
            trie.add(spec.filter, spec.name, 1)
        self._trie, self.specs = trie, new
        self._matched.clear()
        self._targets.clear()
        self._suffixes = _last_levels(spec.filter for spec in new.values())
        return True

    def __bool__(self) -> bool:
        return bool(self.specs)

    def matches(self, topic: str) -> bool:
        """Whether a publish on ``topic`` is appended somewhere (the broker asks it per publish)."""
        if not self.specs:
            return False
        suffixes = self._suffixes
        if suffixes is not None and not topic.endswith(suffixes):
            return False
        names = self._matched.get(topic)
        if names is None:
            names = self._walk(topic)
        return bool(names)

    def _walk(self, topic: str) -> dict[str, int]:
        names = self._trie.match(topic)
        _remember(self._matched, topic, names, self._memo_entries)
        return names

    def targets(self, topic: str, client_id: str) -> list[tuple[str, int, int]]:
        """``(topic name, partition, shard)`` of every durable topic ``topic`` goes to (do not modify the list:
        it may be the remembered one)."""
        known = self._targets.get(topic)
        if known is not None:
            return known
        out = []
        specs = self.specs
        names = self._matched.get(topic)
        by_topic = True  # every partition comes from a level of the topic, none from the client id
        levels = topic.count("/") + 1
        for name in (self._walk(topic) if names is None else names):
            spec = specs[name]
            if spec.key_level is None or spec.key_level >= levels:
                by_topic = False
            p = self._partition_for(spec, topic, client_id, self.shards)
            out.append((name, p, self._shard_of(p, self.shards)))
        if by_topic:
            _remember(self._targets, topic, out, self._memo_entries)
        return out


def _remember(memo: dict[str, Any], topic: str, value: Any, bound: int) -> None:
    """``memo[topic] = value``, at most ``bound`` topics: past it the newest is evicted. A fleet's response
    topics (one per vehicle) come round in turn; emptying a full memo made every one of them miss once the
    fleet outgrew it, evicting the newest keeps the resident part hitting (as the broker's match cache)."""
    if len(memo) >= bound:
        memo.popitem()
    memo[topic] = value


def _last_levels(filters: Any) -> tuple[str, ...] | None:
    """What a topic matching one of ``filters`` must end with (``/response`` for ``ecp/+/response``, the whole
    filter for a one-level one), or None when some filter ends in ``+`` or ``#`` (then any ending may match)."""
    out = []
    for f in filters:
        cut = f.rfind("/")
        last = f[cut + 1:]
        if last in ("+", "#"):
            return None
        out.append(f[cut:] if cut >= 0 else f)
    return tuple(out)


__all__ = ["DurableTopics"]
