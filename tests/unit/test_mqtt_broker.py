"""The broker core driven in memory: encoded packets in, decoded packets out, no sockets.

``Net`` plays the asyncio adapter (clock, flush, close) and ``FakeClient`` a network peer, like h11's
``ConnectionPair``: every test reads as a short MQTT conversation.
"""
from __future__ import annotations

import dataclasses
import json

import pytest

from fanout.config import AclRule, UserConfig, load_config, mqtt_settings
from fanout.mqtt.auth import AccessControl, hash_password
from fanout.mqtt.broker import Broker
from fanout.mqtt.codec import PacketReader, encode
from fanout.mqtt.connection import CLOSED, CONNECTED, ERROR
from fanout.mqtt.hooks import (
    ClientConnected, ClientDisconnected, Delivered, DeliveryDropped, DeliverStatus, Heartbeat, IngestTicket,
    LocalPublish, RecordingHooks, Subscribed, Unsubscribed,
)
from fanout.mqtt.packets import (
    Connack, Connect, Disconnect, Pingreq, Pingresp, Puback, Pubcomp, Publish, Pubrec, Pubrel, Suback,
    Subscribe, Unsuback, Unsubscribe, Will,
)


def make_config(mqtt: dict | None = None, users: dict | None = None, acl: tuple = ()):
    cfg = load_config(None, env={})
    if mqtt:
        cfg = cfg.replace("mqtt", **mqtt)
    if users is not None or acl:
        cfg = dataclasses.replace(cfg, users=users or {}, acl=tuple(acl))
    return cfg


class Net:
    """A broker plus a fake clock; plays the I/O adapter."""

    def __init__(self, mqtt: dict | None = None, users: dict | None = None, acl: tuple = (), hooks=None,
                 defer_auth=None) -> None:
        self.now = 1_000_000
        self.settings = mqtt_settings(make_config(mqtt, users, acl))
        self.acl = AccessControl(self.settings, listener_is_loopback=True)
        self.wakeups = 0
        self.broker = Broker(self.settings, self.acl, hooks, now_ms=self.now, defer_auth=defer_auth,
                             on_output=self._wake)
        self.hooks = hooks

    def _wake(self) -> None:
        self.wakeups += 1

    def client(self) -> "FakeClient":
        return FakeClient(self)

    def pump(self) -> None:
        for conn, data in self.broker.flush():
            peer: FakeClient = conn.transport
            if data and not peer.closed:
                peer.inbox.extend(peer.reader.feed(data))
            if conn.state >= CLOSED:
                peer.closed = True

    def advance(self, ms: int) -> None:
        self.now += ms
        self.broker.tick(self.now)
        self.pump()


class FakeClient:
    def __init__(self, net: Net) -> None:
        self.net = net
        self.conn = net.broker.connection_made(net.now, ("127.0.0.1", 50000))
        self.conn.transport = self
        self.reader = PacketReader()
        self.inbox: list = []
        self.closed = False

    def send(self, *packets) -> None:
        self.send_raw(b"".join(encode(p) for p in packets))

    def send_raw(self, data: bytes) -> None:
        self.net.broker.data_received(self.conn, data, self.net.now)
        self.net.pump()

    def take(self) -> list:
        out, self.inbox = self.inbox, []
        return out

    def connect(self, client_id: str, clean: bool = True, keepalive: int = 60, will: Will | None = None,
                username: str | None = None, password: bytes | None = None) -> Connack:
        self.send(Connect(client_id, clean, keepalive, username, password, will))
        got = self.take()
        assert got and isinstance(got[0], Connack), got
        self.inbox = got[1:]
        return got[0]

    def subscribe(self, *filters: tuple[str, int], pid: int = 1) -> tuple[int, ...]:
        self.send(Subscribe(pid, tuple(filters)))
        got = self.take()
        assert isinstance(got[0], Suback) and got[0].packet_id == pid, got
        self.inbox = got[1:]
        return got[0].return_codes

    def drop(self) -> None:
        """The socket dies without DISCONNECT."""
        self.net.broker.connection_lost(self.conn, self.net.now)
        self.net.pump()
        self.closed = True


def pubs(packets) -> list[tuple]:
    return [(p.topic, p.payload, p.qos, p.retain, p.dup) for p in packets if isinstance(p, Publish)]


@pytest.fixture
def net() -> Net:
    return Net()


# -- CONNECT ---------------------------------------------------------------------------------------


def test_connect_accepted(net):
    c = net.client()
    assert c.connect("a") == Connack(False, 0)
    assert c.conn.state is CONNECTED
    assert net.broker.clients_connected == 1


def test_first_packet_must_be_connect(net):
    c = net.client()
    c.send(Pingreq())
    assert c.closed and c.take() == []
    assert c.conn.state is ERROR


def test_second_connect_closes_and_publishes_will(net):
    w = net.client()
    w.connect("watcher")
    w.subscribe(("will/#", 0))
    c = net.client()
    c.connect("a", will=Will("will/a", b"gone", 0, False))
    c.send(Connect("a"))
    assert c.closed
    assert pubs(w.take()) == [("will/a", b"gone", 0, False, False)]


