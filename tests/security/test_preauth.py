"""Attacks before authentication: nothing a client sends before its CONNACK may cost the broker memory.

- A first packet that is not CONNECT closes the socket at its first byte (MQTT-3.1.0-1), so an
  unfinished 1 MB PUBLISH buffers nothing (was: all 30 sockets still open after 2 s, +24 to +30 MiB).
- A CONNECT whose password is being checked (PBKDF2, ~0.3 s and more on a loaded machine) stops the
  reading of its socket: 80 x 1 MB of PUBLISH pipelined behind a wrong password stay in the kernel
  (was: +81 MiB of held packets before CONNACK 4).
"""
from __future__ import annotations

import socket
import struct
import time

import pytest

from fanout.mqtt.codec import encode, encode_varint
from fanout.mqtt.packets import Connack, Connect, Publish

from .conftest import SLACK_MIB, Peer, send_in_background, watched

pytestmark = pytest.mark.timeout(120)


def _unfinished_publish(size: int = 1_000_000) -> bytes:
    """A QoS 0 PUBLISH header announcing ``size`` bytes, and all of them but the last 1,000."""
    topic = b"x/y"
    body = struct.pack(">H", len(topic)) + topic + b"\0" * (size - 2 - len(topic))
    return b"\x30" + encode_varint(size) + body[:-1000]


def test_unfinished_first_publish_is_refused_at_its_first_byte(fanout_broker):
    broker = fanout_broker({"max_connect_size": "64KiB"})
    with watched(broker) as rss:
        socks = []
        for _ in range(30):
            s = socket.create_connection(("127.0.0.1", broker.port))
            send_in_background(s, _unfinished_publish())
            socks.append(s)
        deadline = time.monotonic() + 2.0
        still_open = []
        for s in socks:
            s.settimeout(max(0.01, deadline - time.monotonic()))
            try:
                closed = s.recv(1) == b""
            except socket.timeout:
                closed = False
            except OSError:  # reset: closed too
                closed = True
            if not closed:
                still_open.append(s)
        for s in socks:
            s.close()
    assert not still_open, f"{len(still_open)} of 30 sockets still open after 2 s"
    assert rss.growth_mib < SLACK_MIB, f"RSS grew {rss.growth_mib:.1f} MiB"


def test_nothing_is_read_while_a_wrong_password_is_checked(fanout_broker):
    # 2,000,000 PBKDF2 iterations (~1 s): the attacker has time to send while the password is checked
    broker = fanout_broker({}, users={"alice": ("right", "client", 2_000_000)})
    payload = b"z" * 1_000_000
    flood = encode(Connect("attacker", True, 60, "alice", b"wrong")) + b"".join(
        encode(Publish("x/y", payload, 1, False, False, i + 1)) for i in range(80))
    with watched(broker) as rss:
        attacker = Peer(broker.port)
        send_in_background(attacker.sock, flood)
        answer = attacker.recv(timeout=30)
        assert answer == Connack(False, 4)
        assert attacker.closed_by_broker()
        attacker.close()
    assert rss.growth_mib < SLACK_MIB, f"RSS grew {rss.growth_mib:.1f} MiB"
