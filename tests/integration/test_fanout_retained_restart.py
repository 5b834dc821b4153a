"""Retained messages survive stopping the whole cluster and starting it again from its data directory.

Why: a vehicle that subscribes after a restart must still find the last retained configuration; a
cleared topic must stay cleared (its tombstone outlives the older write).
"""
from __future__ import annotations

import pytest

from .fanout_harness import Puback, Publish, RawClient, Vehicle, fanout_config, platform, running_cluster

pytestmark = pytest.mark.timeout(240)


def _publish_retained(port: int, items: list[tuple[str, bytes]]) -> None:
    p = platform(port, "retained-publisher")
    try:
        for pid, (topic, payload) in enumerate(items, 1):
            p.send(Publish(topic, payload, 1, True, False, pid))
            assert p.expect(Puback).packet_id == pid
    finally:
        p.disconnect()


def test_retained_messages_survive_a_cluster_restart(ray_local, tmp_path):
    cfg = fanout_config(tmp_path)
    with running_cluster(cfg) as cluster:
        _publish_retained(cluster.port, [("fleet/config", b"v1"), ("fleet/config", b"v2"),
                                         ("fleet/notice", b"old"), ("fleet/notice", b""),
                                         ("fleet/region/eu", b"eu-1")])
    with running_cluster(cfg) as cluster:  # a new cluster on the same data directory
        sub = Vehicle(cluster.port, "retained-reader", subscribe="fleet/#")
        try:
            got = {}
            for _ in range(2):
                msg = sub.next_message(15)
                assert msg.retain
                got[msg.topic] = msg.payload
            assert got == {"fleet/config": b"v2", "fleet/region/eu": b"eu-1"}
            sub.no_message(0.5)  # fleet/notice was cleared before the stop
        finally:
            sub.close()
        raw = RawClient(cluster.port, "retained-raw")
        try:
            raw.subscribe("fleet/config")
            msg = raw.expect(Publish)
            assert (msg.topic, msg.payload, msg.retain) == ("fleet/config", b"v2", True)
        finally:
            raw.disconnect()
