"""What the Eclipse Paho MQTT 5 interoperability suite (``client_test5.py``) checks and the broker once got
wrong, reproduced with our own clients over real TCP on 127.0.0.1 (the suite itself is not part of the
repository; docs/mqtt.md says how it was run and what it reported).

- ``test_flow_control2``: a client that exceeds the broker's Receive Maximum with QoS 2 PUBLISHes keeps
  answering the PUBRECs that came before the DISCONNECT 0x93; closing the socket outright made the kernel
  answer those PUBRELs with RST, and the client got EPIPE instead of the reason code.
"""
from __future__ import annotations

import time

import pytest

from fanout.mqtt.codec import PacketReader
from fanout.mqtt.packets5 import Connack5, Connect5, Disconnect5, Publish5, Pubrec5, Pubrel5

pytestmark = pytest.mark.timeout(60)


def raw5(rb, raw_client):
    """A raw client whose reader decodes MQTT 5."""
    c = raw_client(rb)
    c.reader = PacketReader(protocol_level=5)
    return c


def test_receive_maximum_disconnect_reaches_a_client_still_answering_pubrecs(start_broker, raw_client):
    rb = start_broker(mqtt={"receive_maximum": 3})
    c = raw5(rb, raw_client)
    c.send(Connect5("rm-over"))
    ack = c.recv()
    assert isinstance(ack, Connack5) and ack.reason_code == 0
    c.send(*(Publish5("rm/t", b"x", 2, False, False, pid) for pid in range(1, 5)))  # one over the maximum
    time.sleep(0.3)  # the broker has answered all four and closed its side
    got = []
    while True:
        p = c.recv()
        got.append(p)
        if not isinstance(p, Pubrec5):
            break
        c.send(Pubrel5(p.packet_id))  # what the suite's client does for each PUBREC it reads
        time.sleep(0.05)  # time for a RST to come back before the next send
    assert [p.packet_id for p in got[:-1]] == [1, 2, 3]
    assert isinstance(got[-1], Disconnect5) and got[-1].reason_code == 0x93
    assert c.is_closed()
