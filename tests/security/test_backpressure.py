"""Back-pressure before the node's queued-bytes budget: a fast publisher is paused, not its messages dropped.

Was: a QoS 1 publisher faster than its subscriber filled the node budget (``mqtt.max_queued_bytes``), after
which the broker dropped messages it had acknowledged to the publisher. Now the queues of connected sessions
are watched: past ``backpressure_high_fraction`` of their part of the budget the broker stops reading from the
connections that publish (the publisher's socket fills, TCP holds it back), and reads them again below
``backpressure_low_fraction``. Offline persistent sessions hold their own part (``offline_queued_fraction``)
and drop past it, so one nobody comes back for never pauses anyone.
"""
from __future__ import annotations

import socket
import threading
import time

import pytest

from fanout.mqtt.packets import Connack, Puback, Publish

from .conftest import SLACK_MIB, MiB, Peer, sys_value, watched

pytestmark = pytest.mark.timeout(180)

BUDGET_MIB = 8  # online part 6 MiB: paused past 4.8 MiB, resumed at 3 MiB; offline part 2 MiB
BUDGET = {"max_queued_bytes": f"{BUDGET_MIB}MiB", "offline_queued_fraction": 0.25, "backpressure_high_fraction": 0.8,
          "backpressure_low_fraction": 0.5, "max_session_bytes": "64MiB", "max_offline_messages": 100_000,
          "sys_interval": "1s"}
PAYLOAD = 64 * 1024


def _flood(port: int, topic: str, count: int) -> tuple[threading.Thread, list[float]]:
    """A QoS 1 publisher that writes ``count`` messages as fast as its socket takes them (packet ids reused
    once acknowledged: it reads its PUBACKs in a second thread). Returns the thread and, once it ended, the
    seconds it took."""
    peer = Peer(port)
    assert peer.connect("flooder").return_code == 0
    took: list[float] = []
    acked = threading.Semaphore(0)

    def read_acks() -> None:
        for _ in range(count):
            p = peer.recv(timeout=60)
            assert isinstance(p, Puback), p
            acked.release()

    def run() -> None:
        reader = threading.Thread(target=read_acks, daemon=True)
        reader.start()
        t = time.monotonic()
        for i in range(count):
            if i >= 1000:
                acked.acquire(timeout=60)  # at most 1,000 unacknowledged, so packet ids stay unique
            peer.send(Publish(topic, b"%06d" % i + b"p" * (PAYLOAD - 6), 1, False, False, i % 0xFFFF + 1))
        reader.join(60)
        took.append(time.monotonic() - t)
        peer.close()

    th = threading.Thread(target=run, daemon=True)
    th.start()
    return th, took


def test_fast_publisher_is_paused_for_a_slow_subscriber(fanout_broker):
    broker = fanout_broker(BUDGET)
    sub = Peer(broker.port)
    assert sub.connect("slow-sub").return_code == 0
    assert sub.subscribe(("bulk/#", 1)) == (1,)
    count = 400  # 25 MiB, three times the budget
    got: list[bytes] = []
    with watched(broker) as rss:
        flood, took = _flood(broker.port, "bulk/x", count)
        while len(got) < count:
            try:
                p = sub.recv(timeout=20)
            except socket.timeout:
                break
            if isinstance(p, Publish):
                got.append(p.payload[:6])
                sub.send(Puback(p.packet_id))
                time.sleep(0.004)  # a subscriber ~4 times slower than the publisher
        flood.join(60)
    assert got == [b"%06d" % i for i in range(count)], f"{count - len(got)} QoS 1 messages lost or reordered"
    assert took, "the publisher did not finish"
    time.sleep(1.5)  # the next $SYS publish
    pauses, episodes = sys_value(broker.port, "backpressure/pauses"), sys_value(broker.port, "backpressure/episodes")
    print(f"\n{count} x {PAYLOAD} B in {took[0]:.2f} s, {episodes} episodes, {pauses} pauses, "
          f"RSS peak {rss.growth_mib:+.1f} MiB")
    assert pauses >= 1 and episodes >= 1
    assert sys_value(broker.port, "publish/messages/dropped") == 0
    assert sys_value(broker.port, "limits/queued_bytes") == 0
    assert rss.growth_mib < BUDGET_MIB + 2 * SLACK_MIB, f"RSS peak grew {rss.growth_mib:.1f} MiB"
    sub.close()


def test_offline_session_filling_its_part_pauses_nobody(fanout_broker):
    broker = fanout_broker(BUDGET)
    away = Peer(broker.port)
    assert away.connect("away", clean=False) == Connack(False, 0)
    assert away.subscribe(("bulk/#", 1)) == (1,)
    away.close()
    time.sleep(0.3)
    count = 150  # 9.4 MiB for a session whose part of the budget is 2 MiB
    with watched(broker) as rss:
        flood, took = _flood(broker.port, "bulk/x", count)
        flood.join(60)
    assert took, "the publisher did not finish"
    time.sleep(1.5)
    assert sys_value(broker.port, "backpressure/episodes") == 0
    assert sys_value(broker.port, "backpressure/pauses") == 0
    assert sys_value(broker.port, "limits/offline_queued_bytes") > 0
    assert sys_value(broker.port, "messages/queued/offline bytes") <= BUDGET_MIB * MiB // 4
    back = Peer(broker.port)
    assert back.connect("away", clean=False) == Connack(True, 0)
    kept = [p.payload[:6] for p in back.take_publishes(quiet_s=2.0)]
    back.close()
    assert 1 <= len(kept) <= BUDGET_MIB * MiB // 4 // PAYLOAD
    assert kept == [b"%06d" % i for i in range(count - len(kept), count)]  # the newest kept (offline_drop oldest)
    print(f"\n{count} x {PAYLOAD} B for an offline session: {len(kept)} kept, RSS peak {rss.growth_mib:+.1f} MiB")
    assert rss.growth_mib < BUDGET_MIB + 2 * SLACK_MIB, f"RSS peak grew {rss.growth_mib:.1f} MiB"
