"""benchmarks.topics_bench's compiled clients: the append runs' figures come from them, so their plumbing is tested.

- ``cfleet_publishers``: several ``cfleet publish`` processes at once against a real Mosquitto (it PUBACKs on
  receipt), every message acknowledged, the rate and CPU summed over the processes, each VIN's own topic;
- ``redis_benchmark``: ``redis-benchmark`` against a real ``redis-server`` with ``appendfsync always``, its
  requests/s parsed and every XADD in the stream (skipped with the reason when ``make peers`` has not run).
"""
from __future__ import annotations

import asyncio
import shutil
import socket
from pathlib import Path
from typing import Iterator

import pytest

from benchmarks import cfleet_run
from benchmarks import topics_bench as tb
from benchmarks.harness.peers import PeerBroker, mosquitto_binary
from fanout.mqtt.codec import PacketReader, encode
from fanout.mqtt.packets import Connect, Publish, Suback, Subscribe

pytestmark = [pytest.mark.timeout(60), pytest.mark.skipif(shutil.which("gcc") is None, reason="gcc is not installed")]


@pytest.fixture(scope="module")
def mosquitto() -> Iterator[PeerBroker]:
    if mosquitto_binary() is None:
        pytest.skip("mosquitto is not installed (run `make mosquitto`)")
    cfleet_run.build()
    with PeerBroker("mosquitto") as broker:
        yield broker


def test_cfleet_publishers_acknowledge_every_message_over_the_vins_topics(mosquitto: PeerBroker) -> None:
    sock = socket.create_connection(("127.0.0.1", mosquitto.port), timeout=10)
    reader = PacketReader()
    try:
        sock.sendall(encode(Connect("topics-observer")) + encode(Subscribe(1, (("ecp/#", 0),))))
        while not any(isinstance(p, Suback) for p in reader.feed(sock.recv(65536))):
            pass
        rate, cpu_s, messages = asyncio.run(tb.cfleet_publishers(mosquitto.port, 2000, 16, 4, "clients-test"))
        topics: list[str] = []
        while len(topics) < messages:
            data = sock.recv(65536)
            assert data, "the observer's connection closed"
            topics += [p.topic for p in reader.feed(data) if isinstance(p, Publish)]
    finally:
        sock.close()
    vins = tb.VINS // 4
    assert messages == 4 * vins * -(-2000 // (4 * vins)) == 2000
    assert rate > 0 and cpu_s > 0
    assert len(topics) == messages
    assert set(topics) == {f"ecp/BENCH{i:012d}/response" for i in range(4 * vins)}  # one topic per VIN, no request id


@pytest.mark.skipif(shutil.which("redis-server") is None or shutil.which("redis-benchmark") is None,
                    reason="redis-server / redis-benchmark are not installed (run `make peers`)")
def test_redis_benchmark_appends_every_entry_and_reports_its_rate(tmp_path: Path) -> None:
    import redis

    subject = tb.RedisSubject(tmp_path)
    try:
        rate = asyncio.run(subject.append(3000, window=16, publishers=4))
        assert rate > 0 and subject.client_cpu_s >= 0
        assert 3000 <= subject.appended < 3000 + 4 * 16  # -n rounded up to whole pipelines at most
        r = redis.Redis(host="127.0.0.1", port=subject.port)
        try:
            assert r.xlen("responses") == subject.appended
            entry = r.xrange("responses", count=1)[0][1]
            assert entry[b"topic"].startswith(b"ecp/BENCH") and len(entry[b"payload"]) == tb.MSG_SIZE
        finally:
            r.close()
    finally:
        subject.close()
