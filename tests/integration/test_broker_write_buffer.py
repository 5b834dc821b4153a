"""``mqtt.max_write_buffer`` over real sockets: a client behind that keeps being given more is cut off, a
client that reads takes any burst at its own pace.

The bound is 64 KiB here and 20 retained messages of 100 KB (2 MB) make the burst a new subscription of
``r/#`` receives at once.
"""
from __future__ import annotations

import socket
import time

import pytest

from fanout.mqtt.codec import PacketReader, encode
from fanout.mqtt.packets import Connack, Connect, Publish, Suback, Subscribe, Will

from .conftest import HOST, TIMEOUT, wait_for

pytestmark = pytest.mark.timeout(60)

RETAINED = 20
PAYLOAD = b"r" * 100_000


def _client(port: int, rcvbuf: int) -> socket.socket:
    s = socket.socket()
    s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)  # before connect: the advertised window
    s.settimeout(TIMEOUT)
    s.connect((HOST, port))
    return s


def _read_packets(s: socket.socket, reader: PacketReader, n: int, pause_s: float = 0.0) -> list:
    got: list = []
    while len(got) < n:
        data = s.recv(4096)
        assert data, "closed by the broker"
        got.extend(reader.feed(data))
        time.sleep(pause_s)  # a slow reader
    return got


@pytest.fixture
def retained_broker(start_broker, raw_client):
    rb = start_broker(mqtt={"max_write_buffer": "64KiB"})
    pub = raw_client(rb)
    pub.connect("retainer")
    pub.send(*(Publish(f"r/{i}", PAYLOAD, 0, True) for i in range(RETAINED)))
    wait_for(lambda: rb.call(lambda: len(rb.broker.retained)) >= RETAINED, what="retained stored")
    return rb


def test_a_slow_reader_takes_a_big_burst(retained_broker):
    s = _client(retained_broker.port, 8192)
    reader = PacketReader()
    s.sendall(encode(Connect("slow", True, 60)) + encode(Subscribe(1, (("r/#", 0),))))
    got = _read_packets(s, reader, 2 + RETAINED, pause_s=0.002)
    assert got[0] == Connack(False, 0) and got[1] == Suback(1, (0,))
    assert sorted(p.topic for p in got[2:]) == sorted(f"r/{i}" for i in range(RETAINED))
    s.close()


def test_a_client_behind_that_asks_for_more_is_cut_off(retained_broker, raw_client):
    watcher = raw_client(retained_broker)
    watcher.connect("watcher")
    watcher.send(Subscribe(1, (("will/#", 0),)))
    assert isinstance(watcher.recv(), Suback)
    s = _client(retained_broker.port, 4096)
    s.sendall(encode(Connect("greedy", True, 60, will=Will("will/greedy", b"cut", 0, False)))
              + encode(Subscribe(1, (("r/#", 0),))))  # the first burst is accepted (the kernel takes much of it)
    t0 = time.monotonic()
    will = None
    for packet_id in range(2, 6):  # more while the earlier ones are unread: over the bound at a write
        s.sendall(encode(Subscribe(packet_id, (("r/#", 0),))))
        try:
            will = watcher.recv(timeout=0.4)
            break
        except AssertionError:
            continue
    assert isinstance(will, Publish) and will.topic == "will/greedy"
    assert time.monotonic() - t0 < 1.9  # at a write, before the 2 s no-drain rule could apply
    hits = retained_broker.call(lambda: retained_broker.broker.state.caps.hits["write_buffer"])
    assert hits == 1
    s.close()
