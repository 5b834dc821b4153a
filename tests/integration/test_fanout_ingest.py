"""End to end on one local Ray: ingest validation, idempotency, status/inspect, $SYS and the metrics table."""
from __future__ import annotations

import json

import pytest
import ray

from .fanout_harness import (
    Puback, Publish, RawClient, Vehicle, fanout_config, platform, publish_batch, running_cluster, trigger_payload,
    wait_until,
)


@pytest.fixture(scope="module")
def fanout(ray_local, tmp_path_factory):
    with running_cluster(fanout_config(tmp_path_factory.mktemp("ingest"))) as cluster:
        yield cluster


def rejected(fanout, client_id: str, payload: bytes, *, blob_first: bool = True) -> dict:
    """Publish ``payload`` as a trigger; return the JSON error, asserting the connection was closed."""
    p = platform(fanout.port, client_id)
    p.subscribe(f"$SDV-FANOUT/errors/{client_id}")
    if blob_first:
        p.publish("$SDV-FANOUT/data/known-blob", b"K", pid=1)
        assert p.expect(Puback).packet_id == 1
    p.publish("$SDV-FANOUT/trigger", payload, pid=2)
    error = p.expect(Publish, timeout=15)
    assert error.topic == f"$SDV-FANOUT/errors/{client_id}"
    assert p.recv(10) is None, "the publisher's connection must be closed after the error"
    body = json.loads(error.payload)
    assert body["client_id"] == client_id and body["packet_id"] == 2
    return body


@pytest.mark.parametrize("payload, field", [
    (b"this is not json", "payload"),
    (b'{"ids": ["INV1"], "request_id": "inv-1"}', "data_id"),
    (b'{"ids": "INV1", "request_id": "inv-2", "data_id": "known-blob"}', "ids"),
    (b'{"ids": ["INV1", "bad vin"], "request_id": "inv-3", "data_id": "known-blob"}', "ids[1]"),
    (b'{"ids": ["INV1"], "request_id": "inv-4", "data_id": "known-blob", "extra": 1}', "extra"),
])
def test_invalid_trigger_disconnects_publisher_writes_nothing_and_publishes_error(fanout, payload, field):
    body = rejected(fanout, "platform-invalid", payload)
    assert body["error"] == "invalid_trigger" and body["field"] == field
    for rid in ("inv-1", "inv-2", "inv-3", "inv-4"):
        assert fanout.inspect("request", rid)["rows"] == 0
    assert fanout.inspect("vin", "INV1")["pending_rows"] == 0


def test_unknown_data_id_is_rejected_before_anything_is_queued(fanout):
    body = rejected(fanout, "platform-unknown", trigger_payload(["UNK1", "UNK2", "UNK3"], "unk-1", "never-published"),
                    blob_first=False)
    assert body["field"] == "data_id" and "unknown data_id" in body["reason"] and body["request_id"] == "unk-1"
    assert fanout.inspect("request", "unk-1")["rows"] == 0
    assert fanout.inspect("data", "never-published")["present_on_shards"] == 0


def test_same_trigger_twice_queues_nothing_twice(fanout):
    vins = ["IDEM1", "IDEM2", "IDEM3"]
    publish_batch(fanout.port, vins, "idem-1", data_id="idem-blob")
    publish_batch(fanout.port, vins, "idem-1", data_id="idem-blob")
    assert fanout.inspect("request", "idem-1")["by_status"] == {"pending": 3}
    assert [fanout.inspect("vin", v)["pending_rows"] for v in vins] == [1, 1, 1]
    meta = fanout.inspect("data", "idem-blob")
    assert meta["present_on_shards"] == meta["shards"] == 2 and meta["meta"]["size"] == 4


def test_duplicate_vins_in_one_trigger_queue_once(fanout):
    publish_batch(fanout.port, ["DUPV1", "DUPV1", "DUPV2"], "dupv-1")
    assert fanout.inspect("request", "dupv-1")["rows"] == 2


def test_status_reports_nodes_shards_and_totals(fanout):
    publish_batch(fanout.port, ["STAT1", "STAT2"], "stat-1")
    car = Vehicle(fanout.port, "STAT1")
    try:
        car.heartbeat()
        car.next_message()
        wait_until(lambda: fanout.status()["totals"]["delivered"] >= 1, 10, "a delivery counted in status")
        st = fanout.status()
        assert [n["port"] for n in st["nodes"]] == [fanout.port]
        assert st["nodes"][0]["connections"] >= 1 and st["nodes"][0]["alive"]
        assert len(st["shards"]) == 2 and all(s["alive"] and s["applied_seq"] > 0 for s in st["shards"])
        assert st["totals"]["pending_rows"] >= 1 and st["totals"]["data_blobs"] >= 1
        assert set(st["shards"][0]) >= {"pending_rows", "in_flight", "delivered", "applied_seq"}
    finally:
        car.close()


def test_sys_fanout_topics_are_published_and_every_sys_value_lands_in_metrics(fanout):
    watcher = RawClient(fanout.port, "sys-watcher")
    try:
        values = ray.get(fanout.controller.publish_sys.remote(), timeout=30)
        assert set(values) >= {"$SYS/fanout/pending", "$SYS/fanout/inflight", "$SYS/fanout/delivered",
                               "$SYS/fanout/data_blobs"}
        watcher.subscribe("$SYS/fanout/#")
        seen = {}
        while "$SYS/fanout/pending" not in seen:  # retained, published with the node's next $SYS tick
            msg = watcher.expect(Publish, timeout=15)
            seen[msg.topic] = msg.payload
        assert int(seen["$SYS/fanout/pending"]) >= 0
        handles = ray.get(fanout.controller.handles.remote())
        metrics = {m["name"]: m["value"] for m in ray.get(handles["dispatchers"][0].metrics.remote())}
        assert "$SYS/fanout/pending" in metrics
        assert "$SYS/broker/clients/connected@n0" in metrics and "$SYS/broker/uptime@n0" in metrics
    finally:
        watcher.disconnect()


def test_inspect_rejects_an_invalid_vin(fanout):
    with pytest.raises(ray.exceptions.RayTaskError, match="vin"):
        fanout.inspect("vin", "bad\x00vin")
