"""The bounds that keep a client from growing the broker's memory (issue 12), in memory.

Each bound is checked where it bites, and that its hit is counted (``$SYS/broker/limits/<name>``).
"""
from __future__ import annotations

import pytest

from fanout.config import UserConfig
from fanout.mqtt.auth import hash_password
from fanout.mqtt.codec import PacketReader, encode
from fanout.mqtt.errors import PacketTooLarge
from fanout.mqtt.packets import Connack, Connect, Pingreq, Pingresp, Puback, Publish, Suback, Subscribe

from .test_mqtt_broker import Net


def _hits(net: Net) -> dict[str, int]:
    return net.broker.state.caps.hits


# -- before authentication ---------------------------------------------------------------------------


def test_first_byte_that_is_not_connect_closes_at_once():
    net = Net()
    c = net.client()
    c.send_raw(b"\x30")  # the first byte of a PUBLISH: nothing more is needed to refuse it
    assert c.closed and c.take() == []
    assert _hits(net)["first_packet"] == 1 and net.broker.protocol_errors == 1
    snap = net.broker.sys.snapshot(net.now)
    assert snap["$SYS/broker/limits/first_packet"] == 1


def test_connect_has_its_own_small_cap():
    net = Net(mqtt={"max_connect_size": "1KiB"})
    c = net.client()
    c.send_raw(b"\x10\x81\x08")  # a CONNECT header announcing 1025 bytes: refused before the body
    assert c.closed and _hits(net)["connect_size"] == 1
    ok = net.client()
    assert ok.connect("a").return_code == 0  # a normal CONNECT is far below it
    ok.send(Publish("t", b"x" * 4096, 1, packet_id=1))  # the connected limit (1 MiB) applies after CONNACK
    assert ok.take() == [Puback(1)]


def _deferred_net(**mqtt):
    calls = []
    users = {"u": UserConfig("u", hash_password("pw", iterations=10), "client")}
    net = Net(mqtt=mqtt or None, users=users, defer_auth=lambda conn, fn: calls.append((conn, fn)))
    return net, calls


def test_nothing_is_decoded_while_authentication_runs():
    net, calls = _deferred_net()
    c = net.client()
    big = encode(Publish("t", b"x" * 100_000, 1, packet_id=1))
    c.send_raw(encode(Connect("a", True, 60, "u", b"pw")) + big + encode(Pingreq()))
    conn, fn = calls[0]
    assert conn.reader.buffered == len(big) + 2  # raw bytes, no packet objects
    assert net.broker.msgs_received == 1  # only the CONNECT was decoded
    net.broker.auth_done(conn, fn(), net.now)
    net.pump()
    assert c.take() == [Connack(False, 0), Puback(1), Pingresp()]


def test_too_much_sent_before_connack_closes():
    net, calls = _deferred_net(max_connect_size="1KiB")
    c = net.client()
    c.send_raw(encode(Connect("a", True, 60, "u", b"pw")))
    limit = 1024 + 256 * 1024
    c.send_raw(b"\x30" * limit)  # up to one read after the CONNECT is tolerated
    assert not c.closed
    c.send_raw(b"\x30")
    assert c.closed and _hits(net)["pre_auth_bytes"] == 1
    conn, fn = calls[0]
    net.broker.auth_done(conn, fn(), net.now)  # the late result finds the connection gone
    net.pump()
    assert c.take() == []


def test_platform_limit_applies_to_what_follows_the_connect():
    net = Net(mqtt={"max_packet_size": "1KiB", "max_platform_packet_size": "1MiB"})
    c = net.client()
    c.send(Connect("plat", True, 60, "platform", b"platform"), Publish("bulk", b"x" * 100_000, 1, packet_id=3))
    assert c.take() == [Connack(False, 0), Puback(3)]  # decoded after the CONNACK, under the platform limit


# -- the reader -----------------------------------------------------------------------------------------


def test_feed_first_decodes_one_packet_byte_by_byte_and_keeps_the_rest():
    connect = encode(Connect("a"))
    r = PacketReader()
    assert [r.feed_first(connect[i:i + 1]) for i in range(len(connect) - 1)] == [None] * (len(connect) - 1)
    assert r.feed_first(connect[-1:] + encode(Pingreq()) + b"\xc0") == Connect("a")  # trailing bytes kept
    assert r.buffered == 3
    r.hold(b"\x00" + encode(Pingreq()))
    assert r.feed(b"") == [Pingreq()] * 3