def test_bad_protocol_level_gets_connack_1():
    net = Net()
    c = net.client()
    raw = bytearray(encode(Connect("a")))
    raw[8] = 3  # protocol level byte (after 10 02 00 04 'MQTT')
    c.send_raw(bytes(raw))
    assert c.take() == [Connack(False, 1)]
    assert c.closed


def test_zero_length_client_id(net):
    c = net.client()
    assert c.connect("", clean=False) == Connack(False, 2)  # MQTT-3.1.3-8
    assert c.closed
    c1, c2 = net.client(), net.client()
    assert c1.connect("", clean=True).return_code == 0
    assert c2.connect("", clean=True).return_code == 0
    assert c1.conn.client_id != c2.conn.client_id and c1.conn.client_id.startswith("auto-")


def test_bad_credentials_and_not_authorised():
    users = {"u": UserConfig("u", hash_password("right", iterations=1000), "client")}
    net = Net(mqtt={"anonymous_role": "none"}, users=users)
    c = net.client()
    assert c.connect("a", username="u", password=b"wrong") == Connack(False, 4)
    assert c.closed
    c = net.client()
    assert c.connect("a") == Connack(False, 5)  # anonymous refused
    c = net.client()
    assert c.connect("a", username="u", password=b"right") == Connack(False, 0)


def test_will_topic_must_be_publishable(net):
    c = net.client()
    assert c.connect("a", will=Will("$SYS/x", b"", 0, False)) == Connack(False, 5)


def test_dev_login_and_cache_hits_need_no_thread_hop():
    calls = []
    net = Net(defer_auth=lambda conn, fn: calls.append((conn, fn)))
    c = net.client()
    assert c.connect("a", username="platform", password=b"platform") == Connack(False, 0)
    assert calls == []


def test_deferred_auth_holds_packets():
    calls = []
    users = {"u": UserConfig("u", hash_password("pw", iterations=1000), "client")}
    net = Net(users=users, defer_auth=lambda conn, fn: calls.append((conn, fn)))
    c = net.client()
    c.send(Connect("a", True, 60, "u", b"pw"), Subscribe(1, (("t", 1),)), Pingreq())
    assert c.take() == [] and len(calls) == 1
    c.send(Pingreq())  # still held
    conn, fn = calls[0]
    net.broker.auth_done(conn, fn(), net.now)
    net.pump()
    assert c.take() == [Connack(False, 0), Suback(1, (1,)), Pingresp(), Pingresp()]


def test_deferred_auth_failure_and_exception():
    calls = []
    users = {"u": UserConfig("u", hash_password("pw", iterations=1000), "client")}
    net = Net(users=users, defer_auth=lambda conn, fn: calls.append((conn, fn)))
    c = net.client()
    c.send(Connect("a", True, 60, "u", b"nope"))
    net.broker.auth_done(calls[0][0], calls[0][1](), net.now)
    net.pump()
    assert c.take() == [Connack(False, 4)] and c.closed
    c = net.client()
    c.send(Connect("a", True, 60, "u", b"nope"))  # the same wrong password again: answered from memory
    assert c.take() == [Connack(False, 4)] and len(calls) == 1
    c = net.client()
    c.send(Connect("b", True, 60, "u", b"other"))
    net.broker.auth_done(calls[1][0], RuntimeError("boom"), net.now)
    net.pump()
    assert c.take() == [Connack(False, 3)] and c.closed


# -- PUBLISH / SUBSCRIBE ---------------------------------------------------------------------------


@pytest.mark.parametrize(("pub_qos", "sub_qos", "got_qos"), [(0, 0, 0), (0, 2, 0), (1, 0, 0), (1, 1, 1), (2, 1, 1), (2, 2, 2), (1, 2, 1)])
def test_delivery_at_min_qos(net, pub_qos, sub_qos, got_qos):
    s, p = net.client(), net.client()
    s.connect("s")
    p.connect("p")
    assert s.subscribe(("a/b", sub_qos)) == (sub_qos,)
    p.send(Publish("a/b", b"x", pub_qos, False, False, 9 if pub_qos else None))
    acks = p.take()
    assert acks == ([] if pub_qos == 0 else [Puback(9)] if pub_qos == 1 else [Pubrec(9)])
    got = s.take()
    assert len(got) == 1 and got[0].qos == got_qos and got[0].retain is False


def test_qos2_both_directions(net):
    s, p = net.client(), net.client()
    s.connect("s")
    p.connect("p")
    s.subscribe(("q", 2))
    p.send(Publish("q", b"1", 2, False, False, 5))
    assert p.take() == [Pubrec(5)]
    (m,) = s.take()
    assert m.qos == 2
    p.send(Publish("q", b"1", 2, False, True, 5))  # DUP before PUBREL: not routed again
    assert p.take() == [Pubrec(5)] and s.take() == []
    p.send(Pubrel(5))
    assert p.take() == [Pubcomp(5)]
    s.send(Pubrec(m.packet_id))
    assert s.take() == [Pubrel(m.packet_id)]
    s.send(Pubcomp(m.packet_id))
    assert not net.broker.sessions["s"].inflight


def test_overlapping_subscriptions_once_at_max_qos(net):
    s, p = net.client(), net.client()
    s.connect("s")
    p.connect("p")
    assert s.subscribe(("a/#", 0), ("a/+", 1), ("a/b", 2)) == (0, 1, 2)
    p.send(Publish("a/b", b"x", 2, False, False, 1))
    got = [x for x in s.take() if isinstance(x, Publish)]
    assert len(got) == 1 and got[0].qos == 2


