"""The broker speaking MQTT 5 with third-party clients over real TCP on 127.0.0.1: paho-mqtt
(``protocol=MQTTv5``), ``mosquitto_pub``/``mosquitto_sub -V mqttv5`` (Debian mosquitto-clients) and MQTT.js
(Debian node-mqtt run by nodejs). Every broker and client process a test starts is stopped by it.
"""
from __future__ import annotations

import contextlib
import json
import os
import queue
import shutil
import subprocess
import time
import uuid
from pathlib import Path
from typing import Any, Iterator

import paho.mqtt.client as mqtt
import pytest
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties
from paho.mqtt.subscribeoptions import SubscribeOptions

from tests.integration.conftest import HOST, TIMEOUT, PahoClient, wait_for

NODE_PATH = "/usr/share/nodejs"
needs_mosquitto = pytest.mark.skipif(shutil.which("mosquitto_sub") is None, reason="mosquitto-clients not installed (make mosquitto)")
needs_node = pytest.mark.skipif(shutil.which("node") is None or not Path(NODE_PATH, "mqtt").is_dir(),
                                reason="nodejs + node-mqtt not installed (make nodemqtt)")


class Paho5(PahoClient):
    """A paho-mqtt 2.x client speaking MQTT 5, recording what it receives (``get``, ``expect_nothing`` and
    ``close`` are the 3.1.1 client's; paho takes no clean-session flag for MQTT 5, hence its own set-up)."""

    def __init__(self, client_id: str | None = None) -> None:  # noqa: D107 - PahoClient.__init__ not called
        self.client_id = client_id if client_id is not None else f"p5-{uuid.uuid4().hex[:8]}"
        self.client = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2, client_id=self.client_id, protocol=mqtt.MQTTv5)
        self.client.reconnect_delay_set(10, 20)
        self.messages: queue.Queue = queue.Queue()
        self.connack: queue.Queue = queue.Queue()
        self.subacks: queue.Queue = queue.Queue()
        self.unsubacks: queue.Queue = queue.Queue()
        self.pubacks: queue.Queue = queue.Queue()
        self.disconnects: queue.Queue = queue.Queue()
        c = self.client
        c.on_connect = lambda cl, ud, flags, rc, props: self.connack.put((flags.session_present, rc.value, props))
        c.on_message = lambda cl, ud, msg: self.messages.put(msg)
        c.on_subscribe = lambda cl, ud, mid, rcs, props: self.subacks.put([r.value for r in rcs])
        c.on_unsubscribe = lambda cl, ud, mid, rcs, props: self.unsubacks.put([r.value for r in rcs])
        c.on_publish = lambda cl, ud, mid, rc, props: self.pubacks.put((mid, rc.value, props))
        self.last_ack_properties: Any = None  # the properties of the last PUBACK publish() waited for
        c.on_disconnect = lambda cl, ud, flags, rc, props: self.disconnects.put(rc.value)

    def connect(self, port: int, *, clean_start: bool = True, keepalive: int = 60, expect_rc: int = 0,
                properties: Properties | None = None) -> tuple[bool, Any]:
        self.client.connect(HOST, port, keepalive, clean_start=clean_start, properties=properties)
        self.client.loop_start()
        present, rc, props = self.connack.get(timeout=TIMEOUT)
        assert rc == expect_rc, f"CONNACK reason code {rc:#x}, expected {expect_rc:#x}"
        return present, props

    def subscribe(self, *subs: tuple[str, SubscribeOptions], sub_id: int | None = None) -> list[int]:
        props = None
        if sub_id is not None:
            props = Properties(PacketTypes.SUBSCRIBE)
            props.SubscriptionIdentifier = sub_id
        self.client.subscribe(list(subs), properties=props)
        return self.subacks.get(timeout=TIMEOUT)

    def publish(self, topic: str, payload: bytes, qos: int = 0, retain: bool = False,
                properties: Properties | None = None) -> int | None:
        """Publish; returns the PUBACK reason code for QoS 1 (None for QoS 0)."""
        info = self.client.publish(topic, payload, qos, retain, properties)
        info.wait_for_publish(TIMEOUT)
        if qos != 1:
            return None
        while True:  # QoS 0 publishes report through on_publish too: skip to this one
            mid, rc, props = self.pubacks.get(timeout=TIMEOUT)
            if mid == info.mid:
                self.last_ack_properties = props
                return rc