def test_feed_first_refuses_oversize_from_the_header():
    r = PacketReader(64)
    with pytest.raises(PacketTooLarge):
        r.feed_first(b"\x10\x41")


# -- topics and subscriptions ----------------------------------------------------------------------------


def test_deep_or_long_filters_get_suback_0x80_and_no_trie_nodes():
    net = Net(mqtt={"max_topic_levels": 4, "max_topic_length": "64B"})
    c = net.client()
    c.connect("a")
    assert c.subscribe(("a/b/c/d", 1), ("a/b/c/d/e", 1), ("+/" * 40 + "x", 0), ("x" * 65, 0)) == (1, 0x80, 0x80, 0x80)
    assert net.broker.route_filters() == ["a/b/c/d"]
    hits = _hits(net)
    assert (hits["topic_levels"], hits["topic_length"]) == (1, 2)
    assert net.broker.sys.snapshot(net.now)["$SYS/broker/limits/topic_length"] == 2


def test_length_bound_counts_utf8_bytes():
    net = Net(mqtt={"max_topic_length": "8B"})
    c = net.client()
    c.connect("a")
    assert c.subscribe(("é" * 4, 0), ("é" * 5, 0)) == (0, 0x80)  # 8 and 10 bytes of UTF-8


def test_publish_to_a_topic_over_the_bounds_is_acknowledged_not_delivered_not_cached():
    net = Net(mqtt={"max_topic_levels": 4})
    sub = net.client()
    sub.connect("s")
    sub.subscribe(("#", 1))
    pub = net.client()
    pub.connect("p")
    deep = "a/b/c/d/e"
    pub.send(Publish(deep, b"x", 1, packet_id=1), Publish("a/b", b"y", 1, packet_id=2))
    assert pub.take() == [Puback(1), Puback(2)]
    assert [p.topic for p in sub.take() if isinstance(p, Publish)] == ["a/b"]
    assert deep not in pub.conn.acl_cache and net.broker.pub_denied == 1
    assert _hits(net)["topic_levels"] == 1


def test_match_cache_is_bounded_and_a_topic_spray_churns_one_slot():
    net = Net(mqtt={"match_cache_entries": 8})
    cache = net.broker.state.match_cache
    sub = net.client()
    sub.connect("s")
    sub.subscribe(("t/#", 0))
    pub = net.client()
    pub.connect("p")
    pub.send(*(Publish(f"t/{i}", b"x", 0) for i in range(8)))
    assert sorted(cache) == [f"t/{i}" for i in range(8)]
    pub.send(*(Publish(f"spray/{i}", b"x", 0) for i in range(100)))  # nobody reads these
    assert len(cache) == 8
    assert {f"t/{i}" for i in range(7)} <= set(cache)  # what was resident stays; one slot churned
    pub.send(Publish("t/7", b"y", 0))  # evicted: matched again, still delivered
    assert [(p.topic, p.payload) for p in sub.take() if isinstance(p, Publish)][-1] == ("t/7", b"y")
    late = net.client()
    late.connect("late")
    late.subscribe(("t/0", 0))  # a subscription change empties the cache: no stale recipients
    assert cache == {}
    pub.send(Publish("t/0", b"z", 0))
    assert [p.topic for p in late.take() if isinstance(p, Publish)] == ["t/0"]


def test_will_topic_over_the_bounds_refuses_the_connect():
    from fanout.mqtt.packets import Will

    net = Net(mqtt={"max_topic_length": "16B"})
    c = net.client()
    assert c.connect("a", will=Will("w" * 17, b"", 0, False)) == Connack(False, 5)
    assert _hits(net)["topic_length"] == 1


def test_subscriptions_per_client():
    net = Net(mqtt={"max_subscriptions_per_client": 3})
    c = net.client()
    c.connect("a")
    assert c.subscribe(("t/1", 0), ("t/2", 0), ("t/3", 0), ("t/4", 0)) == (0, 0, 0, 0x80)
    assert c.subscribe(("t/1", 1), pid=2) == (1,)  # replacing a filter is not a new one
    assert _hits(net)["subscriptions"] == 1
    other = net.client()
    other.connect("b")
    assert other.subscribe(("t/4", 0)) == (0,)  # per client
    assert net.broker.subscription_count == 4


