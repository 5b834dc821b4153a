"""A persistent QoS 1 subscriber that never reads must not hold the broker's memory.

Was: 100 MB published to its topic grew the broker by +125 MiB, held after its socket closed (session
expiry 2 h); the only bound was (32 in flight + 1,000 queued) messages per session. Now its transport's
write buffer is capped (``mqtt.max_write_buffer``: the connection is closed, the transport and its buffer
dropped) and the session it leaves behind holds at most ``mqtt.max_session_bytes`` (queued + in flight).
"""
from __future__ import annotations

import socket
import time

import pytest

from fanout.mqtt.packets import Connack, Puback, Publish

from .conftest import GoodTraffic, MiB, Peer, RssPeak

pytestmark = pytest.mark.timeout(180)

SESSION_BYTES = 8 * MiB


def test_never_reading_persistent_subscriber(fanout_broker):
    broker = fanout_broker({"max_session_bytes": "8MiB", "max_write_buffer": "1MiB", "max_queued_bytes": "16MiB"})
    good = GoodTraffic(broker.port)
    sink = Peer(broker.port, rcvbuf=4096)
    assert sink.connect("sink", clean=False) == Connack(False, 0)
    assert sink.subscribe(("bulk/#", 1)) == (1,)
    payload = b"b" * 1_000_000
    with RssPeak(broker) as rss:
        good.start()
        time.sleep(0.5)
        flood = Peer(broker.port)
        assert flood.connect("flooder").return_code == 0
        for i in range(60):
            flood.publish("bulk/x", payload, i + 1)  # 60 MB, each acknowledged
        flood.close()
        time.sleep(1.0)
        held = rss.now_growth_mib()
    assert sink.closed_by_broker(timeout=5), "the subscriber that never reads is still connected"
    sink.close()
    good.check()
    # the session was kept, holding at most its budget: what the subscriber gets when it comes back
    back = Peer(broker.port)
    assert back.connect("sink", clean=False) == Connack(True, 0)
    kept = 0
    while True:
        try:
            p = back.recv(timeout=2.0)
        except socket.timeout:
            break
        if isinstance(p, Publish):
            kept += 1
            back.send(Puback(p.packet_id))
    back.close()
    assert 1 <= kept <= SESSION_BYTES // len(payload), f"{kept} messages of 1 MB kept for the session"
    assert rss.growth_mib < 24, f"RSS peak grew {rss.growth_mib:.1f} MiB"
    assert held < 16, f"RSS still {held:.1f} MiB above the baseline after the flood"
