"""Durable topics on a real cluster (the shared local Ray): publishes with paho and mosquitto_pub appended, read
back by consumer groups through the dispatchers' read/commit calls (what ``fanout consume`` runs), topics created
at run time, ``fanout consume --data-dir`` on the stopped cluster, and logs and offsets across a whole-cluster
restart.
"""
from __future__ import annotations

import dataclasses
import json
import shutil
import subprocess
import sys
import time

import paho.mqtt.client as mqtt
import pytest
import ray

from cluster.cli.consume import ControllerSource
from fanout.mqtt.packets import Puback, Publish
from fanout.topics.consume import consume
from storage.topics import TopicSpec, partition_for

from .fanout_harness import RawClient, fanout_config, running_cluster, wait_until

RESPONSES = TopicSpec.build("responses", "ecp/+/response")
REPO_PY = sys.executable


def _read(cluster, group, **kw):
    got = []
    result = consume(ControllerSource(cluster.controller), "responses", group, emit=lambda p, e: got.append((p, e)),
                     **kw)
    return got, result


def _payloads(got, vin=None):
    return [e[5] for _p, e in got if vin is None or e[3] == vin or f"/{vin}/" in e[2]]


@pytest.fixture(scope="module")
def tmp_data(tmp_path_factory):
    return tmp_path_factory.mktemp("topics")


@pytest.fixture(scope="module")
def cfg(tmp_data):
    return dataclasses.replace(fanout_config(tmp_data), topics=(RESPONSES,))


@pytest.fixture(scope="module")
def fanout(ray_local, cfg):
    with running_cluster(cfg) as cluster:
        yield cluster


def _paho_publish(port, client_id, topic, payloads, qos=1):
    c = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2, client_id=client_id, protocol=mqtt.MQTTv311)
    c.connect("127.0.0.1", port, keepalive=30)
    c.loop_start()
    try:
        for p in payloads:
            c.publish(topic, p, qos=qos).wait_for_publish(15)
    finally:
        c.disconnect()
        c.loop_stop()


def test_paho_and_mosquitto_pub_publishes_are_appended_and_read_back(fanout):
    _paho_publish(fanout.port, "VINPAHO0000000001", "ecp/VINPAHO0000000001/response", [b"p1", b"p2", b"p3"])
    mosq = shutil.which("mosquitto_pub")
    if mosq is None:
        pytest.skip("mosquitto_pub is not installed (make mosquitto)")
    r = subprocess.run([mosq, "-h", "127.0.0.1", "-p", str(fanout.port), "-i", "VINMOSQ0000000001", "-q", "1",
                        "-t", "ecp/VINMOSQ0000000001/response", "-m", "from mosquitto"], capture_output=True, timeout=30)
    assert r.returncode == 0, r.stderr
    got, _ = _read(fanout, "readers", start="earliest")
    assert _payloads(got, "VINPAHO0000000001") == [b"p1", b"p2", b"p3"]
    assert _payloads(got, "VINMOSQ0000000001") == [b"from mosquitto"]
    p = partition_for(RESPONSES, "ecp/VINPAHO0000000001/response", "VINPAHO0000000001", 2)
    assert {q for q, e in got if e[3] == "VINPAHO0000000001"} == {p}
    # a topic no durable topic matches is not kept
    _paho_publish(fanout.port, "client-x", "ecp/VINPAHO0000000001/heartbeat", [b"hb"])
    assert b"hb" not in _payloads(_read(fanout, "readers2", start="earliest")[0])


def test_puback_comes_after_the_append(fanout):
    c = RawClient(fanout.port, "VINPUBACK00000001")
    try:
        before = {t["name"]: t["high"] for t in ray.get(fanout.controller.list_topics.remote())}["responses"]
        c.send(Publish("ecp/VINPUBACK00000001/response", b"durable?", 1, False, False, 5))
        ack = c.expect(Puback, timeout=30)
        assert ack.packet_id == 5
        # when the PUBACK is here the entry is in the log (the dispatcher answered after its replicated commit)
        after = {t["name"]: t["high"] for t in ray.get(fanout.controller.list_topics.remote())}["responses"]
        assert after == before + 1
    finally:
        c.disconnect()


