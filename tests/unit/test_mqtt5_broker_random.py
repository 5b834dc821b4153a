"""Random valid MQTT 5 packets (the fuzzer's generator) from connected clients: the broker core answers or
closes that connection, and never raises."""
from __future__ import annotations

import random

from fanout.mqtt.connection import CLOSED
from fanout.mqtt.packets5 import Connect5, Subscribe5, Subscription
from fanout.mqtt.codec import encode
from scripts.fuzz_codec import random_packet5
from tests.unit.test_mqtt5_broker import Client5
from tests.unit.test_mqtt_broker import Net


def test_random_v5_packets_never_raise():
    rng = random.Random(1305)
    net = Net()
    closed = 0
    for round_ in range(300):
        watcher = Client5(net)
        watcher.send(Connect5(f"w{round_}"), Subscribe5(1, (Subscription("#", 2), Subscription("$share/g/#", 1))))
        c = Client5(net)
        c.send(Connect5(f"c{round_}", round_ % 2 == 0))
        for _ in range(rng.randint(1, 12)):
            p = random_packet5(rng)
            if isinstance(p, Connect5):
                continue
            c.send_raw(encode(p))
            if c.closed:
                closed += 1
                break
        if round_ % 7 == 0:
            net.advance(1_000)
        c.take()
        watcher.take()
        for peer in (c, watcher):
            if peer.conn.state < CLOSED:
                peer.drop()
    net.advance(3_600_000)
    assert closed  # some random packets are protocol errors for a server (CONNACK, SUBACK, AUTH ...)
    st = net.broker.state
    assert st.clients_connected == 0 and st.v5_connected == 0
