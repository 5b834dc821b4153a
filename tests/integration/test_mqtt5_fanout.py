"""The fanout cluster (one local Ray) with MQTT 5 clients: a paho MQTTv5 platform and MQTTv5 vehicles.

What the broker core gives the fanout contract on MQTT 5 today: deliveries reach MQTT 5 vehicles as MQTT 5
PUBLISHes within their Receive Maximum (one in flight per vehicle either way), and an invalid trigger from an
MQTT 5 platform gets a negative PUBACK (0x99) while its connection stays open for the next submission.
"""
from __future__ import annotations

import json

import pytest

from tests.integration.fanout_harness import PLATFORM_LOGIN, fanout_config, running_cluster, wait_until
from tests.integration.test_mqtt5_clients import Paho5, connect_props, opts

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