@pytest.fixture
def paho5() -> Iterator[Any]:
    clients: list[Paho5] = []

    def make(client_id: str | None = None) -> Paho5:
        c = Paho5(client_id)
        clients.append(c)
        return c

    try:
        yield make
    finally:
        for c in clients:
            c.close()


def opts(qos: int, **kw: Any) -> SubscribeOptions:
    return SubscribeOptions(qos=qos, **kw)


def pub_props(**values: Any) -> Properties:
    props = Properties(PacketTypes.PUBLISH)
    for k, v in values.items():
        setattr(props, k, v)
    return props


# -- paho-mqtt, protocol=MQTTv5 ----------------------------------------------------------------------


def test_paho5_connack_properties(start_broker, paho5):
    rb = start_broker(mqtt={"max_keepalive": "30s", "receive_maximum": 50, "topic_alias_maximum": 8})
    c = paho5("")
    present, props = c.connect(rb.port, keepalive=120)
    assert not present
    assert props.ReceiveMaximum == 50 and props.TopicAliasMaximum == 8
    assert props.ServerKeepAlive == 30
    assert props.AssignedClientIdentifier.startswith("auto-")
    assert props.SharedSubscriptionAvailable == 1 and props.SubscriptionIdentifierAvailable == 1
    assert props.WildcardSubscriptionAvailable == 1 and props.RetainAvailable == 1
    assert rb.call(lambda: rb.broker.state.v5_connected) == 1


def test_paho5_properties_forwarded_v5_and_v3(broker, paho5, paho_client):
    sub5 = paho5()
    sub5.connect(broker.port)
    assert sub5.subscribe(("req/#", opts(1))) == [1]
    sub3 = paho_client()
    sub3.connect(broker.port)
    sub3.subscribe(("req/#", 1))
    pub = paho5()
    pub.connect(broker.port)
    props = pub_props(PayloadFormatIndicator=1, ContentType="application/json", ResponseTopic="reply/1",
                      CorrelationData=b"\x00\x01", UserProperty=[("trace", "abc"), ("campaign", "7"), ("trace", "2")])
    assert pub.publish("req/a", b'{"x":1}', 1, properties=props) == 0
    got = sub5.get()
    p = got.properties
    assert (got.payload, p.ContentType, p.ResponseTopic, p.CorrelationData, p.PayloadFormatIndicator) == (
        b'{"x":1}', "application/json", "reply/1", b"\x00\x01", 1)
    assert p.UserProperty == [("trace", "abc"), ("campaign", "7"), ("trace", "2")]
    assert sub3.get().payload == b'{"x":1}'
    # from a 3.1.1 publisher to the MQTT 5 receiver
    pub3 = paho_client()
    pub3.connect(broker.port)
    pub3.publish("req/b", b"plain", 1)
    assert sub5.get().payload == b"plain"


def test_paho5_reason_codes(start_broker, paho5):
    rb = start_broker(acl=[{"action": "subscribe", "topic": "test/nosubscribe", "allow": False}])
    c = paho5()
    c.connect(rb.port)
    assert c.subscribe(("test/nosubscribe", opts(1)), ("ok/+", opts(2))) == [0x80, 2]  # as the Paho suite expects
    assert c.publish("nobody/listens", b"x", 1) == 0x10
    assert c.publish("$SYS/no", b"x", 1) == 0x87
    assert c.publish("ok/x", b"x", 1) == 0
    c.client.unsubscribe(["ok/+", "never"])
    assert c.unsubacks.get(timeout=TIMEOUT) == [0, 0x11]


def test_paho5_subscription_options_and_identifiers(broker, paho5):
    c = paho5()
    c.connect(broker.port)
    c.subscribe(("opt/own", opts(0, noLocal=True)))
    c.publish("opt/own", b"mine")
    c.expect_nothing()
    c.subscribe(("opt/id/+", opts(1)), sub_id=42)
    c.publish("opt/id/x", b"tagged", 1)
    got = c.get()
    assert got.properties.SubscriptionIdentifier == [42]
    pub = paho5()
    pub.connect(broker.port)
    pub.publish("opt/ret", b"kept", 1, retain=True)
    rap = paho5()
    rap.connect(broker.port)
    rap.subscribe(("opt/ret", opts(1, retainAsPublished=True)))
    assert rap.get().retain
    never = paho5()
    never.connect(broker.port)
    never.subscribe(("opt/ret", opts(1, retainHandling=SubscribeOptions.RETAIN_DO_NOT_SEND)))
    never.expect_nothing()
    pub.publish("opt/ret", b"live", 1, retain=True)
    assert rap.get().retain and not never.get().retain


