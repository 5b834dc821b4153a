"""Subscription index: which subscribers match a topic, at which QoS.

Strategy:

- Filters without wildcards (the common case here: a vehicle subscribes to its own topics) live in a
  plain dict ``filter -> {key: qos}``; a topic with no wildcard subscriber in the way costs one dict
  lookup and one small dict copy.
- Filters whose one wildcard is their last level after literal ones (``P/+``, ``P/#``: a vehicle's
  ``agent/<VIN>/#`` or ``agent/<VIN>/proxy/request/+``) live in two dicts keyed by ``P``. In the trie each
  such filter made a chain of nodes of its own below the VIN level (four nodes and their dicts for
  ``agent/<VIN>/proxy/request/+``, ~8 us per SUBSCRIBE, and memory per connected vehicle); here it is one
  dict entry. A topic finds its ``P/+`` subscribers by one look-up (the topic up to its last ``/``) and its
  ``P/#`` subscribers by one per distinct level count of the ``P``s present (usually one).
- Other filters with ``+``/``#`` live in a trie of levels. ``+`` is an ordinary child named ``+``; a filter
  ending in ``#`` is stored on the node of its parent level (``multi``), which makes "``a/#`` matches
  ``a``" (MQTT-4.7.1-2) fall out of the walk: every node the walk reaches contributes its ``multi``.
  At the first level, ``+`` children and the root's ``multi`` are skipped for topics starting with
  ``$`` (MQTT-4.7.2-1).
- A subscriber matching through several filters gets the maximum QoS of them, once (MQTT-3.3.5-1
  allows one delivery at the highest QoS for overlapping subscriptions).
- A reverse index ``key -> {filter: qos}`` serves ``remove_all`` (disconnect of a clean session) and
  ``filters_of``. Nodes left empty by a removal are pruned, so memory follows the live set.
"""
from __future__ import annotations

from typing import Any, Generic, Hashable, Iterator, TypeVar

from .topics import validate_topic_filter
from .unused_dict import UNUSED

K = TypeVar("K", bound=Hashable)


# What an unused dict of a node holds until its first write (see :mod:`unused_dict`). It lives in a module of
# its own because a compiled module (make native) cannot define a subclass of dict.
_NONE: Any = UNUSED


class _Node:
    __slots__ = ("children", "subs", "multi")

    def __init__(self) -> None:
        self.children: dict[str, _Node] = _NONE
        self.subs: dict = _NONE   # subscribers whose filter ends at this level
        self.multi: dict = _NONE  # subscribers of "<this level>/#" ("#" itself at the root)

    def empty(self) -> bool:
        return not (self.children or self.subs or self.multi)


def _tail_of(topic_filter: str) -> tuple[str, bool] | None:
    """``(P, is "#")`` of a valid filter ``P/+`` or ``P/#`` whose levels before the last are literal (P not
    empty); None for any other filter (those go to the trie)."""
    if len(topic_filter) < 3 or topic_filter[-2] != "/":
        return None
    last = topic_filter[-1]
    if last != "+" and last != "#":
        return None
    prefix = topic_filter[:-2]
    if "+" in prefix or "#" in prefix:
        return None
    return prefix, last == "#"


def _merge_max(result: dict, subs: dict) -> None:
    if not result:
        result.update(subs)
        return
    for key, qos in subs.items():
        old = result.get(key)
        if old is None or qos > old:
            result[key] = qos


