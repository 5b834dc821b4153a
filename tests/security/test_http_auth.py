"""The HTTP listener's trust rules against a running cluster with users (outside development mode).

- every route but ``/metrics`` needs an ``admin`` login over HTTP basic: 401 with ``WWW-Authenticate``
  without one or with bad credentials, 403 for a valid user of another role;
- a state-changing request from another origin is refused even with an admin login (browsers re-send
  cached basic credentials cross-site);
- refused logins are counted in ``fanout_auth_failures_total{listener="http"}``;
- the listener's bounds (connections, header size and count) hold;
- a non-loopback listener without users refuses to start (HTTPS: ``test_http_tls.py``).
"""
from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from cluster.http.auth import check_http_config, parse_basic
from cluster.http.service import MAX_CONNECTIONS
from fanout.config import ConfigError
from tests.integration.fanout_harness import Puback, RawClient, running_cluster, trigger_payload
from tests.integration.http_fixtures import (basic, fetch, free_port, http_config, metric_sum, metric_values,
                                             port_of, raw_request)

USERS = {"root": ("s3cret", "admin"), "ops": ("ops-pw", "platform"), "WAUZZZ8V5KA000001": ("car-pw", "vehicle")}
ADMIN = ("root", "s3cret")
GUARDED = ["", "static/console.js", "static/console.css", "api/status", "api/requests", "api/requests/sec-req"]
FANOUT = str(Path(sys.executable).parent / "fanout")


@pytest.fixture(scope="module")
def cluster(ray_local, tmp_path_factory):
    with running_cluster(http_config(tmp_path_factory.mktemp("http-auth"), users=USERS)) as c:
        p = RawClient(c.port, "platform-sec", username="ops", password="ops-pw")  # no dev login with users
        try:
            p.publish("$SDV-FANOUT/data/d-sec", b"BLOB", pid=1)
            assert p.expect(Puback).packet_id == 1
            p.publish("$SDV-FANOUT/trigger", trigger_payload(["SEC1", "SEC2"], "sec-req", "d-sec"), pid=2)
            assert p.expect(Puback, timeout=30).packet_id == 2
        finally:
            p.disconnect()
        yield c


def http_failures(cluster) -> float:
    return metric_sum(metric_values(fetch(cluster.info["http"] + "metrics").body.decode()),
                      "fanout_auth_failures_total", listener="http")


@pytest.mark.parametrize("path", GUARDED)
def test_every_route_but_metrics_needs_a_login(cluster, path):
    answer = fetch(cluster.info["http"] + path)
    assert answer.status == 401, (path, answer)
    assert answer.headers["www-authenticate"].startswith('Basic realm="sdv-fanout"')
    assert b"sec-req" not in answer.body and b"<html" not in answer.body
    ok = fetch(cluster.info["http"] + path, login=ADMIN)
    assert ok.status == 200, (path, ok)


def test_metrics_need_no_login(cluster):
    answer = fetch(cluster.info["http"] + "metrics")
    assert answer.status == 200 and b"fanout_pending_rows" in answer.body


@pytest.mark.parametrize("login,status", [
    (("root", "wrong"), 401),
    (("nobody", "s3cret"), 401),
    (("root", ""), 401),
    (("ops", "ops-pw"), 403),                 # a valid platform login is no admin
    (("WAUZZZ8V5KA000001", "car-pw"), 403),   # nor is a vehicle
    (ADMIN, 200),
])
def test_only_an_admin_login_opens_the_api(cluster, login, status):
    answer = fetch(cluster.info["http"] + "api/status", login=login)
    assert answer.status == status, answer
    if status == 200:
        assert answer.json()["totals"]["pending_rows"] == 2
    else:
        assert b"pending_rows" not in answer.body


@pytest.mark.parametrize("header", ["Basic", "Basic !!!notbase64", "Basic " + "dXNlcm5vY29sb24=", "Bearer abc",
                                    "basic " + basic(*ADMIN).split()[1] + "x"])
def test_malformed_credentials_are_refused(cluster, header):
    assert fetch(cluster.info["http"] + "api/status", headers={"Authorization": header}).status == 401


def test_refused_logins_are_counted(cluster):
    before = http_failures(cluster)
    for login in [("root", "bad-1"), ("root", "bad-2"), ("ghost", "x")]:
        assert fetch(cluster.info["http"] + "api/status", login=login).status == 401
    assert fetch(cluster.info["http"] + "api/status", login=("ops", "ops-pw")).status == 403  # not a failure
    assert fetch(cluster.info["http"] + "api/status").status == 401  # no credentials: not an attempt
    assert http_failures(cluster) == before + 3