def test_paho5_message_expiry(broker, paho5):
    sub = paho5("exp-sub")
    props = Properties(PacketTypes.CONNECT)
    props.SessionExpiryInterval = 300
    sub.connect(broker.port, clean_start=True, properties=props)
    sub.subscribe(("exp/t", opts(1)))
    sub.close()
    pub = paho5()
    pub.connect(broker.port)
    pub.publish("exp/t", b"short", 1, properties=pub_props(MessageExpiryInterval=1))
    pub.publish("exp/t", b"long", 1, properties=pub_props(MessageExpiryInterval=300))
    time.sleep(1.3)
    again = paho5("exp-sub")
    present, _ = again.connect(broker.port, clean_start=False, properties=props)
    assert present
    got = again.get()
    assert got.payload == b"long" and 290 <= got.properties.MessageExpiryInterval <= 300
    again.expect_nothing()


def test_paho5_shared_subscription(broker, paho5):
    members = []
    for _ in range(2):
        m = paho5()
        m.connect(broker.port)
        assert m.subscribe(("$share/workers/jobs/+", opts(1))) == [1]
        members.append(m)
    pub = paho5()
    pub.connect(broker.port)
    for i in range(6):
        pub.publish("jobs/x", b"%d" % i, 1)
    # Collected until all six came (not "until a member is quiet for 0.5 s": on a busy machine paho's network
    # thread may send the first publish later than that, and a member counted before it would miss its share).
    per_member: list[list[bytes]] = [[] for _ in members]
    deadline = time.monotonic() + TIMEOUT
    while sum(map(len, per_member)) < 6 and time.monotonic() < deadline:
        for got, m in zip(per_member, members):
            with contextlib.suppress(queue.Empty):
                got.append(m.get(timeout=0.05).payload)
    for m in members:
        m.expect_nothing()  # each message went to one member only
    assert sorted(sum(per_member, [])) == [b"%d" % i for i in range(6)] and all(per_member)


def test_paho5_takeover_reason_code_and_will_with_disconnect_0x04(broker, paho5):
    first = paho5("twin")
    first.connect(broker.port)
    second = paho5("twin")
    second.connect(broker.port)
    assert first.disconnects.get(timeout=TIMEOUT) == 0x8E
    watcher = paho5()
    watcher.connect(broker.port)
    watcher.subscribe(("will/#", opts(0)))
    w = paho5("willing")
    w.client.will_set("will/willing", b"gone", 0)
    w.connect(broker.port)
    w.client.disconnect(reasoncode=mqtt.ReasonCode(PacketTypes.DISCONNECT, identifier=4))
    assert watcher.get().payload == b"gone"


def test_paho5_topic_alias_from_client(broker, paho5):
    sub = paho5()
    sub.connect(broker.port)
    sub.subscribe(("alias/long/topic", opts(0)))
    pub = paho5()
    pub.connect(broker.port)
    pub.publish("alias/long/topic", b"1", properties=pub_props(TopicAlias=1))
    pub.publish("", b"2", properties=pub_props(TopicAlias=1))
    assert [sub.get().payload, sub.get().payload] == [b"1", b"2"]


def test_paho5_receive_maximum_and_packet_size_honoured(start_broker, paho5):
    rb = start_broker()
    sub = paho5("small")
    props = Properties(PacketTypes.CONNECT)
    props.MaximumPacketSize = 200
    props.ReceiveMaximum = 1
    sub.connect(rb.port, properties=props)
    sub.subscribe(("big/+", opts(1)))
    assert rb.call(lambda: rb.broker.session_of("small").inflight_cap) == 1
    pub = paho5()
    pub.connect(rb.port)
    pub.publish("big/x", b"y" * 1000, 1)
    pub.publish("big/x", b"fits", 1)
    assert sub.get().payload == b"fits"
    sub.expect_nothing()
    assert rb.call(lambda: rb.broker.state.too_large_dropped) == 1