def test_wildcards_and_dollar_topics(net):
    s, p = net.client(), net.client()
    s.connect("s")
    p.connect("p", username="platform", password=b"platform")
    s.subscribe(("#", 0), ("+/x", 0))
    p.send(Publish("$SDV-FANOUT/x", b"d", 0))
    assert s.take() == []  # MQTT-4.7.2-1
    p.send(Publish("a", b"1", 0))
    assert pubs(s.take()) == [("a", b"1", 0, False, False)]
    s2 = net.client()
    s2.connect("s2")
    s2.subscribe(("a/#", 0))
    p.send(Publish("a", b"2", 0))  # a/# matches a (MQTT-4.7.1-2)
    assert pubs(s2.take()) == [("a", b"2", 0, False, False)]


def test_sys_tree_published_and_not_matched_by_hash():
    net = Net(mqtt={"sys_interval": "1s"})
    s, admin = net.client(), net.client()
    s.connect("s")
    s.subscribe(("#", 0))
    admin.connect("sysreader")
    admin.subscribe(("$SYS/broker/clients/#", 0))
    net.advance(1000)
    assert s.take() == []
    topics = {t: v for t, v, *_ in pubs(admin.take())}
    assert topics["$SYS/broker/clients/connected"] == b"2"
    # a new subscriber gets the retained $SYS values
    late = net.client()
    late.connect("late")
    late.subscribe(("$SYS/broker/version", 0))
    ((topic, payload, qos, retain, _),) = pubs(late.take())
    assert retain and payload.startswith(b"sdv-fanout")


def test_retained_set_replay_clear(net):
    p, s = net.client(), net.client()
    p.connect("p")
    p.send(Publish("r/1", b"keep", 1, True, False, 1))
    p.take()
    s.connect("s")
    s.subscribe(("r/#", 1))
    assert pubs(s.take()) == [("r/1", b"keep", 1, True, False)]  # MQTT-3.3.1-6/8
    # a live subscriber gets a new retained publish with RETAIN=0 (MQTT-3.3.1-9)
    p.send(Publish("r/1", b"new", 0, True))
    assert pubs(s.take()) == [("r/1", b"new", 0, False, False)]
    p.send(Publish("r/1", b"", 0, True))  # clears (MQTT-3.3.1-10/11), still forwarded
    assert pubs(s.take()) == [("r/1", b"", 0, False, False)]
    s2 = net.client()
    s2.connect("s2")
    s2.subscribe(("r/#", 1))
    assert s2.take() == []
    assert len(net.broker.retained) == 0


def test_retained_replay_downgraded_to_granted_qos(net):
    p, s = net.client(), net.client()
    p.connect("p")
    p.send(Publish("r", b"v", 2, True, False, 1))
    s.connect("s")
    s.subscribe(("r", 0))
    assert pubs(s.take()) == [("r", b"v", 0, True, False)]


def test_subscribe_refusals(net):
    net2 = Net(acl=(AclRule("subscribe", "test/nosubscribe", False),))
    c = net2.client()
    c.connect("a")
    assert c.subscribe(("test/nosubscribe", 1), ("ok", 1), ("bad/#/x", 0), ("", 0)) == (0x80, 1, 0x80, 0x80)


def test_publish_denied_is_acked_not_delivered(net):
    s, p = net.client(), net.client()
    s.connect("s", username="platform", password=b"platform")
    s.subscribe(("$SDV-FANOUT/#", 1))
    p.connect("p")  # role client: may not publish $SDV-FANOUT/#
    p.send(Publish("$SDV-FANOUT/trigger", b"{}", 1, False, False, 3), Publish("$SDV-FANOUT/trigger", b"{}", 2, False, False, 4))
    assert p.take() == [Puback(3), Pubrec(4)]
    assert s.take() == []
    assert net.broker.pub_denied == 2
    assert not p.closed


def test_unsubscribe(net):
    s, p = net.client(), net.client()
    s.connect("s")
    p.connect("p")
    s.subscribe(("a", 1))
    s.send(Unsubscribe(7, ("a", "never/subscribed")))
    assert s.take() == [Unsuback(7)]
    p.send(Publish("a", b"x", 0))
    assert s.take() == []
    assert net.broker.subscription_count == 0


def test_pingreq(net):
    c = net.client()
    c.connect("a")
    c.send(Pingreq())
    assert c.take() == [Pingresp()]


def test_byte_at_a_time(net):
    c = net.client()
    data = encode(Connect("a")) + encode(Subscribe(1, (("t", 0),))) + encode(Pingreq())
    for i in range(len(data)):
        c.send_raw(data[i:i + 1])
    assert c.take() == [Connack(False, 0), Suback(1, (0,)), Pingresp()]


# -- sessions --------------------------------------------------------------------------------------


def test_offline_queue_and_session_present(net):
    s, p = net.client(), net.client()
    assert s.connect("s", clean=False).session_present is False
    s.subscribe(("t", 1))
    s.send(Disconnect())
    assert s.closed
    p.connect("p")
    for i in range(3):
        p.send(Publish("t", b"%d" % i, 1, False, False, i + 1))
    p.send(Publish("t", b"q0", 0))  # QoS 0 is not queued for an offline client
    s = net.client()
    assert s.connect("s", clean=False) == Connack(True, 0)
    assert [x[1] for x in pubs(s.take())] == [b"0", b"1", b"2"]


