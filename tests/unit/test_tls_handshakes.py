"""fanout.mqtt.tls_handshakes without sockets: the rate-limited log, failure kinds, settings (real handshakes
under both event loops: tests/security/test_tls_handshake_outcomes.py)."""
from __future__ import annotations

import ssl

import pytest
import structlog

from fanout.mqtt.tls_handshakes import HandshakeRefused, HandshakeStats, failure_detail, failure_kind


def test_failures_are_logged_at_most_once_per_kind_per_interval_with_the_count_since():
    now = [100.0]
    stats = HandshakeStats("channel", 10, "cluster.max_tls_handshakes", log_interval_s=10.0, clock=lambda: now[0])
    cert_error = ssl.SSLCertVerificationError(1, "certificate verify failed")
    cert_error.verify_message = "certificate has expired"
    with structlog.testing.capture_logs() as logs:
        for _ in range(5):
            stats.failed(cert_error)
        stats.failed(ssl.SSLError(1, "[SSL: HTTP_REQUEST] http request"))
        now[0] += 9.9
        stats.failed(cert_error)  # still within the interval: counted, not logged
        now[0] += 0.1
        stats.failed(cert_error)
        stats.refuse()
    assert [(e["event"], e.get("kind"), e["since_last_line"], e["total"]) for e in logs] == [
        ("tls handshake failed", "certificate", 0, 1), ("tls handshake failed", "protocol", 0, 1),
        ("tls handshake failed", "certificate", 5, 7), ("tls handshake refused", None, 0, 1)]
    assert logs[0]["error"] == "certificate has expired" and logs[0]["listener"] == "channel"
    assert stats.sys_values()["$SYS/broker/tls/handshakes/failed/certificate"] == 7


def test_kinds_details_and_settings():
    assert failure_kind(ssl.SSLCertVerificationError(1, "x")) == "certificate"
    assert failure_kind(ssl.SSLError(1, "x")) == failure_kind(HandshakeRefused("x")) == "protocol"
    assert failure_detail(ssl.SSLError(1, "plain words")) == "plain words"
    with pytest.raises(ValueError, match="mqtt.max_tls_handshakes"):
        HandshakeStats("mqtt", 0, "mqtt.max_tls_handshakes")
