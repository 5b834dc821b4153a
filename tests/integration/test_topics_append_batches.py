"""Durable appends in batches bigger than Ray's inline argument size, replicated with ``min_replicas_to_ack = 1``
(the topics benchmark's setting): the node's ``topic_append`` call and the primary's ``apply_many`` to the replica
carry them in inline-sized chunks (actors.ray_args). Every publish is acknowledged in order, read back whole and
in per-vehicle order, and the replica's tables equal the primary's."""
from __future__ import annotations

import dataclasses
import os

import pytest
import ray

from cluster.cli.consume import ControllerSource
from fanout.mqtt.packets import Puback, Publish
from fanout.topics.consume import consume
from storage.replication_protocol import table_digests
from storage.topics import TopicSpec

from .fanout_harness import RawClient, fanout_config, running_cluster, wait_until

RESPONSES = TopicSpec.build("responses", "ecp/+/response")
PAYLOAD = 4096
PER_CLIENT = 300  # 1.2 MB sent at once per client: each shard's first call is far over 100 KB


@pytest.fixture(scope="module")
def fanout(ray_local, tmp_path_factory):
    cfg = fanout_config(tmp_path_factory.mktemp("append-batches"), replicas=1, min_replicas_to_ack=1)
    with running_cluster(dataclasses.replace(cfg, topics=(RESPONSES,))) as cluster:
        yield cluster


def test_big_batches_are_acknowledged_in_order_read_back_whole_and_replicated(fanout):
    clients = [RawClient(fanout.port, f"BIGBATCH{k:09d}") for k in range(2)]
    sent: dict[str, list[bytes]] = {}
    try:
        for k, c in enumerate(clients):
            packets = []
            for i in range(PER_CLIENT):
                vin = f"BIGVIN{k}{i % 5:010d}"
                payload = f"{vin}:{i}:".encode() + os.urandom(PAYLOAD)
                sent.setdefault(vin, []).append(payload)
                packets.append(Publish(f"ecp/{vin}/response", payload, 1, False, False, i + 1))
            c.send(*packets)  # all at once: no PUBACK awaited in between
        for c in clients:
            acks = [c.expect(Puback, timeout=60).packet_id for _ in range(PER_CLIENT)]
            assert acks == list(range(1, PER_CLIENT + 1))  # in publish order
    finally:
        for c in clients:
            c.disconnect()
    got: dict[str, list[bytes]] = {}
    consume(ControllerSource(fanout.controller), "responses", "big", start="earliest",
            emit=lambda _p, e: got.setdefault(e[2].split("/")[1], []).append(e[5]))
    assert got == sent  # every payload whole, per vehicle in publish order
    h = ray.get(fanout.controller.handles.remote(), timeout=30)
    for k, d in enumerate(h["dispatchers"]):
        replica = next(iter(h["replicas"][k].values()))
        primary = ray.get(d.__ray_call__.remote(lambda self: table_digests(self.store)), timeout=30)
        # acknowledged = on the replica already (min_replicas_to_ack = 1): equal at once, no waiting
        assert ray.get(replica.digests.remote(), timeout=30) == primary, f"shard {k}: replica differs"
