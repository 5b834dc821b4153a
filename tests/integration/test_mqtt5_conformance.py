"""What the Eclipse Paho MQTT 5 interoperability suite (``client_test5.py``) checks and the broker once got
wrong, reproduced with our own clients over real TCP on 127.0.0.1 (the suite itself is not part of the
repository; docs/mqtt.md says how it was run and what it reported).

- ``test_flow_control2``: a client that exceeds the broker's Receive Maximum with QoS 2 PUBLISHes keeps
  answering the PUBRECs that came before the DISCONNECT 0x93; closing the socket outright made the kernel
  answer those PUBRELs with RST, and the client got EPIPE instead of the reason code.
- ``test_request_response``: Response Topic and Correlation Data pass through routing unchanged, so a
  responder can answer on the requester's topic with the requester's correlation data (passed already;
  kept here with paho-mqtt so the request/response pattern has a test of its own).
"""
from __future__ import annotations

import time

import pytest

from fanout.mqtt.codec import PacketReader
from fanout.mqtt.packets5 import Connack5, Connect5, Disconnect5, Publish5, Pubrec5, Pubrel5
from tests.integration.test_mqtt5_clients import opts, paho5, pub_props  # noqa: F401 - paho5 is a fixture

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


def test_request_response_round_trip_with_paho5(broker, paho5):
    requester, responder = paho5("requester"), paho5("responder")
    requester.connect(broker.port)
    responder.connect(broker.port)
    assert requester.subscribe(("reply/requester", opts(1))) == [1]
    assert responder.subscribe(("svc/echo", opts(1))) == [1]
    for n, corr in enumerate((b"334", b"\x00\xffbinary")):
        requester.publish("svc/echo", b"request %d" % n, 1,
                          properties=pub_props(ResponseTopic="reply/requester", CorrelationData=corr))
        req = responder.get()
        assert (req.payload, req.properties.ResponseTopic, req.properties.CorrelationData) == (
            b"request %d" % n, "reply/requester", corr)
        responder.publish(req.properties.ResponseTopic, b"response %d" % n, 1,
                          properties=pub_props(CorrelationData=req.properties.CorrelationData))
        resp = requester.get()
        assert (resp.topic, resp.payload, resp.properties.CorrelationData) == (
            "reply/requester", b"response %d" % n, corr)
        assert not hasattr(resp.properties, "ResponseTopic")
    requester.expect_nothing()
    responder.expect_nothing()
