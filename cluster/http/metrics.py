"""``GET /metrics``: one cluster snapshot rendered in the Prometheus text exposition format.

Strategy: nothing here holds state between scrapes. The controller gathers a snapshot
(``Controller.metrics_snapshot``: the ``fanout status`` JSON, every node's ``$SYS`` tree, GC cycle
figures); :func:`render` registers one :class:`SnapshotCollector` over it in a fresh
``CollectorRegistry`` and returns ``generate_latest``. Counters are the processes' own counters (a
restarted dispatcher or node starts again from 0, which Prometheus' ``rate`` handles as a reset).

Labels: ``node`` (connection node id ``n0``...; for shard figures the node of the shard's primary),
``shard``, ``replica``, ``listener`` (``mqtt`` or ``http``), ``stage`` and ``result`` for GC.
Families (``_total`` is added by the exposition for counters):

- per shard: ``fanout_pending_rows``, ``fanout_inflight``, ``fanout_deliveries_total``,
  ``fanout_ingest_rows_total``, ``fanout_vehicles_connected``, ``fanout_data_blobs``,
  ``fanout_request_rows``, ``fanout_store_used_bytes``, ``fanout_shard_applied_seq``, ``fanout_shard_epoch``,
  ``fanout_shard_up``, ``fanout_replication_lag`` and ``fanout_replica_in_sync`` (per replica);
- per node: ``fanout_connections``, ``fanout_sessions``, ``fanout_node_up``, ``fanout_auth_failures_total``,
  ``fanout_ingest_triggers_total``, ``fanout_ingest_blobs_total``, ``fanout_ingest_rejected_total``, and the
  ``$SYS/broker/...`` tree as ``fanout_broker_*`` (see :data:`SYS_METRICS`; other numeric ``$SYS/broker``
  values appear as gauges named after their topic);
- GC: ``fanout_gc_cycles_total{result}``, ``fanout_gc_cycle_duration_seconds`` (summary of completed
  cycles), ``fanout_gc_last_cycle_stage_seconds{stage}``, ``fanout_gc_deleted_total``;
- per node and per shard: ``fanout_channel_requests_total``, ``fanout_channel_refused_total``,
  ``fanout_channel_tls_failed_total`` (TLS channels), ``fanout_channel_protocol_errors_total``,
  ``fanout_channel_fallbacks_total`` (the direct channels,
  :mod:`actors.channels`);
- ``fanout_http_tls_handshakes_total{outcome}`` and ``fanout_http_tls_handshakes_running``: the controller's
  HTTPS listener (``completed``, ``failed/certificate``, ``failed/protocol``, ``abandoned``, ``refused``);
- ``fanout_requests{state}``: requests per lifecycle state (``active``: rows pending; ``done``; ``cancelled``;
  ``expired``), from the per-request counters (:mod:`actors.requests`);
- ``fanout_metrics_collect_seconds``: how long gathering this snapshot took.
"""
from __future__ import annotations

import re
from typing import Any, Iterator

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric, SummaryMetricFamily

CONTENT_TYPE = CONTENT_TYPE_LATEST  # the format generate_latest writes

