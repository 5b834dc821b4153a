"""cluster.http.metrics: a snapshot rendered as Prometheus text, read back with prometheus_client.parser."""
from __future__ import annotations

from prometheus_client.parser import text_string_to_metric_families

from cluster.http.metrics import render


def samples(snapshot: dict) -> dict[tuple[str, frozenset], float]:
    return {(s.name, frozenset(s.labels.items())): s.value
            for f in text_string_to_metric_families(render(snapshot).decode()) for s in f.samples}


SHARD = {"shard": 0, "alive": True, "pending_rows": 7, "in_flight": 1, "delivered": 5, "rows_enqueued": 13,
         "connected": 2, "data_blobs": 1, "requests_rows": 13, "used_bytes": 4096, "applied_seq": 21,
         "channel": {"connections": 1, "refused": 2, "requests": 40, "protocol_errors": 0, "tls_failed": 4}, "channel_fallbacks": 3}
NODE = {"node_id": "n0", "alive": True, "connections": 3, "sessions": 4, "triggers": 2, "blobs": 2, "rejected": 1,
        "auth_failures": 6, "channel": None, "channel_fallbacks": 0}  # channels off on this node
REPLICATION = [{"shard": 0, "epoch": 2, "primary": {"node": "n1", "alive": True}, "failing_over": False,
                "replicas": [{"id": "r0", "node": "n0", "lag": 3, "in_sync": False}]},
               {"shard": 1, "epoch": 1, "primary": {"node": "n0", "alive": False}, "replicas": []}]


def snapshot(**extra) -> dict:
    status = {"shards": [SHARD, {"shard": 1, "alive": False, "error": "timeout"}],
              "nodes": [NODE, {"node_id": "n1", "alive": False, "error": "dead"}], "replication": REPLICATION}
    return {"status": status, "sys": {}, "gc": {}, **extra}


def test_shard_figures_carry_shard_and_primary_node_labels():
    m = samples(snapshot())
    at = frozenset({("shard", "0"), ("node", "n1")})
    assert m[("fanout_pending_rows", at)] == 7 and m[("fanout_deliveries_total", at)] == 5
    assert m[("fanout_ingest_rows_total", at)] == 13 and m[("fanout_inflight", at)] == 1
    assert m[("fanout_shard_up", at)] == 1 and m[("fanout_shard_up", frozenset({("shard", "1"), ("node", "n0")}))] == 0
    # a shard that did not answer has no figures, only up = 0
    assert [k for k in m if k[0] == "fanout_pending_rows"] == [("fanout_pending_rows", at)]
    assert m[("fanout_replication_lag", frozenset({("shard", "0"), ("replica", "r0"), ("node", "n0")}))] == 3
    assert m[("fanout_replica_in_sync", frozenset({("shard", "0"), ("replica", "r0"), ("node", "n0")}))] == 0


def test_node_figures_and_auth_failures_per_listener():
    m = samples(snapshot(http_auth_failures=4))
    assert m[("fanout_connections", frozenset({("node", "n0")}))] == 3
    assert m[("fanout_node_up", frozenset({("node", "n1")}))] == 0
    assert ("fanout_connections", frozenset({("node", "n1")})) not in m
    assert m[("fanout_auth_failures_total", frozenset({("node", "n0"), ("listener", "mqtt")}))] == 6
    assert m[("fanout_auth_failures_total", frozenset({("node", "controller"), ("listener", "http")}))] == 4


def test_sys_tree_per_node_known_names_and_new_topics_as_gauges():
    tree = {"$SYS/broker/version": "sdv-fanout 0.1.0", "$SYS/broker/uptime": "42 seconds",
            "$SYS/broker/messages/received": 10, "$SYS/broker/retained messages/count": 2,
            "$SYS/broker/limits/offline queue/hit": 3, "$SYS/broker/odd": "not a number",
            "$SYS/fanout/pending": 99}
    m = samples(snapshot(sys={"n0": tree}))
    n0 = frozenset({("node", "n0")})
    assert m[("fanout_broker_uptime_seconds", n0)] == 42
    assert m[("fanout_broker_messages_received_total", n0)] == 10
    assert m[("fanout_broker_retained_messages", n0)] == 2
    assert m[("fanout_broker_limits_offline_queue_hit", n0)] == 3
    assert m[("fanout_broker_info", frozenset({("node", "n0"), ("version", "sdv-fanout 0.1.0")}))] == 1
    # "not a number" is left out; $SYS/fanout/... are the shard figures, not repeated per node
    assert {name for name, labels in m if ("node", "n0") in labels and name.startswith("fanout_broker")} == {
        "fanout_broker_uptime_seconds", "fanout_broker_messages_received_total", "fanout_broker_retained_messages",
        "fanout_broker_limits_offline_queue_hit", "fanout_broker_info"}


