"""A persistent QoS 1 subscriber that never reads must not hold the broker's memory.

Was: 100 MB published to its topic grew the broker by +125 MiB, held after its socket closed (session
expiry 2 h); the only bound was (32 in flight + 1,000 queued) messages per session. Now its transport's
write buffer is capped (``mqtt.max_write_buffer``: a buffer over it that drains nothing for 2 s closes the
connection, the transport and its buffer dropped) and the session it leaves behind holds at most
``mqtt.max_session_bytes`` (queued + in flight). The close is observed through the subscriber's will, so
the test never reads from it before the broker gave up on it.
"""
from __future__ import annotations

import time

import pytest

from fanout.mqtt.packets import Connack, Publish, Will

from .conftest import SLACK_MIB, MiB, Peer, watched

pytestmark = pytest.mark.timeout(180)

SESSION_BYTES = 8 * MiB


def test_never_reading_persistent_subscriber(fanout_broker):
    broker = fanout_broker({"max_session_bytes": SESSION_BYTES, "max_write_buffer": "1MiB", "max_queued_bytes": "16MiB"})
    watcher = Peer(broker.port)
    assert watcher.connect("watcher").return_code == 0
    assert watcher.subscribe(("will/#", 0)) == (0,)
    sink = Peer(broker.port, rcvbuf=4096)
    assert sink.connect("sink", clean=False, will=Will("will/sink", b"gone", 0, False)) == Connack(False, 0)
    assert sink.subscribe(("bulk/#", 1)) == (1,)
    payload = b"b" * 1_000_000
    with watched(broker) as rss:
        flood = Peer(broker.port)
        assert flood.connect("flooder").return_code == 0
        for i in range(60):
            flood.publish("bulk/x", payload, i + 1)  # 60 MB, each acknowledged
        flood.close()
        will = watcher.recv(timeout=15)  # published when the broker cuts the subscriber off
        assert isinstance(will, Publish) and will.topic == "will/sink", will
        time.sleep(0.5)
        held = rss.now_growth_mib()
        assert sink.closed_by_broker(timeout=5)
        sink.close()
        watcher.close()
    # the session was kept, holding at most its budget: what the subscriber gets when it comes back
    back = Peer(broker.port)
    assert back.connect("sink", clean=False) == Connack(True, 0)
    kept = len(back.take_publishes(quiet_s=2.0))
    back.close()
    assert 1 <= kept <= SESSION_BYTES // len(payload), f"{kept} messages of 1 MB kept for the session"
    assert held < SESSION_BYTES / MiB + SLACK_MIB, f"RSS still {held:.1f} MiB above the baseline after the flood"
    assert rss.growth_mib < SESSION_BYTES / MiB + 2 * SLACK_MIB, f"RSS peak grew {rss.growth_mib:.1f} MiB"
