"""Request lifecycle against a running embedded cluster: status counters, cancel and ttl, over the HTTP API,
the Controller calls ``fanout requests`` makes, ``/metrics`` (parsed with ``prometheus_client.parser``) and a dispatcher
restart (the counters are in the store)."""
from __future__ import annotations

import time

import pytest
import ray

from .fanout_harness import Vehicle, publish_batch, running_cluster, wait_until
from .http_fixtures import fetch, http_config, metric_sum, metric_values


@pytest.fixture(scope="module")
def cluster(ray_local, tmp_path_factory):
    with running_cluster(http_config(tmp_path_factory.mktemp("lifecycle"))) as c:
        yield c


def api(cluster, path: str, method: str = "GET"):
    body = b"{}" if method == "POST" else None
    headers = {"Content-Type": "application/json"} if method == "POST" else None
    return fetch(cluster.info["http"] + path, method=method, body=body, headers=headers)


def status(cluster, request_id: str) -> dict:
    answer = api(cluster, f"api/requests/{request_id}")
    assert answer.status == 200, answer
    return answer.json()


def counts(s: dict) -> tuple:
    return tuple(s[k] for k in ("vins", "delivered", "pending", "inflight", "expired", "discarded", "cancelled"))


def test_cancel_stops_delivery_and_records_the_puback_in_flight(cluster):
    vins = ["CAN0", "CAN1", "CAN2"]
    publish_batch(cluster.port, vins, "cancel-me")
    wait_until(lambda: counts(status(cluster, "cancel-me")) == (3, 0, 3, 0, 0, 0, 0), 15, "3 VINs queued")
    holder = Vehicle(cluster.port, vins[0], manual_ack=True)
    late = None
    try:
        holder.heartbeat()
        msg = holder.next_message(30)  # in flight: not acknowledged yet
        wait_until(lambda: status(cluster, "cancel-me")["inflight"] == 1, 15, "the row in flight")
        cancelled = api(cluster, "api/requests/cancel-me/cancel", "POST")
        assert cancelled.status == 200 and counts(cancelled.json()) == (3, 0, 0, 1, 0, 0, 3)
        assert cancelled.json()["state"] == "cancelled"
        late = Vehicle(cluster.port, vins[1])
        late.heartbeat()
        late.no_message(1.5)  # nothing more of the request is delivered
        publish_batch(cluster.port, [vins[1], "CAN3"], "cancel-me")  # a cancel is final: a re-send queues nothing
        late.heartbeat()
        late.no_message(1.0)
        assert counts(status(cluster, "cancel-me"))[0] == 3
        holder.ack(msg)  # the in-flight one arrived: its PUBACK is recorded
        wait_until(lambda: counts(status(cluster, "cancel-me")) == (3, 1, 0, 0, 0, 0, 2), 15, "the late PUBACK")
    finally:
        holder.close()
        if late is not None:
            late.close()
    again = api(cluster, "api/requests/cancel-me/cancel", "POST")  # idempotent
    assert again.status == 200 and counts(again.json()) == (3, 1, 0, 0, 0, 0, 2)
    assert api(cluster, "api/requests/never-sent/cancel", "POST").status == 404
    assert counts(ray.get(cluster.controller.request_status.remote("cancel-me"))) == (3, 1, 0, 0, 0, 0, 2)


def test_ttl_expires_rows_not_delivered_in_time(cluster):
    publish_batch(cluster.port, ["TTL0", "TTL1"], "short-lived", ttl="2s")
    publish_batch(cluster.port, ["TTL0"], "long-lived", data_id="d2", ttl=3600)
    time.sleep(2.5)
    car = Vehicle(cluster.port, "TTL0")
    try:
        car.heartbeat()
        msg = car.next_message(30)
        assert msg.topic == "agent/TTL0/proxy/request/long-lived"  # the lapsed row was skipped, not sent
    finally:
        car.close()
    wait_until(lambda: status(cluster, "short-lived")["expired"] == 1, 15, "the picked row counted expired")
    s = status(cluster, "short-lived")
    assert counts(s) == (2, 0, 1, 0, 1, 0, 0) and s["expires_ms"] is not None
    # the GC cycle's expiry step settles the rest for good (called directly: the Spark part is not needed here)
    dispatchers = ray.get(cluster.controller.handles.remote())["dispatchers"]
    swept = ray.get([d.expire_sweep.remote() for d in dispatchers])
    assert sum(x["rows"] for x in swept) == 1
    assert counts(status(cluster, "short-lived")) == (2, 0, 0, 0, 2, 0, 0)
    assert status(cluster, "short-lived")["state"] == "expired"
    assert status(cluster, "long-lived")["delivered"] == 1


def test_list_metrics_and_a_dispatcher_restart(cluster):
    publish_batch(cluster.port, [f"LST{i}" for i in range(5)], "listed")
    listing = api(cluster, "api/requests?limit=1000")
    assert listing.status == 200
    by_id = {r["request_id"]: r for r in listing.json()["requests"]}
    assert counts(by_id["listed"]) == (5, 0, 5, 0, 0, 0, 0) and by_id["listed"]["state"] == "active"
    metrics = metric_values(api(cluster, "metrics").body.decode())
    states = {state: metric_sum(metrics, "fanout_requests", state=state)
              for state in ("active", "done", "cancelled", "expired")}
    expected = {s: sum(1 for r in by_id.values() if r["state"] == s) for s in states}
    assert states == expected and states["active"] >= 1
    # the counters live in the store: a dispatcher killed and restarted by Ray answers the same
    before = {rid: counts(r) for rid, r in by_id.items()}
    for d in ray.get(cluster.controller.handles.remote())["dispatchers"]:
        ray.kill(d, no_restart=False)
    wait_until(lambda: {r["request_id"]: counts(r) for r in api(cluster, "api/requests?limit=1000").json()
                        .get("requests", [])} == before, 60, "the same counters after the restart")


def test_platform_client_status_and_cancel_over_mqtt(cluster, tmp_path):
    from fanout.client import SyncFanoutClient

    client = SyncFanoutClient(port=cluster.port, username="platform", password="platform", outbox_dir=tmp_path / "ob")
    client.start()
    try:
        client.submit(["CLI0", "CLI1"], b"BLOB", request_id="by-client", data_id="d-client").acked(timeout=30)
        before = client.status("by-client")
        assert counts(before) == (2, 0, 2, 0, 0, 0, 0) and before["state"] == "active"
        assert client.status().connected  # without an argument: the client's own status, as before
        after = client.cancel("by-client")
        assert counts(after) == (2, 0, 0, 0, 0, 0, 2) and after["state"] == "cancelled"
        assert client.status("unknown-request") is None and client.cancel("unknown-request") is None
        assert counts(status(cluster, "by-client")) == counts(after)  # the HTTP API sees the same
    finally:
        client.close()
