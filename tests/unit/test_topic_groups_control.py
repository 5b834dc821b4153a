"""The topic-ack op of fanout.request_control: an explicit consumer-group commit over ``$SDV-FANOUT/requests/``."""
from __future__ import annotations

import json

import pytest

from fanout.request_control import (
    TOPIC_ACK, TOPIC_INFO, decode_topic_ack, encode_topic_ack, parse_control, reply, request_topic,
)
from fanout.trigger import TriggerError


def test_topic_ack_roundtrip_and_reply():
    c = parse_control(request_topic("responses", TOPIC_ACK),
                      json.dumps({"id": "7", "group": "g1", "partition": 3, "upto": 41}).encode())
    assert c.verb == TOPIC_ACK and c.correlation == "7"
    assert decode_topic_ack(c.request_id) == ("responses", "g1", 3, 41)
    assert c.request_id == encode_topic_ack("responses", "g1", 3, 41)
    body = json.loads(reply(c, [None, {"committed": 41}]).payload())
    assert body == {"id": "7", "op": TOPIC_ACK, "topic": "responses", "group": "g1", "partition": 3, "committed": 41}
    unknown = json.loads(reply(c, [None, None]).payload())
    assert unknown["error"] == "unknown" and "committed" not in unknown
    down = json.loads(reply(c, [None, RuntimeError("gone")]).payload())
    assert down["error"] == "unavailable"


@pytest.mark.parametrize("topic, body, field", [
    ("responses", {"group": "g", "partition": 0}, "upto"),
    ("responses", {"group": "g", "partition": -1, "upto": 0}, "partition"),
    ("responses", {"group": "g", "partition": "1", "upto": 0}, "partition"),
    ("responses", {"group": "a/b", "partition": 0, "upto": 0}, "group"),
    ("responses", {"group": "", "partition": 0, "upto": 0}, "group"),
    ("responses", {"group": "g", "partition": 0, "upto": 0, "extra": 1}, "payload"),
    ("responses", None, "payload"),
    ("re+sp", {"group": "g", "partition": 0, "upto": 0}, "topic"),
])
def test_invalid_topic_ack_is_refused_naming_the_field(topic, body, field):
    with pytest.raises(TriggerError) as exc:
        parse_control(request_topic(topic, TOPIC_ACK), b"" if body is None else json.dumps(body).encode())
    assert exc.value.field == field


def test_topic_info():
    c = parse_control(request_topic("responses", TOPIC_INFO), b'{"id": "1"}')
    assert (c.verb, c.request_id) == (TOPIC_INFO, "responses")
    body = json.loads(reply(c, [{"filter": "ecp/+/response", "partitions": 2}, None]).payload())
    assert body == {"id": "1", "op": TOPIC_INFO, "topic": "responses", "filter": "ecp/+/response", "partitions": 2}
    assert json.loads(reply(c, [None, None]).payload())["error"] == "unknown"
