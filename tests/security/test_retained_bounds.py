"""An anonymous client storing big retained messages must not grow the retained store without bound.

Was: 40 x 1 MB retained messages all kept (+40 MiB) and replayed to every later subscriber. Now the store
holds at most ``mqtt.max_retained_bytes`` and ``mqtt.max_retained_messages``; the rest is not retained
(the messages are still routed to current subscribers).
"""
from __future__ import annotations

import socket
import time

import pytest

from fanout.mqtt.packets import Puback, Publish

from .conftest import GoodTraffic, Peer, RssPeak

pytestmark = pytest.mark.timeout(120)


def test_retained_store_is_bounded(fanout_broker):
    broker = fanout_broker({"max_retained_bytes": "4MiB", "max_retained_messages": 100})
    good = GoodTraffic(broker.port)
    payload = b"r" * 1_000_000
    with RssPeak(broker) as rss:
        good.start()
        time.sleep(0.5)
        attacker = Peer(broker.port)
        assert attacker.connect("hoarder").return_code == 0
        for i in range(40):
            attacker.publish(f"ret/{i}", payload, i + 1, retain=True)
        attacker.close()
        time.sleep(1.0)
        held = rss.now_growth_mib()
    late = Peer(broker.port)
    assert late.connect("late").return_code == 0
    assert late.subscribe(("ret/#", 1)) == (1,)
    replayed = 0
    while True:
        try:
            p = late.recv(timeout=1.0)
        except socket.timeout:
            break
        if isinstance(p, Publish) and p.retain:
            replayed += 1
            late.send(Puback(p.packet_id))
    late.close()
    good.check()
    assert replayed <= 4, f"{replayed} retained messages of 1 MB replayed"
    assert held < 12, f"RSS still {held:.1f} MiB above the baseline after the attack"
    assert rss.growth_mib < 24, f"RSS peak grew {rss.growth_mib:.1f} MiB"
