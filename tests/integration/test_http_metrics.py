"""``/metrics`` and the JSON API against a running embedded cluster (development mode: loopback, no users).

The metric values are compared with what ``fanout status`` reports (``Controller.status``, the call the
command makes), shard by shard and node by node, once ingest, a delivery and a refused login happened.
"""
from __future__ import annotations

import socket
import statistics
import time
from pathlib import Path

import pytest
import ray

from actors.controller import STATUS_TIMEOUT_S
from fanout.mqtt.codec import PacketReader, encode
from fanout.mqtt.packets import Connack, Connect

from .fanout_harness import Vehicle, publish_batch, running_cluster, wait_until
from .http_fixtures import fetch, http_config, metric_sum, metric_values

ROOT = Path(__file__).resolve().parents[2]
VINS = [f"MET{i}" for i in range(4)]
REQUEST = "metrics-req-1"


@pytest.fixture(scope="module")
def cluster(ray_local, tmp_path_factory):
    with running_cluster(http_config(tmp_path_factory.mktemp("http-metrics"))) as c:
        publish_batch(c.port, VINS, REQUEST)
        car = Vehicle(c.port, VINS[0])
        try:
            car.heartbeat()
            car.next_message(30)  # paho acknowledges it
            wait_until(lambda: c.status()["totals"]["delivered"] == 1 and c.status()["totals"]["in_flight"] == 0,
                       30, "the first delivery acknowledged")
            yield c  # the car stays connected for the whole module: one connection to count
        finally:
            car.close()


def scrape(cluster) -> dict:
    answer = fetch(cluster.info["http"] + "metrics")
    assert answer.status == 200 and answer.headers["content-type"].startswith("text/plain"), answer
    return metric_values(answer.body.decode())


def _disagreements(cluster) -> list[str]:
    """Where /metrics and ``fanout status`` differ (both read now, one after the other)."""
    m = scrape(cluster)
    st = cluster.status()
    bad = []

    def same(what: str, metric: float, status_value: float) -> None:
        if metric != status_value:
            bad.append(f"{what}: metrics {metric} != status {status_value}")

    for s in st["shards"]:
        k = str(s["shard"])
        same(f"shard {k} pending", metric_sum(m, "fanout_pending_rows", shard=k), s["pending_rows"])
        same(f"shard {k} inflight", metric_sum(m, "fanout_inflight", shard=k), s["in_flight"])
        same(f"shard {k} delivered", metric_sum(m, "fanout_deliveries_total", shard=k), s["delivered"])
        same(f"shard {k} ingest rows", metric_sum(m, "fanout_ingest_rows_total", shard=k), s["rows_enqueued"])
        same(f"shard {k} blobs", metric_sum(m, "fanout_data_blobs", shard=k), s["data_blobs"])
        same(f"shard {k} applied seq", metric_sum(m, "fanout_shard_applied_seq", shard=k), s["applied_seq"])
        same(f"shard {k} up", metric_sum(m, "fanout_shard_up", shard=k), 1)
    for r in st["replication"]:
        for rep in r["replicas"]:
            labels = {"shard": str(r["shard"]), "replica": rep["id"], "node": rep["node"]}
            same(f"lag {labels}", metric_sum(m, "fanout_replication_lag", **labels), rep["lag"])
    for n in st["nodes"]:
        node = n["node_id"]
        same(f"{node} connections", metric_sum(m, "fanout_connections", node=node), n["connections"])
        same(f"{node} $SYS clients", metric_sum(m, "fanout_broker_clients_connected", node=node), n["connections"])
        same(f"{node} auth failures", metric_sum(m, "fanout_auth_failures_total", node=node, listener="mqtt"),
             n["auth_failures"])
        same(f"{node} up", metric_sum(m, "fanout_node_up", node=node), 1)
    t = st["totals"]
    same("total pending", metric_sum(m, "fanout_pending_rows"), t["pending_rows"])
    same("total delivered", metric_sum(m, "fanout_deliveries_total"), t["delivered"])
    same("total connections", metric_sum(m, "fanout_connections"), t["connections"])
    return bad