def test_publish_decision_cache_is_bounded_by_bytes():
    from fanout.config import load_config, mqtt_settings
    from fanout.mqtt.auth import AccessControl, Principal

    ac = AccessControl(mqtt_settings(load_config(None, env={})), listener_is_loopback=True, decision_cache_bytes=10_000)
    p = Principal(None, "client", "c")
    for i in range(100):
        assert ac.can_publish(p, f"{i:04d}/" + "x" * 1000)
        assert ac._decisions.bytes <= 10_000
    assert len(ac._decisions.entries) < 10


# -- bytes held for sessions and clients ------------------------------------------------------------------


def _offline_subscriber(net: Net, cid: str, topic_filter: str = "big/#"):
    c = net.client()
    c.connect(cid, clean=False)
    c.subscribe((topic_filter, 1))
    c.drop()  # gone, the session stays and queues
    return net.broker.session_of(cid)


def test_offline_session_is_bounded_by_bytes():
    net = Net(mqtt={"max_session_bytes": "4KiB"})
    s = _offline_subscriber(net, "sink")
    pub = net.client()
    pub.connect("p")
    for i in range(10):
        pub.send(Publish("big/x", b"x" * 1000, 1, packet_id=i + 1))
    assert s.bytes <= 4096 and s.queued_count() == 4  # 4 x (5 + 1000) bytes; the oldest were dropped
    assert [m.payload for m in s.queue] == [b"x" * 1000] * 4
    assert net.broker.pub_dropped == 6 and _hits(net)["session_bytes"] == 6
    snap = net.broker.sys.snapshot(net.now)
    assert snap["$SYS/broker/messages/queued/bytes"] == s.bytes and snap["$SYS/broker/limits/session_bytes"] == 6


def test_offline_queues_are_bounded_by_their_part_of_the_node_budget():
    net = Net(mqtt={"max_queued_bytes": "3000B", "offline_queued_fraction": 0.5, "max_session_bytes": "1MiB"})
    a, b = _offline_subscriber(net, "a", "t/a"), _offline_subscriber(net, "b", "t/b")
    pub = net.client()
    pub.connect("p")
    pub.send(Publish("t/a", b"a" * 600, 1, packet_id=1), Publish("t/a", b"a" * 600, 1, packet_id=2))
    pub.send(Publish("t/b", b"b" * 600, 1, packet_id=3))  # 3 x 603 > 1500: b has nothing to give up
    assert b.queued_count() == 0 and a.queued_count() == 2 and _hits(net)["offline_queued_bytes"] == 1
    budget = net.broker.state.queue_budget
    assert budget.queued_bytes == budget.offline_bytes == 1206 and budget.online_bytes == 0
    a_conn = net.client()
    a_conn.connect("a", clean=False)  # resumed: its queue goes in flight, out of the node budget
    assert budget.queued_bytes == 0 and a.bytes == 1206


def test_node_budget_bounds_online_and_offline_queues_together():
    net = Net(mqtt={"max_queued_bytes": "3000B", "offline_queued_fraction": 0.5, "max_session_bytes": "1MiB",
                    "max_inflight": 1})
    _offline_subscriber(net, "off", "t/off")
    slow = net.client()
    slow.connect("slow")
    slow.subscribe(("t/on", 1))
    pub = net.client()
    pub.connect("p")
    pub.send(Publish("t/off", b"o" * 1000, 1, packet_id=1))  # offline part: 1005 of 1500
    pub.send(*[Publish("t/on", b"n" * 480, 1, packet_id=i + 2) for i in range(5)])  # 1 in flight, 4 queued
    budget = net.broker.state.queue_budget
    assert budget.offline_bytes == 1005 and budget.online_bytes == 4 * 484 and _hits(net)["queued_bytes"] == 0
    pub.send(Publish("t/on", b"n" * 480, 1, packet_id=9))  # 1005 + 5 x 484 > 3000: the oldest queued goes
    assert budget.online_bytes == 4 * 484 and budget.queued_bytes <= 3000 and _hits(net)["queued_bytes"] == 1


def test_a_session_going_offline_is_trimmed_to_the_offline_part():
    net = Net(mqtt={"max_queued_bytes": "4000B", "offline_queued_fraction": 0.25, "max_session_bytes": "1MiB",
                    "max_inflight": 1})
    sub = net.client()
    sub.connect("s", clean=False)
    sub.subscribe(("t", 1))
    pub = net.client()
    pub.connect("p")
    pub.send(*[Publish("t", b"%d" % i + b"x" * 299, 1, packet_id=i + 1) for i in range(6)])  # 1 in flight, 5 queued
    budget = net.broker.state.queue_budget
    assert budget.online_bytes == 5 * 301
    sub.drop()  # 1505 bytes queued > the offline part (1000): the oldest are dropped to fit
    s = net.broker.session_of("s")
    assert budget.online_bytes == 0 and budget.offline_bytes == 3 * 301 <= 1000
    assert [m.payload[:1] for m in s.queue] == [b"3", b"4", b"5"]
    assert net.broker.pub_dropped == 2 and _hits(net)["offline_queued_bytes"] == 1