def test_clean_session_discards_old_session(net):
    s = net.client()
    s.connect("s", clean=False)
    s.subscribe(("t", 1))
    s.send(Disconnect())
    s = net.client()
    assert s.connect("s", clean=True) == Connack(False, 0)
    s.send(Disconnect())
    s = net.client()
    assert s.connect("s", clean=False) == Connack(False, 0)  # nothing left to resume
    assert net.broker.subscription_count == 0


def test_redelivery_with_dup_qos1(net):
    s, p = net.client(), net.client()
    s.connect("s", clean=False)
    s.subscribe(("t", 1))
    p.connect("p")
    p.send(Publish("t", b"a", 1, False, False, 1), Publish("t", b"b", 1, False, False, 2))
    first = s.take()
    assert [m.dup for m in first] == [False, False]
    s.send(Puback(first[0].packet_id))
    s.drop()
    s = net.client()
    assert s.connect("s", clean=False).session_present
    again = s.take()
    assert pubs(again) == [("t", b"b", 1, False, True)]
    assert again[0].packet_id == first[1].packet_id


def test_redelivery_qos2_publish_then_pubrel(net):
    s, p = net.client(), net.client()
    s.connect("s", clean=False)
    s.subscribe(("t", 2))
    p.connect("p")
    p.send(Publish("t", b"a", 2, False, False, 1), Publish("t", b"b", 2, False, False, 2))
    m1, m2 = s.take()
    s.send(Pubrec(m1.packet_id))
    assert s.take() == [Pubrel(m1.packet_id)]
    s.drop()
    s = net.client()
    s.connect("s", clean=False)
    # in order: PUBREL for the one past PUBREC, PUBLISH DUP for the other (MQTT-4.4.0-1)
    assert s.take() == [Pubrel(m1.packet_id), Publish("t", b"b", 2, False, True, m2.packet_id)]


def test_inbound_qos2_state_kept_across_reconnect(net):
    s, p = net.client(), net.client()
    s.connect("s")
    s.subscribe(("t", 0))
    p.connect("p", clean=False)
    p.send(Publish("t", b"x", 2, False, False, 9))
    assert p.take() == [Pubrec(9)]
    p.drop()
    p = net.client()
    p.connect("p", clean=False)
    p.send(Publish("t", b"x", 2, False, True, 9))  # the client resends: must not be routed again
    assert p.take() == [Pubrec(9)]
    p.send(Pubrel(9))
    assert p.take() == [Pubcomp(9)]
    assert len(pubs(s.take())) == 1


def test_inflight_window_and_queue_drop_policy():
    net = Net(mqtt={"max_inflight": 2, "max_offline_messages": 2, "offline_drop": "oldest"})
    s, p = net.client(), net.client()
    s.connect("s")
    s.subscribe(("t", 1))
    p.connect("p")
    for i in range(6):
        p.send(Publish("t", b"%d" % i, 1, False, False, i + 1))
    got = s.take()
    assert [m.payload for m in got] == [b"0", b"1"]  # window of 2
    assert net.broker.pub_dropped == 2  # 2..5 queued into 2 slots: 2 and 3 dropped
    s.send(Puback(got[0].packet_id), Puback(got[1].packet_id))
    assert [m.payload for m in s.take()] == [b"4", b"5"]
    net.advance(1000)  # the sweep logs the drops and resets the unreported count
    assert net.broker.sessions["s"].dropped_unreported == 0


def test_session_expiry():
    net = Net(mqtt={"session_expiry": "10s"})
    s = net.client()
    s.connect("s", clean=False)
    s.subscribe(("t", 1))
    s.drop()
    net.advance(5000)
    assert "s" in net.broker.sessions
    net.advance(6000)
    assert "s" not in net.broker.sessions and net.broker.subscription_count == 0


# -- takeover, keepalive, timeouts, bad input ------------------------------------------------------


def test_takeover_closes_old_and_publishes_its_will(net):
    w = net.client()
    w.connect("w")
    w.subscribe(("will/#", 0))
    old = net.client()
    old.connect("dup", clean=False, will=Will("will/dup", b"bye", 0, False))
    old.subscribe(("t", 1))
    new = net.client()
    assert new.connect("dup", clean=False) == Connack(True, 0)
    assert old.closed and not new.closed
    assert pubs(w.take()) == [("will/dup", b"bye", 0, False, False)]
    assert net.broker.sessions["dup"].conn is new.conn
    assert net.broker.clients_connected == 2


def test_takeover_flapping_is_throttled():
    net = Net(mqtt={"takeover_limit": 2, "takeover_window": "10s"})
    current = net.client()
    current.connect("x")
    for _ in range(2):
        nxt = net.client()
        assert nxt.connect("x").return_code == 0
        assert current.closed
        current = nxt
    refused = net.client()
    assert refused.connect("x") == Connack(False, 3)
    assert refused.closed and not current.closed
    net.advance(11_000)
    again = net.client()
    assert again.connect("x").return_code == 0


