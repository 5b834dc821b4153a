"""An anonymous client storing big retained messages must not grow the retained store without bound.

Was: 40 x 1 MB retained messages all kept (+40 MiB) and replayed to every later subscriber. Now the store
holds at most ``mqtt.max_retained_bytes`` and ``mqtt.max_retained_messages``; the rest is not retained
(the messages are still routed to current subscribers).
"""
from __future__ import annotations

import time

import pytest

from .conftest import SLACK_MIB, Peer, watched

RETAINED_MIB = 4

pytestmark = pytest.mark.timeout(120)


def test_retained_store_is_bounded(fanout_broker):
    broker = fanout_broker({"max_retained_bytes": f"{RETAINED_MIB}MiB", "max_retained_messages": 100})
    payload = b"r" * 1_000_000
    with watched(broker) as rss:
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
    replayed = sum(1 for p in late.take_publishes() if p.retain)
    late.close()
    assert replayed <= 4, f"{replayed} retained messages of 1 MB replayed"
    assert held < RETAINED_MIB + SLACK_MIB, f"RSS still {held:.1f} MiB above the baseline after the attack"
    assert rss.growth_mib < RETAINED_MIB + 2 * SLACK_MIB, f"RSS peak grew {rss.growth_mib:.1f} MiB"
