"""MQTT semantics over real TCP with paho-mqtt 2.x (MQTT 3.1.1) as the client."""
from __future__ import annotations

import time

import paho.mqtt.client as mqtt
import pytest

from fanout.mqtt.packets import Will

from .conftest import TIMEOUT, wait_for

pytestmark = pytest.mark.timeout(60)


def test_publish_subscribe_qos_downgrade(broker, paho_client):
    sub, pub = paho_client("sub"), paho_client("pub")
    sub.connect(broker.port)
    pub.connect(broker.port)
    assert sub.subscribe(("down/0", 0), ("down/1", 1), ("down/2", 2)) == [0, 1, 2]
    pub.publish("down/0", b"a", qos=2)
    pub.publish("down/1", b"b", qos=2)
    pub.publish("down/2", b"c", qos=1)
    got = {m.topic: (m.payload, m.qos, m.retain) for m in (sub.get(), sub.get(), sub.get())}
    assert got == {"down/0": (b"a", 0, False), "down/1": (b"b", 1, False), "down/2": (b"c", 1, False)}


def test_qos2_end_to_end(broker, paho_client):
    sub, pub = paho_client(), paho_client()
    sub.connect(broker.port)
    pub.connect(broker.port)
    sub.subscribe(("q2", 2))
    for i in range(20):
        pub.publish("q2", b"%d" % i, qos=2)
    assert [sub.get().payload for _ in range(20)] == [b"%d" % i for i in range(20)]
    wait_for(lambda: broker.call(lambda: not broker.broker.sessions[sub.client._client_id.decode()].inflight),
             what="QoS 2 exchanges completed")


def test_will_on_killed_socket(broker, paho_client, raw_client):
    watcher = paho_client()
    watcher.connect(broker.port)
    watcher.subscribe(("wills/#", 1))
    dying = raw_client(broker)
    assert dying.connect("dying", will=Will("wills/dying", b"lost", 1, False)).return_code == 0
    dying.kill()
    msg = watcher.get()
    assert (msg.topic, msg.payload, msg.qos) == ("wills/dying", b"lost", 1)


def test_will_on_keepalive_expiry(broker, paho_client):
    watcher = paho_client()
    watcher.connect(broker.port)
    watcher.subscribe(("wills/#", 0))
    silent = paho_client("silent")
    silent.client.will_set("wills/silent", b"timeout", 0)
    silent.connect(broker.port, keepalive=1)
    silent.client.loop_stop()  # the network thread stops: no more PINGREQ, socket stays open
    t0 = time.monotonic()
    msg = watcher.get(timeout=5)
    assert (msg.topic, msg.payload) == ("wills/silent", b"timeout")
    assert 1.4 < time.monotonic() - t0 < 4.5  # 1.5 x keepalive, plus sweep granularity and a busy machine


def test_keepalive_respected_by_pinging_client(broker, paho_client):
    c = paho_client()
    c.connect(broker.port, keepalive=1)
    time.sleep(2.2)  # paho pings every second: the connection must survive
    assert c.disconnects.empty()
    c.subscribe(("alive", 0))


def test_no_will_on_clean_disconnect(broker, paho_client):
    watcher = paho_client()
    watcher.connect(broker.port)
    watcher.subscribe(("wills/#", 0))
    c = paho_client()
    c.client.will_set("wills/clean", b"x", 0)
    c.connect(broker.port)
    c.client.disconnect()
    watcher.expect_nothing(0.5)


def test_offline_queue_with_session_present(broker, paho_client):
    sub = paho_client("persistent", clean_session=False)
    assert sub.connect(broker.port) == (False, 0)
    sub.subscribe(("offline/#", 1))
    sub.close()
    pub = paho_client()
    pub.connect(broker.port)
    for i in range(5):
        pub.publish("offline/x", b"%d" % i, qos=1)
    pub.publish("offline/x", b"qos0 not queued", qos=0)
    again = paho_client("persistent", clean_session=False)
    assert again.connect(broker.port) == (True, 0)
    assert [again.get().payload for _ in range(5)] == [b"%d" % i for i in range(5)]
    again.expect_nothing(0.3)


def test_clean_session_discards(broker, paho_client):
    sub = paho_client("c1", clean_session=False)
    sub.connect(broker.port)
    sub.subscribe(("gone/#", 1))
    sub.close()
    clean = paho_client("c1", clean_session=True)
    assert clean.connect(broker.port) == (False, 0)
    clean.close()
    again = paho_client("c1", clean_session=False)
    assert again.connect(broker.port) == (False, 0)


def test_takeover_closes_old_keeps_new(broker, paho_client):
    watcher = paho_client()
    watcher.connect(broker.port)
    watcher.subscribe(("wills/#", 0))
    old = paho_client("same-id")
    old.client.will_set("wills/same-id", b"taken over", 0)
    old.connect(broker.port)
    new = paho_client("same-id")
    new.connect(broker.port)
    old.disconnects.get(timeout=TIMEOUT)  # the OLD connection is closed
    assert watcher.get().payload == b"taken over"  # its will is published (documented decision)
    assert new.subscribe(("still/here", 1)) == [1]
    assert new.disconnects.empty()


