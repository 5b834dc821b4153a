"""The fanout cluster (one local Ray) with MQTT 5 clients: a paho MQTTv5 platform and MQTTv5 vehicles.

What the broker core gives the fanout contract on MQTT 5 today: deliveries reach MQTT 5 vehicles as MQTT 5
PUBLISHes within their Receive Maximum (one in flight per vehicle either way), and an invalid trigger from an
MQTT 5 platform gets a negative PUBACK (0x99, or the code naming the problem: 0x83 unknown data id, 0x90 a bad data
topic) while its connection stays open for the next submission; a trigger's Message Expiry Interval is its
request's time to live, and each delivery carries what is left of it, the trigger's User Properties (in order)
and the Content Type of the blob's publish.
"""
from __future__ import annotations

import json
import time

import pytest

from tests.integration.fanout_harness import PLATFORM_LOGIN, fanout_config, running_cluster, wait_until
from tests.integration.test_mqtt5_clients import Paho5, connect_props, opts, pub_props

pytestmark = pytest.mark.timeout(180)


@pytest.fixture(scope="module")
def fanout(ray_local, tmp_path_factory):
    with running_cluster(fanout_config(tmp_path_factory.mktemp("mqtt5-fanout"))) as cluster:
        yield cluster


@pytest.fixture
def clients():
    made: list[Paho5] = []
    yield made
    for c in made:
        c.close()


def _platform(fanout, clients, client_id: str) -> Paho5:
    p = Paho5(client_id)
    clients.append(p)
    p.client.username_pw_set(*PLATFORM_LOGIN)
    p.connect(fanout.port)
    return p


def test_mqtt5_vehicles_get_deliveries_from_an_mqtt5_platform(fanout, clients):
    vins = ["M5VIN0000000001", "M5VIN0000000002"]
    cars = []
    for vin in vins:
        car = Paho5(vin)
        clients.append(car)
        car.connect(fanout.port, properties=connect_props(ReceiveMaximum=1))
        assert car.subscribe((f"agent/{vin}/proxy/request/+", opts(1))) == [1]
        cars.append(car)
    p = _platform(fanout, clients, "m5-platform")
    assert p.publish("$SDV-FANOUT/data/m5-blob", b"FW5", 1) == 0
    trigger = json.dumps({"ids": vins, "request_id": "m5-req", "data_id": "m5-blob"}).encode()
    assert p.publish("$SDV-FANOUT/trigger", trigger, 1) == 0
    for vin, car in zip(vins, cars):
        msg = car.get(timeout=20)
        assert (msg.topic, msg.payload, msg.qos) == (f"agent/{vin}/proxy/request/m5-req", b"FW5", 1)
    wait_until(lambda: fanout.inspect("request", "m5-req")["by_status"] == {"delivered": len(vins)}, 20,
               "every row acknowledged")


def test_invalid_trigger_from_mqtt5_platform_gets_negative_puback_and_connection_stays(fanout, clients):
    p = _platform(fanout, clients, "m5-platform-bad")
    assert p.publish("$SDV-FANOUT/trigger", b"this is not json", 1) == 0x99
    reason = p.last_ack_properties.ReasonString
    assert reason.startswith("invalid_trigger: payload"), reason  # the error code and the field
    assert p.disconnects.empty() and p.client.is_connected()
    assert p.publish("$SDV-FANOUT/data/m5-ok", b"OK", 1) == 0  # the same connection goes on


def test_trigger_message_expiry_interval_is_the_request_ttl(fanout, clients):
    vin_late, vin_live = "M5EXP0000000001", "M5EXP0000000002"
    live = Paho5(vin_live)
    clients.append(live)
    live.connect(fanout.port)
    assert live.subscribe((f"agent/{vin_live}/proxy/request/+", opts(1))) == [1]
    p = _platform(fanout, clients, "m5-platform-exp")
    assert p.publish("$SDV-FANOUT/data/m5-exp-blob", b"EXP", 1) == 0
    trigger = json.dumps({"ids": [vin_late, vin_live], "request_id": "m5-exp", "data_id": "m5-exp-blob"}).encode()
    assert p.publish("$SDV-FANOUT/trigger", trigger, 1, properties=pub_props(MessageExpiryInterval=2)) == 0
    assert live.get(timeout=20).payload == b"EXP"  # within the interval: delivered
    time.sleep(2.5)
    late = Paho5(vin_late)  # comes after the interval ran out: its row is not delivered
    clients.append(late)
    late.connect(fanout.port)
    assert late.subscribe((f"agent/{vin_late}/proxy/request/+", opts(1))) == [1]
    late.publish(f"ecp/{vin_late}/online", b"", 1)
    wait_until(lambda: fanout.inspect("request", "m5-exp")["by_status"] == {"delivered": 1, "expired": 1}, 20,
               "one row delivered, the late one expired")
    late.expect_nothing(0.5)


def test_refused_ingest_from_mqtt5_platform_names_the_problem_in_the_reason_code(fanout, clients):
    p = _platform(fanout, clients, "m5-platform-codes")
    unknown = json.dumps({"ids": ["M5VIN0000000009"], "request_id": "m5-r9", "data_id": "never-published"}).encode()
    assert p.publish("$SDV-FANOUT/trigger", unknown, 1) == 0x83
    assert p.last_ack_properties.ReasonString.startswith("invalid_trigger: data_id: unknown data_id")
    assert p.publish("$SDV-FANOUT/data/a/b", b"blob", 1) == 0x90
    assert p.publish("$SDV-FANOUT/trigger", unknown, 1, properties=pub_props(MessageExpiryInterval=0)) == 0x83
    assert p.last_ack_properties.ReasonString.startswith("invalid_trigger: message_expiry_interval")
    assert p.disconnects.empty() and p.client.is_connected()


def test_deliveries_carry_user_properties_content_type_and_the_remaining_expiry(fanout, clients):
    vin = "M5PRP0000000001"
    car = Paho5(vin)
    clients.append(car)
    car.connect(fanout.port)
    assert car.subscribe((f"agent/{vin}/proxy/request/+", opts(1))) == [1]
    p = _platform(fanout, clients, "m5-platform-props")
    assert p.publish("$SDV-FANOUT/data/m5-prp-blob", b"{}", 1, properties=pub_props(ContentType="application/json")) == 0
    trigger = json.dumps({"ids": [vin], "request_id": "m5-prp", "data_id": "m5-prp-blob"}).encode()
    users = [("trace", "t-42"), ("campaign", "spring"), ("trace", "t-43")]
    assert p.publish("$SDV-FANOUT/trigger", trigger, 1,
                     properties=pub_props(UserProperty=users, MessageExpiryInterval=600)) == 0
    msg = car.get(timeout=20)
    assert (msg.topic, msg.payload) == (f"agent/{vin}/proxy/request/m5-prp", b"{}")
    props = msg.properties
    assert props.UserProperty == users  # in order, a repeated name kept
    assert props.ContentType == "application/json"
    assert 590 <= props.MessageExpiryInterval <= 600  # what is left of the request's time to live
    wait_until(lambda: fanout.inspect("request", "m5-prp")["by_status"] == {"delivered": 1}, 20, "acknowledged")
    over = [("k", str(i)) for i in range(33)]  # over the bound: refused, nothing queued
    again = json.dumps({"ids": [vin], "request_id": "m5-prp-over", "data_id": "m5-prp-blob"}).encode()
    assert p.publish("$SDV-FANOUT/trigger", again, 1, properties=pub_props(UserProperty=over)) == 0x97
    assert p.last_ack_properties.ReasonString.startswith("invalid_trigger: user_properties")
