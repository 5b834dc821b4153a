"""Vehicle impersonation against the whole fanout cluster (controller, dispatchers, connection node on the
session's Ray), users configured: an anonymous client and a ``client``-role user connecting with a vehicle's
VIN, subscribing to its delivery topic and publishing its ``online`` heartbeat, must neither receive its
queued message nor acknowledge (delete) its row; the vehicle itself then gets it."""
from __future__ import annotations

import dataclasses

import pytest

from fanout.config import UserConfig
from fanout.mqtt.auth import hash_password
from fanout.mqtt.packets import Puback, Suback, Subscribe
from tests.integration.fanout_harness import (
    RawClient, Vehicle, fanout_config, running_cluster, trigger_payload, wait_until,
)

USERS = {"ops": ("ops-pw", "platform"), "fleet": ("fleet-pw", "vehicle"), "alice": ("alice-pw", "client")}


@pytest.fixture(scope="module")
def fanout(ray_local, tmp_path_factory):
    cfg = fanout_config(tmp_path_factory.mktemp("impersonation"))
    cfg = dataclasses.replace(cfg, users={n: UserConfig(n, hash_password(pw, iterations=1000), role)
                                          for n, (pw, role) in USERS.items()})
    with running_cluster(cfg) as cluster:
        yield cluster


def publish_batch(port: int, vins: list[str], request_id: str) -> None:
    p = RawClient(port, "ops-1", username="ops", password="ops-pw")
    try:
        p.publish("$SDV-FANOUT/data/imp-blob", b"firmware", pid=1)
        assert p.expect(Puback).packet_id == 1
        p.publish("$SDV-FANOUT/trigger", trigger_payload(vins, request_id, "imp-blob"), pid=2)
        assert p.expect(Puback, timeout=30).packet_id == 2
    finally:
        p.disconnect()


@pytest.mark.parametrize("who", [None, "alice"])
def test_a_non_vehicle_using_a_vin_gets_nothing_and_acks_nothing(fanout, who):
    vin = f"IMP{who or 'ANON'}1"
    publish_batch(fanout.port, [vin], f"imp-{vin}")
    pending = lambda: fanout.inspect("vin", vin)["pending_rows"]  # noqa: E731
    assert pending() == 1
    pw = USERS[who][0] if who else None
    thief = RawClient(fanout.port, vin, username=who, password=pw)
    try:
        thief.send(Subscribe(1, ((f"agent/{vin}/proxy/request/+", 1), ("#", 1))))
        assert thief.expect(Suback).return_codes == (0x80, 1)  # '#' is granted, but agent/<VIN>/ is never delivered
        thief.publish(f"ecp/{vin}/online", b"", pid=3)
        thief.publish(f"ecp/{vin}/heartbeat", b"", pid=4)
        assert [thief.expect(Puback).packet_id for _ in range(2)] == [3, 4]  # refused publishes are still acked
        thief.quiet(1.5)  # and no PUBLISH at all
        thief.send(Puback(1))  # acknowledging a guessed packet id deletes nothing
    finally:
        thief.kill()
    assert pending() == 1
    car = Vehicle(fanout.port, vin, username="fleet", password="fleet-pw")
    try:
        car.heartbeat("online")
        msg = car.next_message()
        assert (msg.topic, msg.payload) == (f"agent/{vin}/proxy/request/imp-{vin}", b"firmware")
        wait_until(lambda: pending() == 0, 15, "the vehicle's own PUBACK deletes the row")
    finally:
        car.close()