def test_retained_set_replay_clear(broker, paho_client):
    pub = paho_client()
    pub.connect(broker.port)
    pub.publish("ret/a", b"kept", qos=1, retain=True)
    sub = paho_client()
    sub.connect(broker.port)
    sub.subscribe(("ret/#", 1))
    m = sub.get()
    assert (m.topic, m.payload, m.retain, m.qos) == ("ret/a", b"kept", True, 1)
    pub.publish("ret/a", b"live", qos=1, retain=True)
    m = sub.get()
    assert (m.payload, m.retain) == (b"live", False)  # forwarded to a live subscriber: RETAIN=0
    pub.publish("ret/a", b"", qos=0, retain=True)  # clear
    assert sub.get().payload == b""
    late = paho_client()
    late.connect(broker.port)
    late.subscribe(("ret/#", 1))
    late.expect_nothing(0.3)


def test_sys_not_matched_by_hash(start_broker, paho_client):
    rb = start_broker(mqtt={"sys_interval": "200ms"})
    everything, sys_reader = paho_client(), paho_client()
    everything.connect(rb.port)
    everything.subscribe(("#", 0), ("+/broker/#", 0))
    sys_reader.connect(rb.port)
    sys_reader.subscribe(("$SYS/#", 0))
    wanted = {"$SYS/broker/version", "$SYS/broker/uptime", "$SYS/broker/clients/connected",
              "$SYS/broker/clients/total", "$SYS/broker/clients/maximum", "$SYS/broker/clients/disconnected",
              "$SYS/broker/messages/received", "$SYS/broker/messages/sent", "$SYS/broker/bytes/received",
              "$SYS/broker/bytes/sent", "$SYS/broker/publish/messages/dropped", "$SYS/broker/heap/current",
              "$SYS/broker/subscriptions/count", "$SYS/broker/retained messages/count"}
    seen: dict[str, bytes] = {}
    deadline = time.monotonic() + 3
    while not wanted <= set(seen):
        m = sys_reader.get(timeout=max(0.01, deadline - time.monotonic()))
        seen[m.topic] = m.payload
    assert seen["$SYS/broker/version"].startswith(b"sdv-fanout")
    everything.expect_nothing(0.5)


def test_overlapping_subscriptions_once_at_max_qos(broker, paho_client):
    sub, pub = paho_client(), paho_client()
    sub.connect(broker.port)
    pub.connect(broker.port)
    assert sub.subscribe(("ov/#", 0), ("ov/+", 1), ("ov/x", 2)) == [0, 1, 2]
    pub.publish("ov/x", b"once", qos=2)
    m = sub.get()
    assert (m.payload, m.qos) == (b"once", 2)
    sub.expect_nothing(0.3)


def test_bad_credentials(start_broker, paho_client):
    rb = start_broker(users={"alice": ("secret", "client")})
    c = paho_client()
    c.client.username_pw_set("alice", "wrong")
    c.connect(rb.port, expect_rc=4)
    ok = paho_client()
    ok.client.username_pw_set("alice", "secret")
    ok.connect(rb.port)


def test_not_authorised(start_broker, paho_client):
    rb = start_broker(mqtt={"anonymous_role": "none"})
    paho_client().connect(rb.port, expect_rc=5)


def test_bad_protocol_level(broker, paho_client):
    old = paho_client(protocol=mqtt.MQTTv31)  # "MQIsdp" level 3
    old.connect(broker.port, expect_rc=1)


def test_zero_length_client_id_with_clean_session(broker, paho_client):
    a, b = paho_client(""), paho_client("")
    a.connect(broker.port)
    b.connect(broker.port)
    ids = broker.call(lambda: sorted(broker.broker.sessions))
    assert len([i for i in ids if i.startswith("auto-")]) == 2


def test_acl_subscribe_refused(start_broker, paho_client):
    rb = start_broker(acl=[{"action": "subscribe", "topic": "test/nosubscribe", "allow": False}])
    c = paho_client()
    c.connect(rb.port)
    assert c.subscribe(("test/nosubscribe", 1), ("test/ok", 1)) == [0x80, 1]


def test_publish_denied_is_acked_not_delivered(broker, paho_client):
    plat = paho_client()
    plat.client.username_pw_set("platform", "platform")
    plat.connect(broker.port)
    plat.subscribe(("$SDV-FANOUT/#", 1))
    c = paho_client()
    c.connect(broker.port)
    c.publish("$SDV-FANOUT/trigger", b"{}", qos=1)  # wait_for_publish: the PUBACK came
    c.publish("$SYS/fake", b"x", qos=2)
    plat.expect_nothing(0.3)
    assert broker.call(lambda: broker.broker.pub_denied) == 2
    assert c.disconnects.empty()


def test_unsubscribe(broker, paho_client):
    sub, pub = paho_client(), paho_client()
    sub.connect(broker.port)
    pub.connect(broker.port)
    sub.subscribe(("un/x", 1))
    pub.publish("un/x", b"1", qos=1)
    assert sub.get().payload == b"1"
    sub.client.unsubscribe(["un/x", "never/subscribed"])
    sub.unsubacks.get(timeout=TIMEOUT)
    pub.publish("un/x", b"2", qos=1)
    sub.expect_nothing(0.3)


def test_many_messages_in_order(broker, paho_client):
    sub, pub = paho_client(), paho_client()
    sub.connect(broker.port)
    pub.connect(broker.port)
    sub.subscribe(("bulk", 1))
    n = 500
    infos = [pub.client.publish("bulk", b"%d" % i, 1) for i in range(n)]
    for info in infos:
        info.wait_for_publish(TIMEOUT)
    assert [sub.get().payload for _ in range(n)] == [b"%d" % i for i in range(n)]