def test_cross_origin_state_changes_are_refused(cluster):
    url = cluster.info["http"] + "api/requests/sec-req/cancel"
    origin = cluster.info["http"].rstrip("/")
    refused = [
        fetch(url, method="POST", body=b"{}", login=ADMIN, headers={"Origin": "http://evil.example"}),
        fetch(url, method="POST", body=b"{}", login=ADMIN, headers={"Sec-Fetch-Site": "cross-site"}),
    ]
    assert [a.status for a in refused] == [403, 403]
    assert fetch(url, method="POST", body=b"{}").status == 401
    same = fetch(url, method="POST", body=b"{}", login=ADMIN, headers={"Origin": origin, "Sec-Fetch-Site": "same-origin"})
    assert same.status == 200 and same.json()["state"] == "cancelled"  # reaches the route: cancelled


def test_every_answer_carries_the_security_headers(cluster):
    page = fetch(cluster.info["http"], login=ADMIN)
    csp = page.headers["content-security-policy"]
    assert "script-src 'self'" in csp and "frame-ancestors 'none'" in csp and "default-src 'none'" in csp
    assert page.headers["x-content-type-options"] == "nosniff" and page.headers["x-frame-options"] == "DENY"
    denied = fetch(cluster.info["http"] + "api/status")
    assert denied.headers["x-content-type-options"] == "nosniff" and denied.headers["cache-control"] == "no-store"


def test_oversized_and_too_many_headers_are_refused(cluster):
    port = port_of(cluster.info["http"])
    big = raw_request(port, b"GET /metrics HTTP/1.1\r\nHost: x\r\nX-Big: " + b"a" * 20_000 + b"\r\n\r\n")
    assert big.split(b" ", 2)[1] in (b"400", b"431"), big[:100]
    many = raw_request(port, b"GET /metrics HTTP/1.1\r\nHost: x\r\n" +
                        b"".join(b"X-H%d: 1\r\n" % i for i in range(200)) + b"\r\n")
    assert many.split(b" ", 2)[1] in (b"400", b"431"), many[:100]
    body = fetch(cluster.info["http"] + "api/requests/sec-req/cancel", method="POST", login=ADMIN,
                 body=b"x" * (1 << 20), headers={"Content-Type": "application/json"})
    assert body.status in (413, 200)  # the route reads no body; a body it would read is capped at 64 KiB


def test_connections_are_bounded(cluster):
    port = port_of(cluster.info["http"])
    held = [socket.create_connection(("127.0.0.1", port), timeout=10) for _ in range(MAX_CONNECTIONS)]
    try:
        time.sleep(0.5)  # every one accepted and registered
        over = raw_request(port, b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n")
        assert over.startswith(b"HTTP/1.1 503"), over[:100]
    finally:
        for s in held:
            s.close()
    deadline = time.monotonic() + 10
    while fetch(cluster.info["http"] + "metrics").status != 200 and time.monotonic() < deadline:
        time.sleep(0.1)
    assert fetch(cluster.info["http"] + "metrics").status == 200


def test_parse_basic():
    assert parse_basic(basic("root", "a:b")) == ("root", b"a:b")  # the password may hold ':'
    assert parse_basic(None) is None and parse_basic("") is None and parse_basic("Basic") is None
    assert parse_basic("Basic " + "////") is None  # decodes, but no ':'


def test_a_non_loopback_listener_without_users_refuses_to_start(tmp_path):
    cfg = http_config(tmp_path).replace("http", host="0.0.0.0")
    with pytest.raises(ConfigError, match="non-loopback HTTP listener without configured users"):
        check_http_config(cfg)
    check_http_config(cfg.replace("http", port=0))  # no listener, nothing to refuse
    started = time.monotonic()
    env = {**os.environ, "FANOUT_HTTP_HOST": "0.0.0.0", "FANOUT_HTTP_PORT": str(free_port())}
    r = subprocess.run([FANOUT, "up", "--port", "0", "--data-dir", str(tmp_path / "d")], capture_output=True,
                       text=True, timeout=120, env=env)
    assert r.returncode == 2 and "http.host" in r.stderr and r.stdout == "", r.stderr[-2000:]
    assert time.monotonic() - started < 60  # refused before any Ray start
