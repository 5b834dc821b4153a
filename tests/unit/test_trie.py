"""SubscriptionTrie tests, including a brute-force equivalence property."""
from __future__ import annotations

import pickle

from hypothesis import given, settings
from hypothesis import strategies as st
import pytest

from fanout.mqtt.topics import InvalidTopic, topic_matches
from fanout.mqtt import trie as trie_module
from fanout.mqtt.trie import SubscriptionTrie


def test_exact_and_wildcards():
    t: SubscriptionTrie[str] = SubscriptionTrie()
    assert t.add("a/b", "c1", 1)
    assert t.add("a/+", "c2", 0)
    assert t.add("a/#", "c3", 2)
    assert t.add("#", "c4", 1)
    assert t.match("a/b") == {"c1": 1, "c2": 0, "c3": 2, "c4": 1}
    assert t.match("a") == {"c3": 2, "c4": 1}  # MQTT-4.7.1-2
    assert t.match("a/b/c") == {"c3": 2, "c4": 1}
    assert t.match("b") == {"c4": 1}
    assert t.match("$SYS/x") == {}  # MQTT-4.7.2-1
    assert len(t) == 4


def test_overlapping_subscriptions_deliver_once_at_max_qos():
    t: SubscriptionTrie[str] = SubscriptionTrie()
    t.add("a/b", "c", 0)
    t.add("a/+", "c", 2)
    t.add("#", "c", 1)
    assert t.match("a/b") == {"c": 2}
    assert t.match("x") == {"c": 1}
    assert len(t) == 3


def test_add_replaces_qos():
    t: SubscriptionTrie[str] = SubscriptionTrie()
    assert t.add("a/+", "c", 0) is True
    assert t.add("a/+", "c", 2) is False
    assert t.match("a/x") == {"c": 2}
    assert t.filters_of("c") == {"a/+": 2}
    assert len(t) == 1
    assert list(t.filters()) == ["a/+"]


def test_remove_and_prune():
    t: SubscriptionTrie[str] = SubscriptionTrie()
    t.add("a/b/c/#", "c1", 1)
    t.add("a/+/c", "c2", 1)
    t.add("x", "c1", 0)
    assert t.remove("a/b/c/#", "c1")
    assert not t.remove("a/b/c/#", "c1")
    assert not t.remove("nope", "c1")
    assert t.match("a/b/c") == {"c2": 1}
    assert t.remove("a/+/c", "c2")
    assert t._root.empty()  # every wildcard node pruned
    assert t.match("a/b/c") == {}
    assert set(t.filters()) == {"x"}
    assert len(t) == 1


def test_remove_all():
    t: SubscriptionTrie[str] = SubscriptionTrie()
    for f in ("a", "a/#", "+/b", "$SYS/#"):
        t.add(f, "c1", 1)
    t.add("a", "c2", 0)
    assert t.remove_all("c1") == 4
    assert t.remove_all("c1") == 0
    assert t.filters_of("c1") == {}
    assert t.match("a") == {"c2": 0}
    assert len(t) == 1
    assert list(t.keys()) == ["c2"]
    assert t._root.empty()


def test_invalid_filter_rejected():
    t: SubscriptionTrie[str] = SubscriptionTrie()
    with pytest.raises(InvalidTopic):
        t.add("a/#/b", "c", 0)
    with pytest.raises(ValueError):
        t.add("a", "c", 3)
    assert len(t) == 0


def test_match_returns_a_copy():
    t: SubscriptionTrie[str] = SubscriptionTrie()
    t.add("a", "c", 1)
    t.match("a")["d"] = 0
    assert t.match("a") == {"c": 1}


def test_has_match():
    t: SubscriptionTrie[str] = SubscriptionTrie()
    assert not t.has_match("a")
    t.add("a/+/c", "c", 0)
    assert t.has_match("a/b/c")
    assert not t.has_match("a/b")
    assert not t.has_match("a/b/c/d")
    t.add("+/#", "c", 0)
    assert t.has_match("x")
    assert not t.has_match("$SYS/x")


def test_sys_filters():
    t: SubscriptionTrie[str] = SubscriptionTrie()
    t.add("$SYS/+/x", "c", 1)
    t.add("+/+/x", "d", 1)
    assert t.match("$SYS/a/x") == {"c": 1}
    assert t.match("b/a/x") == {"d": 1}


def test_many_exact_subscriptions():
    t: SubscriptionTrie[str] = SubscriptionTrie()
    for i in range(10_000):
        t.add(f"agent/VIN{i}/proxy/request/#" if i % 1000 == 0 else f"agent/VIN{i}/in", f"VIN{i}", 1)
    assert t.match("agent/VIN5/in") == {"VIN5": 1}
    assert t.match("agent/VIN1000/proxy/request/r1") == {"VIN1000": 1}
    assert len(t) == 10_000


LEVELS = st.sampled_from(["a", "b", "$SYS", "$x", "", "c"])
TOPICS = st.lists(LEVELS, min_size=1, max_size=4).map("/".join).filter(bool)


