"""With ``mqtt.tls_cert``/``mqtt.tls_key`` configured the HTTP listener speaks HTTPS only, with that certificate.

Its own module: the cluster it starts must not overlap ``test_http_auth.py``'s module cluster (one fanout
cluster at a time holds the session Ray's ``fanout_node`` resource).
"""
from __future__ import annotations

import dataclasses
import ssl
import subprocess
from pathlib import Path

import pytest

from cluster.http.auth import check_http_config
from fanout.config import SCHEMA, ConfigError, Section
from tests.integration.fanout_harness import running_cluster
from tests.integration.http_fixtures import fetch, http_config, metric_sum, metric_values, port_of, raw_request

ADMIN = ("root", "s3cret")


def _with_tls(cfg, cert: Path, key: Path):
    """``mqtt.tls_cert``/``tls_key`` set: through the schema once MQTT over TLS has them, else on the section."""
    if "tls_cert" in SCHEMA["mqtt"]:
        return cfg.replace("mqtt", tls_cert=str(cert), tls_key=str(key))
    return dataclasses.replace(cfg, mqtt=Section("mqtt", {**cfg.mqtt.as_dict(), "tls_cert": str(cert), "tls_key": str(key)}))


def test_with_the_mqtt_certificate_the_listener_speaks_https_only(ray_local, tmp_path):
    cert, key = tmp_path / "cert.pem", tmp_path / "key.pem"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", str(key), "-out", str(cert),
                    "-days", "1", "-subj", "/CN=localhost", "-addext", "subjectAltName=IP:127.0.0.1"],
                   check=True, capture_output=True, timeout=60)
    cfg = _with_tls(http_config(tmp_path, users={"root": ("s3cret", "admin")}), cert, key)
    check_http_config(cfg)
    with pytest.raises(ConfigError, match="mqtt.tls_cert"):
        check_http_config(_with_tls(cfg, tmp_path / "missing.pem", key))
    with running_cluster(cfg) as c:
        url = c.info["http"]
        assert url.startswith("https://127.0.0.1:"), url
        trusted = ssl.create_default_context(cafile=str(cert))
        assert fetch(url + "api/status", login=ADMIN, context=trusted).status == 200
        assert fetch(url + "api/status", context=trusted).status == 401
        with pytest.raises(Exception):  # not the certificate the client trusts
            fetch(url + "metrics", context=ssl.create_default_context())
        plain = raw_request(port_of(url), b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n")
        assert not plain.startswith(b"HTTP/1.1 200"), plain[:100]
        # the handshakes that failed are counted by outcome, not dropped without a trace
        m = metric_values(fetch(url + "metrics", login=ADMIN, context=trusted).body.decode())
        assert metric_sum(m, "fanout_http_tls_handshakes_total", outcome="failed/protocol") >= 1  # clear text
        assert metric_sum(m, "fanout_http_tls_handshakes_total", outcome="completed") >= 2
