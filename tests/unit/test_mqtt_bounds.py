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