def test_keepalive_expiry_publishes_will():
    net = Net()
    w = net.client()
    w.connect("w", keepalive=0)
    w.subscribe(("will", 0))
    c = net.client()
    c.connect("c", keepalive=2, will=Will("will", b"dead", 0, False))
    net.advance(2000)
    c.send(Pingreq())  # activity moves the deadline
    net.advance(2000)
    assert not c.closed
    net.advance(2000)  # 3 s (1.5 x 2 s) after the last packet, plus wheel granularity
    assert c.closed
    assert pubs(w.take()) == [("will", b"dead", 0, False, False)]
    assert not w.closed  # keepalive 0: never expires


def test_connect_timeout():
    net = Net(mqtt={"connect_timeout": "2s"})
    c = net.client()
    net.advance(1000)
    assert not c.closed
    net.advance(2000)
    assert c.closed


def test_malformed_packet_closes_only_that_connection(net):
    w, bad, good = net.client(), net.client(), net.client()
    w.connect("w")
    w.subscribe(("will", 0), ("t", 0))
    bad.connect("bad", will=Will("will", b"x", 0, False))
    good.connect("good")
    bad.send_raw(b"\x30\x03\x00\x05a")  # PUBLISH whose topic length runs past the packet end
    assert bad.closed and bad.conn.state is ERROR
    assert pubs(w.take()) == [("will", b"x", 0, False, False)]
    good.send(Publish("t", b"ok", 0))
    assert pubs(w.take()) == [("t", b"ok", 0, False, False)]
    assert net.broker.protocol_errors == 1


def test_packets_before_the_bad_one_are_handled(net):
    s = net.client()
    s.connect("s")
    s.subscribe(("t", 0))
    c = net.client()
    c.send_raw(encode(Connect("c")) + encode(Publish("t", b"first", 0)) + b"\xf0\x00")
    assert pubs(s.take()) == [("t", b"first", 0, False, False)]
    assert c.closed


def test_oversize_packet_closes_connection():
    net = Net(mqtt={"max_packet_size": "1KiB"})
    c = net.client()
    c.connect("c")
    c.send_raw(b"\x30\xff\xff\x03")  # announces ~64 KiB
    assert c.closed


def test_server_to_client_packet_is_a_protocol_error(net):
    c = net.client()
    c.connect("c")
    c.send(Pingresp())
    assert c.closed


def test_shutdown_does_not_publish_wills(net):
    w, c = net.client(), net.client()
    w.connect("w")
    w.subscribe(("will", 0))
    c.connect("c", will=Will("will", b"x", 0, False))
    assert net.broker.shutdown() == 2
    net.pump()
    assert w.closed and c.closed and pubs(w.take()) == []


# -- hooks for the fanout layer --------------------------------------------------------------------


def test_hook_events_connect_subscribe_heartbeat_disconnect():
    hooks = RecordingHooks()
    net = Net(hooks=hooks)
    v = net.client()
    v.connect("VIN1", clean=False)
    v.subscribe(("agent/VIN1/#", 1))
    v.send(Publish("ecp/VIN1/heartbeat", b"hb", 0))
    v.send(Unsubscribe(2, ("agent/VIN1/#",)))
    v.drop()
    ev = hooks.take()
    kinds = [type(e) for e in ev]
    assert kinds == [ClientConnected, Subscribed, Heartbeat, Unsubscribed, ClientDisconnected]
    assert ev[0].client_id == "VIN1" and ev[0].session_present is False and ev[0].generation > 0
    assert ev[1].filters == (("agent/VIN1/#", 1),)
    assert ev[2].topic == "ecp/VIN1/heartbeat" and ev[2].payload == b"hb"
    assert ev[4].reason == "connection lost" and ev[4].session_kept


def test_events_are_delivered_in_batches_at_flush():
    hooks = RecordingHooks()
    net = Net(hooks=hooks)
    c = net.client()
    net.broker.data_received(c.conn, encode(Connect("a")) + encode(Publish("ecp/a/1", b"", 0)) + encode(Publish("ecp/a/2", b"", 0)), net.now)
    assert hooks.events == []
    net.pump()
    assert [type(e) for e in hooks.events] == [ClientConnected, Heartbeat, Heartbeat]


def test_deferred_puback_for_ingest():
    hooks = RecordingHooks(intercept_ingest=True)
    net = Net(hooks=hooks)
    s, p = net.client(), net.client()
    s.connect("s", username="platform", password=b"platform")
    s.subscribe(("$SDV-FANOUT/#", 1))
    p.connect("plat", username="platform", password=b"platform")
    hooks.take()
    p.send(Publish("$SDV-FANOUT/trigger", b"{}", 1, False, False, 11))
    assert p.take() == [] and s.take() == []  # not acked, not routed
    (t,) = hooks.take(IngestTicket)
    assert (t.client_id, t.packet_id, t.topic, t.qos) == ("plat", 11, "$SDV-FANOUT/trigger", 1)
    p.send(Publish("$SDV-FANOUT/trigger", b"{}", 1, False, True, 11))  # DUP while pending: ignored
    assert hooks.take(IngestTicket) == []
    assert net.broker.complete_publish("plat", 11, t.generation + 1) is False  # other generation
    assert net.broker.complete_publish("plat", 11, t.generation) is True
    net.pump()
    assert p.take() == [Puback(11)]
    assert net.broker.complete_publish("plat", 11, t.generation) is False  # not pending any more