def test_latest_offset_ack_groups_and_redelivery(fanout):
    """One partition (a topic created for this test), so every offset is known."""
    ray.get(fanout.controller.create_topic.remote("gtest", "gtest/+/r", 1))
    src = ControllerSource(fanout.controller)

    def read(group, **kw):
        got = []
        consume(src, "gtest", group, emit=lambda p, e: got.append((e[0], e[5])), **kw)
        return got

    assert read("late") == []  # latest (the default): nothing yet, and nothing committed
    _paho_publish(fanout.port, "VINGROUPS00000001", "gtest/VINGROUPS00000001/r", [f"m{i}".encode() for i in range(10)])
    everything = [(i, f"m{i}".encode()) for i in range(10)]
    assert read("late") == []  # still no commits: latest is after m9
    assert read("g-noack", start="earliest") == everything
    assert read("g-noack", start="earliest") == everything  # no ack: the same messages again (a crashed consumer)
    assert read("g-ack", start=4, limit=3, ack=True) == everything[4:7]
    assert read("g-ack", start="earliest", ack=True) == everything[7:]  # resumes after what it acknowledged
    assert read("g-ack", start="earliest") == []
    assert read("g-noack", start="earliest") == everything  # groups are independent
    shown = ray.get(fanout.controller.show_topic.remote("gtest"))
    assert shown["high"] == 10 and shown["partitions"] == [{"partition": 0, "low": 0, "next": 10}]
    assert [(g["group"], g["committed"], g["lag"]) for g in shown["groups"]] == [("g-ack", 10, 0)]


def test_per_vehicle_order_with_many_publishers(fanout):
    vins = [f"VINORDER000000{i:03d}" for i in range(6)]
    import threading

    threads = [threading.Thread(target=_paho_publish, args=(fanout.port, v, f"ecp/{v}/response",
                                                            [f"{v}:{i}".encode() for i in range(40)]))
               for v in vins]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    got, _ = _read(fanout, "order", start="earliest")
    for v in vins:
        assert _payloads(got, v) == [f"{v}:{i}".encode() for i in range(40)]


def test_topic_created_at_run_time_is_appended_and_status_and_sys_show_it(fanout):
    info = ray.get(fanout.controller.create_topic.remote("plant", "plant/+/temp", 0, "1h", "10MiB"))
    assert info["name"] == "plant" and info["high"] == 0 and len(info["partitions"]) == 2
    with pytest.raises(ray.exceptions.RayTaskError, match="never changes"):
        ray.get(fanout.controller.create_topic.remote("plant", "plant/+/temp", 3))
    _paho_publish(fanout.port, "sensor-1", "plant/line1/temp", [b"21.5"])
    got = []
    consume(ControllerSource(fanout.controller), "plant", "ops", start="earliest", ack=True,
            emit=lambda p, e: got.append(e))
    assert [(e[2], e[5]) for e in got] == [("plant/line1/temp", b"21.5")]
    status = fanout.status()
    plant = next(t for t in status["topics"] if t["name"] == "plant")
    assert plant["high"] == 1
    values = ray.get(fanout.controller.publish_sys.remote())
    assert values["$SYS/fanout/topics/plant/high"] == 1
    assert (values["$SYS/fanout/topics/plant/groups/ops/committed"], values["$SYS/fanout/topics/plant/groups/ops/lag"]) == (1, 0)


def test_logs_and_offsets_survive_a_whole_cluster_restart_and_consume_data_dir(fanout, cfg, tmp_data):
    vin = "VINRESTART0000001"
    _paho_publish(fanout.port, vin, f"ecp/{vin}/response", [b"r1", b"r2", b"r3"])
    _read(fanout, "restart", start="earliest", ack=True)
    _paho_publish(fanout.port, vin, f"ecp/{vin}/response", [b"r4"])
    before = ray.get(fanout.controller.show_topic.remote("responses"))
    fanout.stop(shutdown_ray=False)  # the whole cluster (the module fixture's stop after this is harmless)
    data_dir = cfg.storage.data_dir
    # the stopped cluster's stores, read with the real command line (no Ray: the data dir lock is free)
    r = subprocess.run([REPO_PY, "-m", "cluster.cli", "consume", "responses", "--group", "restart", "--json",
                        "--data-dir", data_dir], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr[-2000:]
    lines = [json.loads(line) for line in r.stdout.splitlines()]
    assert [(x["mqtt_topic"], x["payload"]) for x in lines] == [(f"ecp/{vin}/response", "r4")]
    assert set(lines[0]) == {"topic", "partition", "offset", "ts_ms", "mqtt_topic", "client_id", "payload"}
    with running_cluster(cfg) as again:
        after = ray.get(again.controller.show_topic.remote("responses"))
        assert after["partitions"] == before["partitions"] and after["groups"] == before["groups"]
        got, _ = _read(again, "restart", start="earliest", ack=True)
        assert [e[5] for _q, e in got] == [b"r4"]  # resumes after the commits made before the restart
        _paho_publish(again.port, vin, f"ecp/{vin}/response", [b"r5"])  # appends continue the offsets
        got, _ = _read(again, "restart", start="earliest")
        assert [(e[0], e[5]) for _q, e in got] == [(got[0][1][0], b"r5")]
        assert got[0][1][0] == max(x["next"] for x in after["partitions"] if x["partition"] == got[0][0])