def test_tagged_delivery_dropped_by_bytes_is_reported():
    from fanout.mqtt.hooks import DeliverStatus, DeliveryDropped, RecordingHooks

    hooks = RecordingHooks()
    net = Net(mqtt={"max_session_bytes": "2KiB", "max_inflight": 1}, hooks=hooks)
    v = net.client()
    v.connect("V1", clean=False)
    v.subscribe(("agent/V1/#", 1))
    assert net.broker.deliver("V1", "agent/V1/r1", b"x" * 1500, tag="r1") is DeliverStatus.SENT
    assert net.broker.deliver("V1", "agent/V1/r2", b"x" * 1500, tag="r2") is DeliverStatus.DROPPED
    net.pump()
    assert [e.tag for e in hooks.take(DeliveryDropped)] == ["r2"]


def test_write_buffer_full_closes_and_keeps_the_persistent_session():
    from fanout.mqtt.packets import Will

    net = Net()
    watcher = net.client()
    watcher.connect("w")
    watcher.subscribe(("will/#", 0))
    slow = net.client()
    slow.connect("slow", clean=False, will=Will("will/slow", b"gone", 0, False))
    net.broker.write_buffer_full(slow.conn, 9 << 20)
    net.pump()
    assert slow.closed and slow.conn.close_reason == "write buffer full"
    assert net.broker.session_of("slow") is not None  # persistent: kept
    assert [(p.topic, p.payload) for p in watcher.take() if isinstance(p, Publish)] == [("will/slow", b"gone")]
    assert _hits(net)["write_buffer"] == 1
    net.broker.write_buffer_full(slow.conn, 9 << 20)  # already closed: nothing more
    assert _hits(net)["write_buffer"] == 1


# -- retained messages -----------------------------------------------------------------------------------


def test_retained_store_bounds():
    from fanout.mqtt.retained import RetainedStore

    r = RetainedStore(max_messages=2, max_bytes=100)
    r.track_changes()
    assert r.set("a", b"x" * 40, 1) is None and r.set("b", b"y" * 40, 0) is None  # 41 + 41 bytes
    assert r.set("c", b"z", 0) == "retained_messages"
    assert r.set("a", b"x" * 60, 1) == "retained_bytes"  # 41 + 61 > 100: refused, and "a" is superseded
    assert "a" not in r and r.stored_bytes == 41 and len(r) == 1
    assert r.take_changes() == {"a": None, "b": (b"y" * 40, 0)}
    assert r.set("c", b"z" * 50, 0) is None and r.stored_bytes == 92
    assert r.set("$SYS/broker/uptime", b"9" * 500, 0) is None  # the server's own: outside the bounds
    assert len(r) == 3 and r.stored_bytes == 92
    assert r.set("c", b"", 0) is None and r.stored_bytes == 41  # clearing frees
    assert r.set("nothing", b"", 0) is None and r.take_changes() == {"c": None}


def test_retained_refusal_still_routes_and_is_counted():
    net = Net(mqtt={"max_retained_bytes": "2KiB"})
    sub = net.client()
    sub.connect("s")
    sub.subscribe(("r/#", 0))
    pub = net.client()
    pub.connect("p")
    pub.send(Publish("r/1", b"a" * 1500, 0, retain=True), Publish("r/2", b"b" * 1500, 0, retain=True))
    assert [p.topic for p in sub.take() if isinstance(p, Publish)] == ["r/1", "r/2"]  # both delivered
    assert net.broker.retained.topics() == ["r/1"] and _hits(net)["retained_bytes"] == 1
    snap = net.broker.sys.snapshot(net.now)
    assert snap["$SYS/broker/retained messages/bytes"] == 1503 and snap["$SYS/broker/limits/retained_bytes"] == 1
    late = net.client()
    late.connect("late")
    late.send(Subscribe(1, (("r/#", 0),)))
    got = late.take()
    assert got[0] == Suback(1, (0,)) and [p.topic for p in got[1:]] == ["r/1"]