def test_deferred_pubrec_for_qos2_ingest():
    hooks = RecordingHooks(intercept_ingest=True)
    net = Net(hooks=hooks)
    p = net.client()
    p.connect("plat", username="platform", password=b"platform")
    p.send(Publish("$SDV-FANOUT/data/d1", b"blob", 2, False, False, 3))
    (t,) = hooks.take(IngestTicket)
    net.broker.complete_publish(t.client_id, t.packet_id, t.generation)
    net.pump()
    assert p.take() == [Pubrec(3)]
    p.send(Publish("$SDV-FANOUT/data/d1", b"blob", 2, False, True, 3))  # resend before PUBREL
    assert p.take() == [Pubrec(3)] and hooks.take(IngestTicket) == []
    p.send(Pubrel(3))
    assert p.take() == [Pubcomp(3)]


def test_reject_publishes_error_and_closes():
    hooks = RecordingHooks(intercept_ingest=True)
    net = Net(hooks=hooks)
    p = net.client()
    p.connect("plat", username="platform", password=b"platform")
    assert p.subscribe(("$SDV-FANOUT/errors/plat", 1)) == (1,)
    p.send(Publish("$SDV-FANOUT/trigger", b"not json", 1, False, False, 4))
    (t,) = hooks.take(IngestTicket)
    assert net.broker.reject_publish(t.client_id, t.packet_id, "trigger is not JSON", t.generation)
    net.pump()
    (err,) = [m for m in p.take() if isinstance(m, Publish)]
    assert err.topic == "$SDV-FANOUT/errors/plat"
    body = json.loads(err.payload)
    assert body["error"] == "trigger is not JSON" and body["packet_id"] == 4
    assert p.closed
    assert hooks.take(ClientDisconnected)[0].reason == "rejected"


def test_deliver_with_tag_and_ack_event():
    hooks = RecordingHooks()
    net = Net(hooks=hooks)
    v = net.client()
    v.connect("VIN1", clean=False)
    v.subscribe(("agent/VIN1/#", 1))
    b = net.broker
    assert b.deliver("VIN2", "agent/VIN2/x", b"") is DeliverStatus.NOT_CONNECTED
    assert b.deliver("VIN1", "other/x", b"") is DeliverStatus.NOT_SUBSCRIBED
    assert b.deliver("VIN1", "agent/VIN1/proxy/request/r1", b"blob", 1, tag=("VIN1", "r1")) is DeliverStatus.SENT
    net.pump()
    (m,) = v.take()
    assert (m.topic, m.payload, m.qos) == ("agent/VIN1/proxy/request/r1", b"blob", 1)
    hooks.take()
    v.send(Puback(m.packet_id))
    assert hooks.take() == [Delivered("VIN1", ("VIN1", "r1"), 1)]


def test_unacked_tag_resent_with_dup_is_reported_on_resume():
    hooks = RecordingHooks()
    net = Net(hooks=hooks)
    v = net.client()
    v.connect("VIN1", clean=False)
    v.subscribe(("agent/VIN1/#", 1))
    net.broker.deliver("VIN1", "agent/VIN1/proxy/request/r1", b"blob", tag="r1")
    net.pump()
    v.drop()
    assert hooks.take(ClientDisconnected)[0].unacked_tags == ("r1",)
    v = net.client()
    v.connect("VIN1", clean=False)
    (m,) = v.take()
    assert m.dup is True
    ev = hooks.take(ClientConnected)[-1]
    assert ev.session_present and ev.resent_tags == ("r1",)


def test_deliver_downgrades_to_granted_qos0():
    hooks = RecordingHooks()
    net = Net(hooks=hooks)
    v = net.client()
    v.connect("V")
    v.subscribe(("agent/V/#", 0))
    hooks.take()
    assert net.broker.deliver("V", "agent/V/r", b"x", 1, tag="t") is DeliverStatus.SENT
    net.pump()
    assert v.take()[0].qos == 0
    assert hooks.take() == [Delivered("V", "t", 0)]


def test_deliver_queue_full_reports_dropped_tag():
    hooks = RecordingHooks()
    net = Net(hooks=hooks, mqtt={"max_inflight": 1, "max_offline_messages": 1, "offline_drop": "newest"})
    v = net.client()
    v.connect("V")
    v.subscribe(("a/#", 1))
    b = net.broker
    assert b.deliver("V", "a/1", b"", tag=1) is DeliverStatus.SENT
    assert b.deliver("V", "a/2", b"", tag=2) is DeliverStatus.QUEUED
    assert b.deliver("V", "a/3", b"", tag=3) is DeliverStatus.DROPPED
    net.pump()
    assert DeliveryDropped("V", 3) in hooks.take()


def test_publish_local_route_filters_and_forwarding():
    hooks = RecordingHooks(forward_publishes=True)
    net = Net(hooks=hooks)
    s, p = net.client(), net.client()
    s.connect("s")
    s.subscribe(("x/+", 1), ("y", 0))
    assert sorted(net.broker.route_filters()) == ["x/+", "y"]
    hooks.take()
    assert net.broker.publish_local("x/1", b"remote", 1) == 1
    net.pump()
    assert pubs(s.take()) == [("x/1", b"remote", 1, False, False)]
    assert hooks.take() == []  # forwarded messages are not forwarded again
    p.connect("p")
    p.send(Publish("y", b"local", 0))
    assert [e for e in hooks.take() if isinstance(e, LocalPublish)] == [LocalPublish("p", "y", b"local", 0, False)]