# (key in a shard's stats, family name, kind, help)
SHARD_FIGURES: tuple[tuple[str, str, str, str], ...] = (
    ("pending_rows", "fanout_pending_rows", "gauge", "Queued (VIN, request) rows not yet delivered (ids table)."),
    ("in_flight", "fanout_inflight", "gauge", "Fanout messages sent and not yet acknowledged."),
    ("delivered", "fanout_deliveries", "counter", "Fanout messages acknowledged by vehicles (PUBACK)."),
    ("rows_enqueued", "fanout_ingest_rows", "counter", "Rows queued by accepted triggers."),
    ("connected", "fanout_vehicles_connected", "gauge", "Vehicles connected and known to the shard's dispatcher."),
    ("data_blobs", "fanout_data_blobs", "gauge", "Data blobs stored in the shard."),
    ("requests_rows", "fanout_request_rows", "gauge", "Per-request status rows (reqs table)."),
    ("used_bytes", "fanout_store_used_bytes", "gauge", "Bytes used in the shard's LMDB map."),
    ("applied_seq", "fanout_shard_applied_seq", "gauge", "Sequence number of the last write batch applied."),
)
# (dotted key in a node's or shard's stats, family name, kind, help): the actor's direct channel (actors.channels)
CHANNEL_FIGURES: tuple[tuple[str, str, str, str], ...] = (
    ("channel.requests", "fanout_channel_requests", "counter", "Calls served over the actor's direct channel."),
    ("channel.refused", "fanout_channel_refused", "counter",
     "Direct-channel connections refused: no proof of the cluster secret, another service, handshake timeout."),
    ("channel.tls_failed", "fanout_channel_tls_failed", "counter",
     "Direct-channel TLS handshakes that did not complete: certificate, protocol, timeout, over the bound."),
    ("channel.protocol_errors", "fanout_channel_protocol_errors", "counter",
     "Direct-channel connections closed for a malformed or oversize frame."),
    ("channel_fallbacks", "fanout_channel_fallbacks", "counter",
     "Calls made as Ray calls because a direct channel could not carry them (callee restarting, over max_frame)."),
)
# (key in a node's stats, family name, kind, help)
NODE_FIGURES: tuple[tuple[str, str, str, str], ...] = (
    ("connections", "fanout_connections", "gauge", "Live MQTT connections."),
    ("sessions", "fanout_sessions", "gauge", "MQTT sessions held (connected and persistent offline)."),
    ("triggers", "fanout_ingest_triggers", "counter", "Triggers accepted."),
    ("blobs", "fanout_ingest_blobs", "counter", "Data blobs accepted."),
    ("rejected", "fanout_ingest_rejected", "counter", "Ingest publishes rejected (invalid input)."),
)
# $SYS/broker/<suffix> -> (family name, kind, help); values are per node
SYS_METRICS: dict[str, tuple[str, str, str]] = {
    "clients/connected": ("fanout_broker_clients_connected", "gauge", "Connected clients."),
    "clients/disconnected": ("fanout_broker_clients_disconnected", "gauge", "Persistent sessions without a connection."),
    "clients/total": ("fanout_broker_clients_total_sessions", "gauge", "Connected plus disconnected persistent clients."),
    "clients/maximum": ("fanout_broker_clients_maximum", "gauge", "Most clients connected at once."),
    "messages/received": ("fanout_broker_messages_received", "counter", "MQTT packets received."),
    "messages/sent": ("fanout_broker_messages_sent", "counter", "MQTT packets sent."),
    "publish/messages/received": ("fanout_broker_publish_received", "counter", "PUBLISH packets received."),
    "publish/messages/sent": ("fanout_broker_publish_sent", "counter", "PUBLISH packets sent."),
    "publish/messages/dropped": ("fanout_broker_publish_dropped", "counter", "PUBLISH messages dropped (bounds hit)."),
    "publish/messages/denied": ("fanout_broker_publish_denied", "counter", "PUBLISH messages refused by ACL."),
    "bytes/received": ("fanout_broker_bytes_received", "counter", "Bytes received."),
    "bytes/sent": ("fanout_broker_bytes_sent", "counter", "Bytes sent."),
    "subscriptions/count": ("fanout_broker_subscriptions", "gauge", "Active subscriptions."),
    "retained messages/count": ("fanout_broker_retained_messages", "gauge", "Retained messages held."),
    "heap/current": ("fanout_broker_heap_bytes", "gauge", "Resident memory of the node process."),
    "uptime": ("fanout_broker_uptime_seconds", "gauge", "Seconds since the node's broker started."),
    "tls/handshakes/running": ("fanout_broker_tls_handshakes_running", "gauge", "TLS handshakes in progress."),
    "tls/handshakes/completed": ("fanout_broker_tls_handshakes_completed", "counter", "TLS handshakes completed."),
    "tls/handshakes/failed/certificate": ("fanout_broker_tls_handshakes_failed_certificate", "counter",
                                          "TLS handshakes failed: client certificate refused (CA, expiry)."),
    "tls/handshakes/failed/protocol": ("fanout_broker_tls_handshakes_failed_protocol", "counter",
                                       "TLS handshakes failed: not TLS, old version, no shared cipher, alert."),
    "tls/handshakes/abandoned": ("fanout_broker_tls_handshakes_abandoned", "counter",
                                 "TLS handshakes never finished (timeout, or the client left)."),
    "tls/handshakes/refused": ("fanout_broker_tls_handshakes_refused", "counter",
                               "TLS connections closed at accept: mqtt.max_tls_handshakes in progress."),
}
_SYS_PREFIX = "$SYS/broker/"
_NAME_JUNK = re.compile(r"[^a-zA-Z0-9_]+")