@st.composite
def filters(draw):
    levels = draw(st.lists(st.one_of(LEVELS, st.just("+")), min_size=1, max_size=4))
    if draw(st.booleans()):
        levels.append("#")
    f = "/".join(levels)
    return f if f else "+"


@settings(max_examples=300, deadline=None)
@given(subs=st.lists(st.tuples(filters(), st.sampled_from(["k1", "k2", "k3"]), st.integers(0, 2)),
                     max_size=25),
       removals=st.lists(st.integers(0, 30), max_size=8),
       topics=st.lists(TOPICS, min_size=1, max_size=10))
def test_match_equals_brute_force(subs, removals, topics):
    t: SubscriptionTrie[str] = SubscriptionTrie()
    model: dict[tuple[str, str], int] = {}
    for f, key, qos in subs:
        assert t.add(f, key, qos) == ((f, key) not in model)
        model[(f, key)] = qos
    for i in removals:
        if subs and i < len(subs):
            f, key, _ = subs[i]
            assert t.remove(f, key) == ((f, key) in model)
            model.pop((f, key), None)
    assert len(t) == len(model)
    assert set(t.filters()) == {f for f, _ in model}
    for topic in topics:
        expected: dict[str, int] = {}
        for (f, key), qos in model.items():
            if topic_matches(f, topic):
                expected[key] = max(qos, expected.get(key, -1))
        assert t.match(topic) == expected, topic
        assert t.has_match(topic) == bool(expected), topic
    for key in ("k1", "k2", "k3"):
        t.remove_all(key)
    assert len(t) == 0 and t._root.empty() and not list(t.filters())
    assert not t._plus and not t._multi and not t._multi_depths  # the tail index is emptied as well
    assert len(trie_module._NONE) == 0  # the shared read-only stand-in for an unused dict was never written


def test_a_trie_node_holds_only_the_dict_it_uses():
    # "+/<VIN>/#" makes one node per vehicle that only ever needs ``multi``: its ``children`` and ``subs`` stay
    # the shared read-only stand-in (two empty dicts less per node), which refuses writes.
    t: SubscriptionTrie[str] = SubscriptionTrie()
    t.add("+/VIN00000000000001/#", "VIN00000000000001", 1)
    node = t._root.children["+"].children["VIN00000000000001"]
    assert node.multi == {"VIN00000000000001": 1}
    assert node.children is trie_module._NONE and node.subs is trie_module._NONE
    with pytest.raises(TypeError):
        trie_module._NONE["x"] = 1
    t.add("+/VIN00000000000001/+/x", "VIN00000000000001", 0)
    assert node.children["+"].children["x"].subs == {"VIN00000000000001": 0}
    assert t.match("agent/VIN00000000000001/y/x") == {"VIN00000000000001": 1}
    copied = pickle.loads(pickle.dumps(t))  # pickles (and copies) with the shared stand-in, not a new dict
    vehicle = copied._root.children["+"].children["VIN00000000000001"]
    assert vehicle.subs is trie_module._NONE and copied.match("agent/VIN00000000000001/y") == t.match(
        "agent/VIN00000000000001/y")


def test_a_vehicle_filter_with_its_wildcard_last_makes_no_trie_node():
    """``agent/<VIN>/#`` and ``agent/<VIN>/proxy/request/+`` are one dict entry each (keyed by the literal part),
    not a chain of trie nodes per vehicle; they match, are listed and are removed like any filter."""
    t: SubscriptionTrie[str] = SubscriptionTrie()
    for i in range(3):
        vin = f"VIN{i:014d}"
        assert t.add(f"agent/{vin}/#", vin, 1) and t.add(f"agent/{vin}/proxy/request/+", vin, 0)
    t.add("$SYS/broker/#", "admin", 0)
    t.add("agent/VIN00000000000001/#", "VIN00000000000001", 2)  # a repeat replaces the QoS
    assert t._root.empty() and not t._wild
    assert t.match("agent/VIN00000000000001") == {"VIN00000000000001": 2}  # "P/#" matches P
    assert t.match("agent/VIN00000000000001/proxy/request/r1") == {"VIN00000000000001": 2}
    assert t.match("agent/VIN00000000000000/proxy/request/r1") == {"VIN00000000000000": 1}
    assert t.match("agent/VIN00000000000000/proxy/request") == {"VIN00000000000000": 1}
    assert t.match("agent/VIN000000000000") == {} and not t.has_match("agent/VIN0000000000000")
    assert t.match("$SYS/broker/uptime") == {"admin": 0} and t.has_match("$SYS/broker")
    assert len(t) == 7 and "agent/VIN00000000000002/proxy/request/+" in set(t.filters())
    copied = pickle.loads(pickle.dumps(t))
    assert copied.match("agent/VIN00000000000002/x") == {"VIN00000000000002": 1}
    assert t.remove_all("VIN00000000000001") == 2
    assert t.match("agent/VIN00000000000001/proxy/request/r1") == {}
    for key in ("VIN00000000000000", "VIN00000000000002", "admin"):
        t.remove_all(key)
    assert not t._plus and not t._multi and not t._multi_depths and not list(t.filters())
