"""RetainedStore.matching through its first-level index answers exactly what a scan of every topic does."""
from __future__ import annotations

import random

from fanout.mqtt.retained import RetainedStore
from fanout.mqtt.topics import topic_matches

LEVELS = ("agent", "ecp", "$SYS", "", "a", "b")
FILTERS = ("agent/#", "agent/+/x", "agent", "ecp/+", "$SYS/#", "$SYS/broker/+", "#", "+/x", "+", "/#", "a/b/#",
           "b/+/+", "zzz/#")


def _scan(store: RetainedStore, topic_filter: str) -> list[tuple[str, bytes, int]]:
    return [(t, *store.get(t)) for t in store.topics() if topic_matches(topic_filter, t)]  # type: ignore[misc]


def test_index_matches_a_full_scan_through_sets_replacements_clears_and_refusals():
    rng = random.Random(16)
    store = RetainedStore(max_messages=40, max_bytes=4_000)
    for step in range(3_000):
        topic = "/".join([rng.choice(LEVELS), *(rng.choice("xyz") for _ in range(rng.randint(0, 2)))])
        if topic.startswith("$SYS") and topic == "$SYS":
            topic = "$SYS/broker"
        payload = b"" if rng.random() < 0.3 else bytes(rng.randint(1, 200))
        store.set(topic, payload, rng.randint(0, 1))
        if step % 50 == 0:
            for f in FILTERS:
                assert list(store.matching(f)) == _scan(store, f), f
    assert len(store) > 0


def test_a_cleared_topic_leaves_the_index():
    store = RetainedStore()
    store.set("agent/V1/x", b"1", 1)
    store.set("$SYS/broker/uptime", b"5", 0)
    assert list(store.matching("agent/#")) == [("agent/V1/x", b"1", 1)]
    store.set("agent/V1/x", b"", 1)
    store.set("$SYS/broker/uptime", b"", 0)
    assert list(store.matching("agent/#")) == []
    assert list(store.matching("$SYS/#")) == []
    assert store._by_first == {}  # nothing left behind for topics that are gone