def test_kick(net):
    c = net.client()
    c.connect("c")
    assert net.broker.kick("c", "taken over on node 2")
    net.pump()
    assert c.closed
    assert net.broker.kick("c") is False


def test_flush_coalesces_output_per_connection(net):
    s, p = net.client(), net.client()
    s.connect("s")
    p.connect("p")
    s.subscribe(("t", 0))
    for i in range(5):
        net.broker.data_received(p.conn, encode(Publish("t", b"%d" % i, 0)), net.now)
    out = net.broker.flush()
    assert [c.client_id for c, _ in out] == ["s"]
    assert len(PacketReader().feed(out[0][1])) == 5


def test_fanout_to_many_subscribers_each_gets_own_packet_ids(net):
    subs = []
    for k in range(6):
        s = net.client()
        s.connect(f"s{k}")
        s.subscribe(("many/+", k % 3))
        subs.append(s)
    # make packet ids differ between sessions
    net.broker.sessions["s1"].last_pid = 500
    net.broker.sessions["s4"].last_pid = 0xFFFF
    p = net.client()
    p.connect("p")
    p.send(Publish("many/x", b"payload", 2, False, False, 1), Publish("many/y", b"", 1, False, False, 2))
    for k, s in enumerate(subs):
        got = s.take()
        assert [(m.topic, m.payload, m.qos) for m in got] == [("many/x", b"payload", k % 3), ("many/y", b"", min(1, k % 3))]
        if k == 1:
            assert [m.packet_id for m in got] == [501, 502]
        if k == 4:
            assert [m.packet_id for m in got] == [1, 2]  # wrapped past 65535


def test_second_connect_then_garbage_in_one_chunk(net):
    c = net.client()
    c.connect("a")
    c.send_raw(encode(Pingreq()) + encode(Connect("a")) + b"\x00\x00")
    assert c.take() == [Pingresp()]
    assert c.closed and net.broker.clients_connected == 0


def test_connect_and_garbage_in_one_chunk(net):
    c = net.client()
    c.send_raw(encode(Connect("a")) + encode(Pingreq()) + b"\x00\x00")
    assert c.take() == [Connack(False, 0), Pingresp()]
    assert c.closed and net.broker.clients_connected == 0


# -- building blocks: Connection, DeadlineWheel, RetainedStore, SysStats hooks ----------------------


def test_connection_state_machine():
    from fanout.mqtt.connection import CONNECTING, Connection
    from fanout.mqtt.errors import NotConnectFirst, PacketTooLarge, ProtocolError

    c = Connection(1024)
    assert c.state is CONNECTING
    data = encode(Connect("a")) + encode(Pingreq())
    assert c.receive_data(data[:5]) == []
    assert c.receive_data(data[5:]) == [Connect("a")]  # only the CONNECT while CONNECTING
    assert c.buffered == 2  # the PINGREQ waits, undecoded
    assert c.receive_data(encode(Pingreq())) == [] and c.buffered == 4  # authentication still running
    assert c.send(Connack(False, 0)) == b"\x20\x02\x00\x00" and c.state is CONNECTED
    assert c.receive_data(b"") == [Pingreq(), Pingreq()]
    with pytest.raises(ProtocolError) as exc:
        c.receive_data(encode(Pingreq()) + encode(Connect("a")))
    assert exc.value.packets == [Pingreq()] and c.state is ERROR
    assert c.receive_data(encode(Pingreq())) == []  # ignored once failed
    c2 = Connection(1024)
    with pytest.raises(NotConnectFirst, match="MQTT-3.1.0-1"):
        c2.receive_data(b"\x30")  # refused at the first byte of a PUBLISH
    assert c2.state is ERROR
    c3 = Connection(1 << 20, max_connect_size=64)
    with pytest.raises(PacketTooLarge):
        c3.receive_data(b"\x10\x41")  # a CONNECT header announcing 65 bytes, over the CONNECT cap
    c3b = Connection(64)  # after CONNACK, a packet over max_packet_size
    c3b.receive_data(encode(Connect("a")) + b"\x30\xff\x01")
    c3b.send(Connack(False, 0))
    with pytest.raises(PacketTooLarge):
        c3b.receive_data(b"")
    assert c3b.connect_seen
    c3c = Connection(1 << 20, max_connect_size=64)  # the connected limit applies after CONNACK
    c3c.receive_data(encode(Connect("a")) + encode(Publish("t", b"x" * 1000)))
    c3c.send(Connack(False, 0))
    assert c3c.receive_data(b"") == [Publish("t", b"x" * 1000)]
    c4 = Connection(1024)
    c4.receive_data(encode(Connect("b")))
    assert c4.send(Connack(False, 5)) and c4.state is CLOSED
    with pytest.raises(ProtocolError):
        c4.send(Pingresp())
    assert c4.close("x") is True and c4.close("y") is False and c4.close_reason == "x"