class SubscriptionTrie(Generic[K]):
    """Topic filter index over hashable subscriber keys (client ids, node ids, ...)."""

    __slots__ = ("_exact", "_plus", "_multi", "_multi_depths", "_root", "_wild", "_by_key", "_count")

    def __init__(self) -> None:
        self._exact: dict[str, dict[K, int]] = {}
        self._plus: dict[str, dict[K, int]] = {}  # "P/+" -> P -> subscribers (see the module docstring)
        self._multi: dict[str, dict[K, int]] = {}  # "P/#" -> P -> subscribers
        self._multi_depths: dict[int, int] = {}  # levels of a P of _multi -> how many such P
        self._root = _Node()
        self._wild: dict[str, int] = {}  # wildcard filter in the trie -> number of subscribers
        self._by_key: dict[K, dict[str, int]] = {}
        self._count = 0

    def __len__(self) -> int:
        """Number of (key, filter) subscriptions."""
        return self._count

    def add(self, topic_filter: str, key: K, qos: int, *, validated: bool = False) -> bool:
        """Subscribe ``key`` to ``topic_filter`` (replacing the QoS of an existing subscription).

        Args:
            topic_filter: a valid topic filter.
            key: subscriber key.
            qos: granted QoS, 0..2.
            validated: the caller has just validated the filter (the SUBSCRIBE path): not again.

        Returns:
            True if the subscription is new for that key, False if only its QoS was replaced
            (MQTT-3.8.4-3: a repeated filter replaces the existing subscription).

        Raises:
            InvalidTopic: the filter is invalid (see :func:`validate_topic_filter`).
            ValueError: QoS out of 0..2.
        """
        if qos not in (0, 1, 2):
            raise ValueError(f"QoS must be 0, 1 or 2, got {qos!r}")
        mine = self._by_key.get(key)
        if mine is not None and topic_filter in mine:
            is_new = False
        else:
            if not validated:
                validate_topic_filter(topic_filter)
            is_new = True
        wild = "+" in topic_filter or "#" in topic_filter
        tail = _tail_of(topic_filter) if wild else None
        if tail is not None:
            prefix, multi = tail
            index = self._multi if multi else self._plus
            subs = index.get(prefix)
            if subs is None:
                subs = index[prefix] = {}
                if multi:
                    depth = prefix.count("/") + 1
                    self._multi_depths[depth] = self._multi_depths.get(depth, 0) + 1
            subs[key] = qos
        elif wild:
            node = self._root
            levels = topic_filter.split("/")
            last = len(levels) - 1
            for i, level in enumerate(levels):
                if i == last and level == "#":
                    if node.multi is _NONE:
                        node.multi = {}
                    node.multi[key] = qos
                    break
                children = node.children
                child = children.get(level)
                if child is None:
                    if children is _NONE:
                        children = node.children = {}
                    child = children[level] = _Node()
                node = child
            else:
                if node.subs is _NONE:
                    node.subs = {}
                node.subs[key] = qos
            if is_new:
                self._wild[topic_filter] = self._wild.get(topic_filter, 0) + 1
        else:
            subs = self._exact.get(topic_filter)
            if subs is None:
                subs = self._exact[topic_filter] = {}
            subs[key] = qos
        if mine is None:
            mine = self._by_key[key] = {}
        mine[topic_filter] = qos
        if is_new:
            self._count += 1
        return is_new

    def remove(self, topic_filter: str, key: K) -> bool:
        """Unsubscribe ``key`` from ``topic_filter``.

        Args:
            topic_filter: the filter as subscribed (no normalisation, MQTT-4.7.3-4).
            key: subscriber key.

        Returns:
            True if the subscription existed.
        """
        mine = self._by_key.get(key)
        if mine is None or topic_filter not in mine:
            return False
        del mine[topic_filter]
        if not mine:
            del self._by_key[key]
        self._count -= 1
        if "+" in topic_filter or "#" in topic_filter:
            tail = _tail_of(topic_filter)
            if tail is None:
                self._remove_wild(topic_filter, key)
            else:
                self._remove_tail(*tail, key)
        else:
            subs = self._exact[topic_filter]
            del subs[key]
            if not subs:
                del self._exact[topic_filter]
        return True

    def _remove_tail(self, prefix: str, multi: bool, key: K) -> None:
        index = self._multi if multi else self._plus
        subs = index[prefix]
        del subs[key]
        if not subs:
            del index[prefix]
            if multi:
                depth = prefix.count("/") + 1
                left = self._multi_depths[depth] - 1
                if left:
                    self._multi_depths[depth] = left
                else:
                    del self._multi_depths[depth]

    def _remove_wild(self, topic_filter: str, key: K) -> None:
        levels = topic_filter.split("/")
        hash_end = levels[-1] == "#"
        if hash_end:
            levels.pop()
        path = [self._root]
        node = self._root
        for level in levels:
            node = node.children[level]
            path.append(node)
        del (node.multi if hash_end else node.subs)[key]
        # Prune upward: drop each node left with no subscribers and no children.
        for depth in range(len(levels), 0, -1):
            if not path[depth].empty():
                break
            del path[depth - 1].children[levels[depth - 1]]
        left = self._wild[topic_filter] - 1
        if left:
            self._wild[topic_filter] = left
        else:
            del self._wild[topic_filter]

    def remove_all(self, key: K) -> int:
        """Drop every subscription of ``key``.

        Returns:
            The number of subscriptions removed.
        """
        mine = self._by_key.get(key)
        if not mine:
            return 0
        filters = list(mine)
        for topic_filter in filters:
            self.remove(topic_filter, key)
        return len(filters)

    def filters_of(self, key: K) -> dict[str, int]:
        """Return a copy of ``{filter: qos}`` for ``key`` (empty if it has none)."""
        return dict(self._by_key.get(key, ()))

    def filters(self) -> Iterator[str]:
        """Iterate over the distinct filters with at least one subscriber (snapshot)."""
        return iter([*self._exact, *(p + "/+" for p in self._plus), *(p + "/#" for p in self._multi), *self._wild])

    def keys(self) -> Iterator[K]:
        """Iterate over the subscriber keys with at least one subscription (snapshot)."""
        return iter(list(self._by_key))

    def match(self, topic: str) -> dict[K, int]:
        """Find the subscribers of a topic name.

        Args:
            topic: a valid topic name (no wildcards).

        Returns:
            A new dict mapping each matching key to the maximum QoS over its matching filters.
        """
        exact = self._exact.get(topic)
        result: dict[K, int] = dict(exact) if exact else {}
        if self._plus:
            subs = self._plus_match(topic)
            if subs:
                _merge_max(result, subs)
        if self._multi:
            for subs in self._multi_matches(topic):
                _merge_max(result, subs)
        if not self._wild:
            return result
        root = self._root
        # MQTT-4.7.2-1: no wildcard at the first level matches a "$" topic.
        dollar = topic[:1] == "$"
        if root.multi and not dollar:
            _merge_max(result, root.multi)
        children = root.children
        # Look at the first level before splitting: most topics leave the trie right here.
        cut = topic.find("/")
        child = children.get(topic if cut < 0 else topic[:cut])
        plus = None if dollar else children.get("+")
        if child is None:
            if plus is None:
                return result
            nodes = [plus]
        else:
            nodes = [child] if plus is None else [child, plus]
        if cut >= 0:
            for level in topic[cut + 1:].split("/"):
                nxt = []
                for node in nodes:
                    if node.multi:
                        _merge_max(result, node.multi)  # "<prefix>/#" with more levels to come
                    children = node.children
                    if children:
                        child = children.get(level)
                        if child is not None:
                            nxt.append(child)
                        plus = children.get("+")
                        if plus is not None:
                            nxt.append(plus)
                if not nxt:
                    return result
                nodes = nxt
        for node in nodes:  # nodes reached by the last level
            if node.subs:
                _merge_max(result, node.subs)
            if node.multi:
                _merge_max(result, node.multi)  # "a/#" matches "a" (MQTT-4.7.1-2)
        return result

    def _plus_match(self, topic: str) -> dict[K, int] | None:
        """The subscribers of the ``P/+`` matching ``topic`` (``P`` = the topic up to its last ``/``), or None."""
        cut = topic.rfind("/")
        return self._plus.get(topic[:cut]) if cut >= 0 else None

    def _multi_matches(self, topic: str) -> Iterator[dict[K, int]]:
        """The subscribers of each ``P/#`` matching ``topic``: ``P`` is the topic's first ``depth`` levels, for
        each level count ``depth`` of a ``P`` present, and "``P/#`` matches ``P``" (MQTT-4.7.1-2)."""
        multi = self._multi
        for depth in self._multi_depths:
            pos = -1
            found = 0
            while found < depth:
                pos = topic.find("/", pos + 1)
                if pos < 0:
                    break
                found += 1
            if found == depth:
                subs = multi.get(topic[:pos])
            elif found == depth - 1:  # the topic has exactly ``depth`` levels: it is a P itself
                subs = multi.get(topic)
            else:
                continue
            if subs:
                yield subs

    def has_match(self, topic: str) -> bool:
        """Tell whether any subscriber matches the topic (cheaper than :meth:`match`)."""
        if topic in self._exact:
            return True
        if self._plus and self._plus_match(topic):  # a P's dict is dropped when its last subscriber goes
            return True
        if self._multi:
            for _ in self._multi_matches(topic):
                return True
        if not self._wild:
            return False
        dollar = topic[:1] == "$"
        levels = topic.split("/")
        root = self._root
        if root.multi and not dollar:
            return True
        nodes = [root]
        for i, level in enumerate(levels):
            nxt = []
            for node in nodes:
                if i and node.multi:
                    return True
                child = node.children.get(level)
                if child is not None:
                    nxt.append(child)
                if not (dollar and i == 0):
                    plus = node.children.get("+")
                    if plus is not None:
                        nxt.append(plus)
            if not nxt:
                return False
            nodes = nxt
        return any(node.subs or node.multi for node in nodes)
