"""A SUBSCRIBE of filters with tens of thousands of levels must not grow the subscription trie.

Was: one anonymous SUBSCRIBE of 4 filters x 32,001 ``+`` levels (250 KB) granted, +12 to +48 MiB (one
trie node per level, no cap on levels). Now ``mqtt.max_topic_levels`` refuses each filter (SUBACK 0x80).
"""
from __future__ import annotations

import time

import pytest

from .conftest import SLACK_MIB, Peer, watched

pytestmark = pytest.mark.timeout(120)


def test_deep_filters_are_refused(fanout_broker):
    broker = fanout_broker({"max_topic_levels": 32, "max_topic_length": "1KiB"})
    with watched(broker) as rss:
        for client in range(2):
            attacker = Peer(broker.port)
            assert attacker.connect(f"deep-{client}").return_code == 0
            filters = [(f"{client}{i}/" + "+/" * 32000 + "x", 1) for i in range(4)]  # 64 KB each
            codes = attacker.subscribe(*filters)
            assert codes == (0x80,) * 4
            attacker.close()
        time.sleep(0.5)
    assert rss.growth_mib < SLACK_MIB, f"RSS grew {rss.growth_mib:.1f} MiB"