def _family(name: str, kind: str, doc: str, labels: list[str]) -> Metric:
    cls = CounterMetricFamily if kind == "counter" else GaugeMetricFamily
    return cls(name, doc, labels=labels)


def _figure(stats: dict[str, Any], key: str) -> Any:
    """``stats[key]``, a dotted key reading into nested dicts (``channel.requests``); None when absent."""
    value: Any = stats
    for part in key.split("."):
        if not isinstance(value, dict):
            return None
        value = value.get(part)
    return value


def _number(value: Any) -> float | None:
    """A ``$SYS`` value as a number: ints and floats as they are, ``"123 seconds"`` as 123; else None."""
    if isinstance(value, bool):
        return float(value)
    if isinstance(value, (int, float)):
        return float(value)
    if isinstance(value, str):
        head = value.split(" ", 1)[0]
        try:
            return float(head)
        except ValueError:
            return None
    return None


class SnapshotCollector:
    """Metric families of one snapshot (a prometheus-client custom collector).

    Args:
        snapshot: ``{"status": ..., "sys": {node: {topic: value}}, "gc": {...}, "collect_s": float,
            "http_auth_failures": int, "requests": {state: n} | None, "http_tls": {outcome: n} | None}``.
    """

    def __init__(self, snapshot: dict[str, Any]) -> None:
        self.snapshot = snapshot

    def collect(self) -> Iterator[Metric]:
        snap = self.snapshot
        status = snap.get("status") or {}
        yield from self._shards(status)
        yield from self._nodes(status, snap.get("http_auth_failures", 0))
        yield from self._sys(snap.get("sys") or {})
        yield from self._gc(snap.get("gc") or {})
        http_tls = snap.get("http_tls")
        if http_tls:  # fanout.mqtt.tls_handshakes.HandshakeStats.figures of the HTTPS listener
            fam = CounterMetricFamily("fanout_http_tls_handshakes", "HTTPS handshakes of the controller's "
                                      "listener by outcome.", labels=["outcome"])
            for outcome, n in sorted(http_tls.items()):
                if outcome != "running":
                    fam.add_metric([outcome], n)
            yield fam
            yield GaugeMetricFamily("fanout_http_tls_handshakes_running", "HTTPS handshakes in progress.",
                                    value=http_tls.get("running", 0))
        requests = snap.get("requests")
        if requests is not None:
            fam = GaugeMetricFamily("fanout_requests", "Requests by lifecycle state.", labels=["state"])
            for state, n in sorted(requests.items()):
                fam.add_metric([state], n)
            yield fam
        if "collect_s" in snap:
            yield GaugeMetricFamily("fanout_metrics_collect_seconds", "Time taken to gather this snapshot.",
                                    value=snap["collect_s"])

    def _shards(self, status: dict[str, Any]) -> Iterator[Metric]:
        primary_node = {r["shard"]: (r["primary"].get("node") or "") for r in status.get("replication", [])}
        up = GaugeMetricFamily("fanout_shard_up", "1 when the shard's primary answered.", labels=["shard", "node"])
        families = [(key, _family(name, kind, doc, ["shard", "node"]))
                    for key, name, kind, doc in (*SHARD_FIGURES, *CHANNEL_FIGURES)]
        for s in status.get("shards", []):
            labels = [str(s["shard"]), primary_node.get(s["shard"], "")]
            up.add_metric(labels, 1 if s.get("alive") else 0)
            if not s.get("alive"):
                continue
            for key, fam in families:
                value = _figure(s, key)
                if value is not None:
                    fam.add_metric(labels, value)
        yield up
        for _, fam in families:
            yield fam
        epoch = GaugeMetricFamily("fanout_shard_epoch", "Failover epoch of the shard.", labels=["shard", "node"])
        lag = GaugeMetricFamily("fanout_replication_lag", "Write batches the replica is behind its primary.",
                                labels=["shard", "replica", "node"])
        in_sync = GaugeMetricFamily("fanout_replica_in_sync", "1 when the replica is in the shard's ack set.",
                                    labels=["shard", "replica", "node"])
        for r in status.get("replication", []):
            shard = str(r["shard"])
            epoch.add_metric([shard, primary_node.get(r["shard"], "")], r["epoch"])
            for rep in r["replicas"]:
                labels = [shard, str(rep["id"]), rep.get("node") or ""]
                if rep.get("lag") is not None:
                    lag.add_metric(labels, rep["lag"])
                in_sync.add_metric(labels, 1 if rep.get("in_sync") else 0)
        yield epoch
        yield lag
        yield in_sync

    def _nodes(self, status: dict[str, Any], http_auth_failures: int) -> Iterator[Metric]:
        up = GaugeMetricFamily("fanout_node_up", "1 when the connection node answered and is not declared down.",
                               labels=["node"])
        auth = CounterMetricFamily("fanout_auth_failures", "Refused logins (bad credentials, not authorised).",
                                   labels=["node", "listener"])
        families = [(key, _family(name, kind, doc, ["node"])) for key, name, kind, doc in (*NODE_FIGURES, *CHANNEL_FIGURES)]
        for n in status.get("nodes", []):
            node = str(n["node_id"])
            up.add_metric([node], 1 if n.get("alive") else 0)
            if "connections" not in n:  # no answer: only the up figure
                continue
            for key, fam in families:
                value = _figure(n, key)
                if value is not None:
                    fam.add_metric([node], value)
            if "auth_failures" in n:
                auth.add_metric([node, "mqtt"], n["auth_failures"])
        auth.add_metric(["controller", "http"], http_auth_failures)
        yield up
        for _, fam in families:
            yield fam
        yield auth

    def _sys(self, sys_by_node: dict[str, dict[str, Any]]) -> Iterator[Metric]:
        families: dict[str, Metric] = {}
        info = GaugeMetricFamily("fanout_broker_info", "Broker version of each node.", labels=["node", "version"])
        for node in sorted(sys_by_node):
            for topic, value in sys_by_node[node].items():
                if not topic.startswith(_SYS_PREFIX):
                    continue  # $SYS/fanout/... are the shard figures above, summed
                suffix = topic[len(_SYS_PREFIX):]
                if suffix == "version":
                    info.add_metric([node, str(value)], 1)
                    continue
                number = _number(value)
                if number is None:
                    continue
                name, kind, doc = SYS_METRICS.get(suffix) or (
                    "fanout_broker_" + _NAME_JUNK.sub("_", suffix).strip("_").lower(), "gauge", f"{topic} per node.")
                fam = families.get(name)
                if fam is None:
                    fam = families[name] = _family(name, kind, doc, ["node"])
                fam.add_metric([node], number)
        if sys_by_node:
            yield info
        yield from families.values()

    def _gc(self, gc: dict[str, Any]) -> Iterator[Metric]:
        cycles = CounterMetricFamily("fanout_gc_cycles", "GC cycles run by the controller.", labels=["result"])
        cycles.add_metric(["ok"], gc.get("ok", 0))
        cycles.add_metric(["failed"], gc.get("failed", 0))
        yield cycles
        yield SummaryMetricFamily("fanout_gc_cycle_duration_seconds", "Duration of completed GC cycles.",
                                  count_value=gc.get("ok", 0), sum_value=gc.get("seconds_sum", 0.0))
        yield CounterMetricFamily("fanout_gc_deleted", "Rows and blobs deleted by GC cycles.",
                                  value=gc.get("deleted", 0))
        stages = GaugeMetricFamily("fanout_gc_last_cycle_stage_seconds", "Seconds per stage of the last GC cycle.",
                                   labels=["stage"])
        for stage, seconds in sorted((gc.get("last_stage_s") or {}).items()):
            stages.add_metric([stage], seconds)
        yield stages


def render(snapshot: dict[str, Any]) -> bytes:
    """The Prometheus text exposition of ``snapshot`` (a fresh registry: no state across calls)."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(SnapshotCollector(snapshot))  # type: ignore[arg-type]
    return generate_latest(registry)


__all__ = ["render", "SnapshotCollector", "CONTENT_TYPE", "SYS_METRICS", "SHARD_FIGURES", "NODE_FIGURES"]
