"""Packet size limits per role: ingest triggers naming up to fanout.max_batch VINs need far more than the
per-client mqtt.max_packet_size, so authenticated platform/admin connections get
mqtt.max_platform_packet_size; everyone else stays at the small limit (and is disconnected above it)."""
from __future__ import annotations

import pytest

from fanout.mqtt.packets import Pingreq, Pingresp, Publish, Puback

pytestmark = pytest.mark.timeout(60)

BIG = b"x" * (64 * 1024)  # over the 16 KiB client limit used here, under the platform limit


def _limits(start_broker):
    return start_broker(mqtt={"max_packet_size": "16KiB", "max_platform_packet_size": "1MiB"})


def test_platform_login_may_send_large_packets(start_broker, raw_client):
    rb = _limits(start_broker)
    plat = raw_client(rb)
    assert plat.connect("plat-1", username="platform", password=b"platform").return_code == 0
    plat.send(Publish("bulk/topic", BIG, 1, packet_id=7))
    assert plat.recv() == Puback(7)
    plat.send(Pingreq())
    assert plat.recv() == Pingresp()


def test_anonymous_client_is_held_to_the_small_limit(start_broker, raw_client):
    rb = _limits(start_broker)
    anon = raw_client(rb)
    assert anon.connect("anon-1").return_code == 0
    bystander = raw_client(rb)
    assert bystander.connect("anon-2").return_code == 0
    anon.send(Publish("bulk/topic", BIG, 1, packet_id=7))
    assert anon.is_closed()
    bystander.send(Pingreq())  # other clients are unaffected
    assert bystander.recv() == Pingresp()


def test_platform_limit_is_still_a_limit(start_broker, raw_client):
    rb = start_broker(mqtt={"max_packet_size": "16KiB", "max_platform_packet_size": "128KiB"})
    plat = raw_client(rb)
    assert plat.connect("plat-2", username="platform", password=b"platform").return_code == 0
    plat.send(Publish("bulk/topic", b"y" * (256 * 1024), 1, packet_id=8))
    assert plat.is_closed()