# -- mosquitto_pub / mosquitto_sub -V mqttv5 ---------------------------------------------------------


@contextlib.contextmanager
def mosquitto_sub(port: int, *args: str) -> Iterator[subprocess.Popen]:
    proc = subprocess.Popen(["mosquitto_sub", "-V", "mqttv5", "-h", HOST, "-p", str(port), *args],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        yield proc
    finally:
        if proc.poll() is None:
            proc.terminate()
        proc.wait(5)
        for f in (proc.stdout, proc.stderr):
            if f is not None:
                f.close()


def mosquitto_pub(port: int, *args: str) -> None:
    subprocess.run(["mosquitto_pub", "-V", "mqttv5", "-h", HOST, "-p", str(port), *args],
                   check=True, timeout=TIMEOUT, capture_output=True)


@needs_mosquitto
def test_mosquitto_clients_v5_properties(broker):
    with mosquitto_sub(broker.port, "-t", "mq/#", "-q", "1", "-C", "1", "-W", "5", "-i", "msub",
                       "-F", "%t|%p|%C|%R|%P|%S", "-D", "subscribe", "subscription-identifier", "5") as sub:
        wait_for(lambda: broker.call(lambda: "msub" in broker.broker.sessions and
                                     bool(broker.broker.session_of("msub").subs)), what="mosquitto_sub subscribed")
        mosquitto_pub(broker.port, "-t", "mq/a", "-m", "hello", "-q", "1",
                      "-D", "publish", "content-type", "text/plain",
                      "-D", "publish", "response-topic", "mq/reply",
                      "-D", "publish", "user-property", "trace", "t1")
        out, err = sub.communicate(timeout=TIMEOUT + 2)
    assert out.strip() == "mq/a|hello|text/plain|mq/reply|trace:t1|5", err


@needs_mosquitto
def test_mosquitto_clients_v5_no_local_and_expiry(broker):
    with mosquitto_sub(broker.port, "-t", "ex/#", "-q", "1", "-C", "1", "-W", "5", "-i", "esub",
                       "-F", "%t|%p|%E") as sub:
        wait_for(lambda: broker.call(lambda: bool(getattr(broker.broker.session_of("esub"), "subs", None))),
                 what="mosquitto_sub subscribed")
        mosquitto_pub(broker.port, "-t", "ex/a", "-m", "timed", "-q", "1", "-D", "publish", "message-expiry-interval", "120")
        out, err = sub.communicate(timeout=TIMEOUT + 2)
    topic, payload, expiry = out.strip().split("|")
    assert (topic, payload) == ("ex/a", "timed") and 119 <= int(expiry) <= 120, err


# -- MQTT.js (Debian node-mqtt) ----------------------------------------------------------------------

MQTTJS_SCRIPT = r"""
const mqtt = require('mqtt');
const port = parseInt(process.argv[2]);
const out = {};
const sub = mqtt.connect({host: '127.0.0.1', port, protocolVersion: 5, clientId: 'js-sub', reconnectPeriod: 0,
                          topicAliasMaximum: 5, properties: {receiveMaximum: 10}});
sub.on('connect', (connack) => {
  out.connack = connack.properties || {};
  sub.subscribe({'js/#': {qos: 1}, '$share/g/js/#': {qos: 1}}, {properties: {subscriptionIdentifier: 3}}, (err, granted) => {
    out.granted = granted.map(g => g.qos);
    const pub = mqtt.connect({host: '127.0.0.1', port, protocolVersion: 5, clientId: 'js-pub', reconnectPeriod: 0});
    pub.on('connect', () => {
      pub.publish('js/a', 'hi', {qos: 1, properties: {userProperties: {k: 'v'}, contentType: 'text/plain',
                                                     correlationData: Buffer.from('c1'), responseTopic: 'js/r'}},
                  (err, packet) => { out.puback_err = err ? String(err) : null; });
    });
    let n = 0;
    sub.on('message', (topic, payload, packet) => {
      n += 1;
      const p = packet.properties || {};
      (out.msgs = out.msgs || []).push({topic, payload: payload.toString(), sub_ids: p.subscriptionIdentifier,
                                        user: p.userProperties, ct: p.contentType, corr: p.correlationData && p.correlationData.toString(),
                                        rt: p.responseTopic, alias: p.topicAlias});
      if (n === 2) { console.log(JSON.stringify(out)); clearTimeout(timer); pub.end(true); sub.end(true, () => process.exit(0)); }
    });
  });
});
const timer = setTimeout(() => { console.log(JSON.stringify(out)); process.exit(2); }, 8000);
"""


@needs_node
def test_mqttjs_v5(broker, tmp_path):
    script = tmp_path / "client.js"
    script.write_text(MQTTJS_SCRIPT)
    proc = subprocess.run(["node", str(script), str(broker.port)], capture_output=True, text=True, timeout=20,
                          env={**os.environ, "NODE_PATH": NODE_PATH})
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert proc.returncode == 0, (proc.stdout, proc.stderr)
    assert out["connack"]["receiveMaximum"] == broker.call(lambda: broker.broker.settings.receive_maximum)
    assert out["granted"] == [1, 1]
    msgs = sorted(out["msgs"], key=lambda m: m["topic"])
    # the ordinary and the shared subscription each deliver one copy; the second PUBLISH carries only the
    # topic alias the first one set (the client announced topicAliasMaximum 5), and MQTT.js resolves it
    for m in msgs:
        assert (m["topic"], m["payload"], m["ct"], m["corr"], m["rt"]) == ("js/a", "hi", "text/plain", "c1", "js/r")
        assert m["user"] == {"k": "v"}
    assert all(m["sub_ids"] in (3, [3]) for m in msgs)
    assert [m.get("alias") for m in msgs] == [1, 1]


def connect_props(**values: Any) -> Properties:
    props = Properties(PacketTypes.CONNECT)
    for k, v in values.items():
        setattr(props, k, v)
    return props


def test_paho5_session_expiry_set_on_disconnect(broker, paho5):
    c = paho5("exp2")
    c.connect(broker.port, properties=connect_props(SessionExpiryInterval=1))
    c.subscribe(("se/t", opts(1)))
    disc = Properties(PacketTypes.DISCONNECT)
    disc.SessionExpiryInterval = 5
    c.client.disconnect(properties=disc)
    c.client.loop_stop()
    time.sleep(1.5)  # past the CONNECT's 1 s, within the DISCONNECT's 5 s
    again = paho5("exp2")
    present, _ = again.connect(broker.port, clean_start=False, properties=connect_props(SessionExpiryInterval=1))
    assert present
    disc.SessionExpiryInterval = 0
    again.client.disconnect(properties=disc)
    again.client.loop_stop()
    wait_for(lambda: broker.call(lambda: broker.broker.session_of("exp2") is None), what="session ended")


def test_paho5_will_delay_and_session_end(broker, paho5):
    watcher = paho5()
    watcher.connect(broker.port)
    watcher.subscribe(("wd/#", opts(1)))
    for delay, expiry, lo, hi in ((2, 10, 1.5, 3.5), (10, 1, 0.5, 2.5)):  # the delay, or the session end first
        w = paho5()
        will_props = Properties(PacketTypes.WILLMESSAGE)
        will_props.WillDelayInterval = delay
        w.client.will_set(f"wd/{delay}", b"late", 1, properties=will_props)
        w.connect(broker.port, properties=connect_props(SessionExpiryInterval=expiry))
        t0 = time.monotonic()
        broker.call(lambda cid=w.client_id: broker.broker.session_of(cid).conn.transport.abort())
        got = watcher.get(timeout=hi + 2)
        assert got.topic == f"wd/{delay}" and lo <= time.monotonic() - t0 <= hi


def test_paho5_server_topic_aliases_as_the_paho_interop_suite_checks(broker, paho5):
    """The first PUBLISH of a topic sets an alias, the next ones carry only the alias (paho passes the raw
    topic and properties through: it does not resolve aliases itself)."""
    c = paho5()
    c.connect(broker.port, properties=connect_props(TopicAliasMaximum=1))
    c.subscribe(("ta/t", opts(2)))
    for qos in range(3):
        c.publish("ta/t", b"aliased", qos)
    got = [c.get() for _ in range(3)]
    assert got[0].topic == "ta/t" and got[0].properties.TopicAlias > 0
    assert [(m.topic, m.properties.TopicAlias) for m in got[1:]] == [("", got[0].properties.TopicAlias)] * 2
