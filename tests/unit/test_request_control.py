"""Request status and cancel over MQTT (fanout.request_control) through NodeCore + DispatcherCores, no Ray:
the platform publishes on ``$SDV-FANOUT/requests/<id>/status|cancel`` and reads the reply on its
``$SDV-FANOUT/replies/<client_id>``."""
from __future__ import annotations

import json

import pytest

from fanout.mqtt.packets import Puback, Publish, Suback, Subscribe
from fanout.request_control import Control, parse_control, replies_topic, reply, request_topic
from fanout.trigger import TriggerError

from .test_node_core import Client, Cluster, publish_batch, vehicle


@pytest.fixture
def cluster(tmp_path):
    c = Cluster(tmp_path)
    yield c
    c.close()


async def ask(c: Cluster, p, verb: str, request_id: str, pid: int, corr: str = "q") -> dict:
    p.send(Publish(request_topic(request_id, verb), json.dumps({"id": corr}).encode(), 1, False, False, pid))
    await c.pump()
    assert p.acks() == [pid]
    (answer,) = p.publishes()
    assert answer.topic == replies_topic("platform-1")
    body = json.loads(answer.payload)
    assert body["id"] == corr and body["op"] == verb and body["request_id"] == request_id
    return body


async def test_status_then_cancel_with_a_message_in_flight(cluster):
    vins = ["V0", "V1", "V2", "V3"]
    car = vehicle(cluster, "V0")
    await cluster.pump()
    await publish_batch(cluster, vins)
    (msg,) = car.publishes()  # V0's row is in flight (not acknowledged)
    p = cluster.platform()
    p.subscribe(replies_topic("platform-1"))
    status = (await ask(cluster, p, "status", "r1", 5))["status"]
    assert (status["vins"], status["pending"], status["inflight"], status["state"]) == (4, 4, 1, "active")
    cancelled = (await ask(cluster, p, "cancel", "r1", 6, corr="c"))["status"]
    assert (cancelled["pending"], cancelled["cancelled"], cancelled["inflight"]) == (0, 4, 1)
    assert cluster.pending() == 0
    late = vehicle(cluster, "V1")
    late.send(Publish("ecp/V1/heartbeat", b"{}", 1, False, False, 1))
    await cluster.pump()
    assert late.publishes() == []  # nothing more of r1 is delivered
    car.send(Puback(msg.packet_id))  # the one in flight arrives: recorded
    await cluster.pump()
    after = (await ask(cluster, p, "status", "r1", 7))["status"]
    assert (after["delivered"], after["cancelled"], after["inflight"], after["state"]) == (1, 3, 0, "cancelled")
    assert (await ask(cluster, p, "status", "never-sent", 8))["status"] is None
    assert (await ask(cluster, p, "cancel", "never-sent", 9))["status"] is None


async def test_an_invalid_question_is_invalid_input(cluster):
    p = cluster.platform()
    p.subscribe("$SDV-FANOUT/errors/platform-1")
    p.send(Publish("$SDV-FANOUT/requests/r1/delete", b"", 1, False, False, 1))
    await cluster.pump()
    assert p.closed and p.acks() == []
    (error,) = p.publishes()
    assert json.loads(error.payload)["field"] == "topic"


async def test_only_the_asker_reads_its_replies_and_a_plain_client_may_not_ask(cluster):
    def granted(client, topic_filter: str) -> int:
        client.send(Subscribe(3, ((topic_filter, 1),)))
        (suback,) = [x for x in client.inbox if isinstance(x, Suback)]
        client.inbox.remove(suback)
        return suback.return_codes[0]

    p = cluster.platform()
    assert granted(p, replies_topic("platform-1")) == 1
    assert granted(p, replies_topic("platform-2")) == 0x80
    other = Client(cluster, "someone")  # anonymous: role client
    assert granted(other, replies_topic("platform-1")) == 0x80
    other.send(Publish(request_topic("r1", "cancel"), b"", 1, False, False, 4))
    await cluster.pump()
    assert cluster.link.calls == []  # refused by the ACL: no shard was asked


@pytest.mark.parametrize("topic, payload, field", [
    ("$SDV-FANOUT/requests/r1/nope", b"", "topic"),
    ("$SDV-FANOUT/requests//status", b"", "topic"),
    ("$SDV-FANOUT/requests/a/b/status", b"", "topic"),
    ("$SDV-FANOUT/requests/r1/status", b"[1]", "payload"),
    ("$SDV-FANOUT/requests/r1/status", b'{"id": 5}', "payload"),
    ("$SDV-FANOUT/requests/r1/status", b'{"x": "y"}', "payload"),
    ("$SDV-FANOUT/requests/r\x01/status", b"", "request_id"),
])
def test_parse_control_refuses(topic, payload, field):
    with pytest.raises(TriggerError) as err:
        parse_control(topic, payload)
    assert err.value.field == field


def test_parse_control_and_reply():
    assert parse_control("$SDV-FANOUT/requests/r1/cancel", b"") == Control("cancel", "r1", None)
    assert parse_control("$SDV-FANOUT/requests/r1/status", b'{"id": "7"}') == Control("status", "r1", "7")
    part = {"request_id": "r1", "vins": 1, "pending": 1, "delivered": 0, "discarded": 0, "expired": 0, "cancelled": 0,
            "first_delivery_ms": None, "last_delivery_ms": None, "expires_ms": None, "inflight": 0}
    ok = reply(Control("status", "r1", "7"), [part, None]).body
    assert ok["status"]["vins"] == 1 and ok["status"]["state"] == "active"
    failed = reply(Control("status", "r1", "7"), [part, RuntimeError("down")]).body
    assert failed["error"] == "unavailable" and "status" not in failed