def test_metrics_parse_and_agree_with_fanout_status(cluster):
    wait_until(lambda: not _disagreements(cluster), 20, "/metrics to agree with fanout status")
    m = scrape(cluster)
    assert metric_sum(m, "fanout_pending_rows") == len(VINS) - 1
    assert metric_sum(m, "fanout_deliveries_total") == 1
    assert metric_sum(m, "fanout_ingest_rows_total") == len(VINS)
    assert metric_sum(m, "fanout_inflight") == 0
    assert metric_sum(m, "fanout_connections") == 1
    shards = cluster.info["shards"]
    assert {dict(ls)["shard"] for (name, ls) in m if name == "fanout_pending_rows"} == {str(k) for k in range(shards)}
    assert {dict(ls)["node"] for (name, ls) in m if name == "fanout_connections"} == {"n0"}
    # the $SYS tree of each node, with the node label
    assert metric_sum(m, "fanout_broker_publish_received_total", node="n0") >= 3  # blob, trigger, heartbeat
    assert metric_sum(m, "fanout_broker_uptime_seconds", node="n0") >= 0
    assert metric_sum(m, "fanout_broker_info", node="n0") == 1
    # the hot calls went over the direct channels: the shards served the node's events and ingest, the node
    # the deliveries; none was refused and none fell back to Ray
    assert m[("fanout_channel_requests_total", frozenset({("node", "n0")}))] > 0  # the node's own (no shard label)
    assert all(metric_sum(m, "fanout_channel_requests_total", shard=str(k)) > 0 for k in range(shards))
    assert metric_sum(m, "fanout_channel_refused_total") == 0 and metric_sum(m, "fanout_channel_fallbacks_total") == 0
    assert ("fanout_gc_cycles_total", frozenset({("result", "ok")})) in m
    assert ("fanout_gc_cycle_duration_seconds_count", frozenset()) in m
    states = {dict(labels)["state"]: v for (name, labels), v in m.items() if name == "fanout_requests"}
    assert states == {"active": 1, "done": 0, "cancelled": 0, "expired": 0}  # REQUEST: 1 of 4 delivered


def test_refused_mqtt_login_counts_as_an_auth_failure(cluster):
    before = metric_sum(scrape(cluster), "fanout_auth_failures_total", listener="mqtt")
    with socket.create_connection(("127.0.0.1", cluster.port), timeout=10) as sock:
        sock.sendall(encode(Connect("bad-login", True, 30, "nobody", b"wrong", None)))
        reader, packets = PacketReader(), []
        while not packets:
            packets = reader.feed(sock.recv(4096))
    assert isinstance(packets[0], Connack) and packets[0].return_code == 4
    wait_until(lambda: metric_sum(scrape(cluster), "fanout_auth_failures_total", listener="mqtt") == before + 1,
               10, "the refused login counted")
    assert _disagreements(cluster) == []


def test_api_status_is_what_fanout_status_prints(cluster):
    wait_until(lambda: fetch(cluster.info["http"] + "api/status").json()["totals"] == cluster.status()["totals"],
               20, "/api/status totals to equal fanout status totals")
    api = fetch(cluster.info["http"] + "api/status")
    assert api.status == 200 and api.headers["content-type"].startswith("application/json")
    assert api.headers["cache-control"] == "no-store" and api.headers["x-content-type-options"] == "nosniff"
    body, st = api.json(), cluster.status()
    assert set(body) == set(st)
    assert [n["node_id"] for n in body["nodes"]] == [n["node_id"] for n in st["nodes"]]
    assert [s["pending_rows"] for s in body["shards"]] == [s["pending_rows"] for s in st["shards"]]
    assert body["replication"] == st["replication"]