def test_deadline_wheel():
    from fanout.mqtt.deadlines import DeadlineWheel

    class Obj:
        wheel_slot = -1

    w = DeadlineWheel(1000)
    a, b, c = Obj(), Obj(), Obj()
    w.schedule(a, 1500)
    w.schedule(b, 2500)
    w.schedule(c, 1200)
    w.schedule(c, 3000)  # moved: the old entry becomes stale
    assert w.due(1999) == []  # never early: a (1500) fires with the bucket ending at 2000
    assert w.due(2000) == [a]
    assert w.due(2999) == []
    assert w.due(3000) == [b, c]  # c once: its stale entry in bucket 2 was skipped
    w.schedule(c, 4000)
    w.cancel(c)
    assert w.due(10_000) == []
    w.schedule(a, 5000)  # already past: fires at the next bucket boundary (at most one resolution late)
    assert w.due(10_999) == []
    assert w.due(11_000) == [a]
    w.schedule(b, 10 ** 9)
    assert w.due(10 ** 9 + 1000) == [b]  # a long gap visits only existing buckets


def test_retained_store():
    from fanout.mqtt.retained import RetainedStore

    r = RetainedStore()
    r.set("a/b", b"1", 1)
    r.set("$SYS/x", b"2", 0)
    r.set("a/c", b"3", 2)
    assert list(r.matching("a/b")) == [("a/b", b"1", 1)]
    assert [t for t, *_ in r.matching("a/+")] == ["a/b", "a/c"]
    assert [t for t, *_ in r.matching("#")] == ["a/b", "a/c"]  # not $SYS (MQTT-4.7.2-1)
    assert [t for t, *_ in r.matching("$SYS/#")] == ["$SYS/x"]
    r.set("a/b", b"", 0)
    assert "a/b" not in r and len(r) == 2


def test_sys_stats_sources_listeners_and_changed_only():
    net = Net(mqtt={"sys_interval": "1s"})
    snaps = []
    net.broker.sys.add_source(lambda: {"$SYS/fanout/pending": 7})
    net.broker.sys.add_listener(snaps.append)
    net.broker.sys.add_source(lambda: 1 / 0)  # a broken hook is logged, not fatal
    s = net.client()
    s.connect("s")
    s.subscribe(("$SYS/#", 0))
    net.advance(1000)
    first = {t: v for t, v, *_ in pubs(s.take())}
    assert first["$SYS/fanout/pending"] == b"7" and "$SYS/broker/uptime" in first
    assert snaps and snaps[-1]["$SYS/fanout/pending"] == 7
    net.advance(1000)
    second = {t for t, *_ in pubs(s.take())}
    assert "$SYS/fanout/pending" not in second  # unchanged values are not republished
    assert "$SYS/broker/uptime" in second


def test_failing_hook_does_not_lose_output():
    class Broken(RecordingHooks):
        def on_events(self, events):
            raise RuntimeError("boom")

    net = Net(hooks=Broken())
    c = net.client()
    assert c.connect("a") == Connack(False, 0)


def test_deliver_of_a_tag_the_session_holds_sends_nothing_again():
    """A second deliver of a tag the session already holds (in flight or queued) sends no second copy: a
    dispatcher's deliver call that ran twice (its reply lost on the direct channel, then made again over Ray;
    or a restarted dispatcher resending a row) must not put two copies of a row towards one vehicle."""
    hooks = RecordingHooks()
    net = Net(hooks=hooks, mqtt={"max_inflight": 1})
    v = net.client()
    v.connect("V", clean=False)
    v.subscribe(("agent/V/#", 1))
    b = net.broker
    assert b.deliver("V", "agent/V/r1", b"one", tag=b"k1", unique=True) is DeliverStatus.SENT
    assert b.deliver("V", "agent/V/r1", b"one", tag=b"k1", unique=True) is DeliverStatus.SENT  # in flight: not again
    assert b.deliver("V", "agent/V/r2", b"two", tag=b"k2", unique=True) is DeliverStatus.QUEUED
    assert b.deliver("V", "agent/V/r2", b"two", tag=b"k2", unique=True) is DeliverStatus.QUEUED  # queued: not again
    net.pump()
    first = v.take()
    assert [m.payload for m in first] == [b"one"]
    hooks.take()
    v.send(Puback(first[0].packet_id))
    net.pump()
    second = v.take()
    assert [m.payload for m in second] == [b"two"]
    v.send(Puback(second[0].packet_id))
    net.pump()
    assert v.take() == []  # no second copy of either
    assert [e.tag for e in hooks.take(Delivered)] == [b"k1", b"k2"]
    assert b.deliver("V", "agent/V/r1", b"one", tag=b"k1", unique=True) is DeliverStatus.SENT  # acknowledged: a new delivery
    net.pump()
    assert len(v.take()) == 1
    # without unique (other callers' tags, e.g. consumer groups' windows of hundreds): no scan, a copy each
    assert b.deliver("V", "agent/V/r3", b"x", tag=b"k3") is DeliverStatus.QUEUED
    # no tag: nothing to tell copies apart by (untagged messages all carry None), so every one is handed over
    b.publish_local("agent/V/plain", b"p", 1)
    queued = len(b.session_of("V").queue)
    assert b.deliver("V", "agent/V/r4", b"y", unique=True) is DeliverStatus.QUEUED
    assert len(b.session_of("V").queue) == queued + 1