def test_gc_requests_and_collect_time():
    gc = {"ok": 2, "failed": 1, "seconds_sum": 30.5, "deleted": 9, "last_stage_s": {"export": 1.5, "total": 14.0}}
    m = samples(snapshot(gc=gc, requests={"pending": 3, "delivered": 5}, collect_s=0.012))
    assert m[("fanout_gc_cycles_total", frozenset({("result", "ok")}))] == 2
    assert m[("fanout_gc_cycles_total", frozenset({("result", "failed")}))] == 1
    assert m[("fanout_gc_cycle_duration_seconds_count", frozenset())] == 2
    assert m[("fanout_gc_cycle_duration_seconds_sum", frozenset())] == 30.5
    assert m[("fanout_gc_last_cycle_stage_seconds", frozenset({("stage", "export")}))] == 1.5
    assert m[("fanout_gc_deleted_total", frozenset())] == 9
    assert m[("fanout_requests", frozenset({("state", "pending")}))] == 3
    assert m[("fanout_metrics_collect_seconds", frozenset())] == 0.012
    assert not [k for k in samples(snapshot()) if k[0] == "fanout_requests"]  # absent until the lifecycle


def test_no_state_between_renders():
    first = samples(snapshot(http_auth_failures=1))
    second = samples(snapshot(http_auth_failures=5))
    key = ("fanout_auth_failures_total", frozenset({("node", "controller"), ("listener", "http")}))
    assert (first[key], second[key]) == (1, 5)


def test_direct_channel_figures_per_shard_and_node():
    m = samples(snapshot())
    at = frozenset({("shard", "0"), ("node", "n1")})
    assert m[("fanout_channel_requests_total", at)] == 40 and m[("fanout_channel_refused_total", at)] == 2
    assert m[("fanout_channel_protocol_errors_total", at)] == 0 and m[("fanout_channel_fallbacks_total", at)] == 3
    assert m[("fanout_channel_tls_failed_total", at)] == 4
    n0 = frozenset({("node", "n0")})
    assert m[("fanout_channel_fallbacks_total", n0)] == 0
    assert ("fanout_channel_requests_total", n0) not in m  # channels off there: no figure rather than a 0


def test_tls_handshake_outcomes_are_per_node_families():
    tree = {"$SYS/broker/tls/handshakes/running": 2, "$SYS/broker/tls/handshakes/completed": 40,
            "$SYS/broker/tls/handshakes/failed/certificate": 3, "$SYS/broker/tls/handshakes/failed/protocol": 1,
            "$SYS/broker/tls/handshakes/abandoned": 5, "$SYS/broker/tls/handshakes/refused": 7}
    m = samples(snapshot(sys={"n0": tree}))
    n0 = frozenset({("node", "n0")})
    assert m[("fanout_broker_tls_handshakes_running", n0)] == 2
    assert m[("fanout_broker_tls_handshakes_completed_total", n0)] == 40
    assert m[("fanout_broker_tls_handshakes_failed_certificate_total", n0)] == 3
    assert m[("fanout_broker_tls_handshakes_failed_protocol_total", n0)] == 1
    assert m[("fanout_broker_tls_handshakes_abandoned_total", n0)] == 5
    assert m[("fanout_broker_tls_handshakes_refused_total", n0)] == 7


def test_https_listener_handshakes_by_outcome():
    figures = {"running": 1, "completed": 9, "abandoned": 2, "refused": 0, "failed/certificate": 0,
               "failed/protocol": 3}
    m = samples(snapshot(http_tls=figures))
    assert m[("fanout_http_tls_handshakes_total", frozenset({("outcome", "completed")}))] == 9
    assert m[("fanout_http_tls_handshakes_total", frozenset({("outcome", "failed/protocol")}))] == 3
    assert m[("fanout_http_tls_handshakes_running", frozenset())] == 1
    assert not [k for k in samples(snapshot()) if k[0].startswith("fanout_http_tls")]  # plain HTTP: none