def test_api_request_answers_from_the_lifecycle_counters(cluster):
    base = cluster.info["http"]
    one = fetch(base + f"api/requests/{REQUEST}")
    assert one.status == 200
    assert one.json() == {**one.json(), "request_id": REQUEST, "vins": len(VINS), "delivered": 1,
                          "pending": len(VINS) - 1, "inflight": 0, "expired": 0, "cancelled": 0, "state": "active"}
    assert one.json()["vins"] == cluster.inspect("request", REQUEST)["rows"]
    missing = fetch(base + "api/requests/no-such-request")
    assert missing.status == 404 and "no-such-request" in missing.json()["error"]
    assert fetch(base + "api/requests/" + "x" * 2000).status == 400  # longer than a request id may be
    listing = fetch(base + "api/requests")
    assert listing.status == 200 and [r["request_id"] for r in listing.json()["requests"]] == [REQUEST]
    assert fetch(base + "api/requests?limit=0").status == 400
    cancel = fetch(base + "api/requests/no-such-request/cancel", method="POST", body=b"{}",
                   headers={"Content-Type": "application/json"})
    assert cancel.status == 404  # cancelling REQUEST itself is tests/integration/test_request_lifecycle.py
    assert fetch(base + "api/nothing-here").status == 404


def test_metrics_scrapes_answer_without_waiting_for_a_timeout(cluster):
    """Thirty scrapes in a row all answer, none held up by an actor call running into its timeout.

    The issue-15 figure (<= 50 ms with 1,000 requests known) is measured by ``benchmarks/metrics_bench.py``,
    not here: this used to assert a 50 ms median, which measured the machine rather than the code (17 ms in
    the full suite on an otherwise idle 2-core machine, 76 ms with a 40 ms minimum on a busier CI host).
    What a test can hold the code to is that no scrape waits out ``STATUS_TIMEOUT_S`` while every actor is
    alive, which is how a broken gathering path (a dead handle, a sequential call chain) would show.
    """
    fetch(cluster.info["http"] + "metrics")  # warm
    took = []
    for _ in range(30):
        started = time.perf_counter()
        assert fetch(cluster.info["http"] + "metrics").status == 200
        took.append(time.perf_counter() - started)
    took.sort()
    print(f"/metrics over 30 scrapes: median {statistics.median(took) * 1000:.1f} ms, "
          f"max {took[-1] * 1000:.1f} ms")
    assert took[-1] < STATUS_TIMEOUT_S, took
    collect = metric_sum(scrape(cluster), "fanout_metrics_collect_seconds")
    assert 0 < collect < STATUS_TIMEOUT_S, collect  # the controller's own gathering time, also reported


@pytest.mark.slow
def test_a_gc_cycle_shows_in_the_gc_metrics(cluster):
    """One real GC cycle run by the controller (it starts Spark in its own process: slow)."""
    summary = ray.get(cluster.controller.run_gc.remote(True), timeout=600)
    m = scrape(cluster)
    assert metric_sum(m, "fanout_gc_cycles_total", result="ok") == 1
    assert metric_sum(m, "fanout_gc_cycles_total", result="failed") == 0
    assert metric_sum(m, "fanout_gc_cycle_duration_seconds_count") == 1
    assert metric_sum(m, "fanout_gc_cycle_duration_seconds_sum") == pytest.approx(summary["stage_s"]["total"])
    assert metric_sum(m, "fanout_gc_last_cycle_stage_seconds", stage="export") > 0
    assert metric_sum(m, "fanout_gc_deleted_total") == summary.get("deleted", 0)


def test_the_grafana_dashboard_and_scrape_config_use_what_metrics_serve(cluster):
    import json
    import re

    import yaml

    from fanout.config import SCHEMA

    from prometheus_client.parser import text_string_to_metric_families

    text = fetch(cluster.info["http"] + "metrics").body.decode()
    families = list(text_string_to_metric_families(text))  # a family without samples yet (GC stages) counts
    served = {f.name for f in families} | {s.name for f in families for s in f.samples}
    dashboard = json.loads((ROOT / "cluster" / "grafana-dashboard.json").read_text())
    exprs = [t["expr"] for p in dashboard["panels"] for t in p.get("targets", [])]
    used = {name for e in exprs for name in re.findall(r"\bfanout_[a-z_]+", e)}
    assert used - served == set(), sorted(used - served)  # every metric the dashboard uses is served
    assert "fanout_requests" in used and len(exprs) >= 20
    scrape_config = yaml.safe_load((ROOT / "cluster" / "prometheus.yml").read_text())
    job = scrape_config["scrape_configs"][0]
    assert job["metrics_path"] == "/metrics"
    assert job["static_configs"][0]["targets"] == [f"{SCHEMA['http']['host'].default}:{SCHEMA['http']['port'].default}"]
