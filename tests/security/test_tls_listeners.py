"""TLS listeners of ``fanout broker`` (subprocess, loopback): TLS 1.2+, client certificates (none, optional,
required; another CA and an expired certificate refused at the handshake), ready lines, config errors that
name the key, and SIGHUP reload that keeps open connections while new handshakes get the new certificate."""
from __future__ import annotations

import signal
import shutil
import ssl
import subprocess
import sys
import time

import pytest

from tests.integration.conftest import REPO

from .pki import (handshake, mqtt_over_tls_answers, renew_and_reload, server_cert_der, tls_broker, tls_config,
                       tls_paho, url_port)

pytestmark = pytest.mark.timeout(120)


def test_every_listener_prints_a_ready_line_and_serves_one_broker(pki, tmp_path, paho_client):
    schemes = ("mqtts", "ws", "wss")
    cfg = tls_config(pki, tmp_path / "b.toml", schemes=schemes)
    with tls_broker(cfg, schemes) as (proc, urls):
        assert sorted(urls) == ["mqtt", "mqtts", "ws", "wss"]
        assert urls["ws"].startswith("ws://127.0.0.1:") and urls["ws"].endswith("/mqtt")
        assert urls["wss"].endswith("/mqtt") and urls["mqtts"].startswith("mqtts://127.0.0.1:")
        sub = tls_paho(paho_client, pki, "mqtt")
        sub.connect(url_port(urls["mqtt"]))
        sub.subscribe(("t/#", 1))
        for scheme in schemes:  # a publisher on each listener reaches the plain-TCP subscriber
            pub = tls_paho(paho_client, pki, scheme)
            pub.connect(url_port(urls[scheme]))
            pub.publish(f"t/{scheme}", scheme.encode(), qos=1)
            msg = sub.get()
            assert (msg.topic, msg.payload) == (f"t/{scheme}", scheme.encode())
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(15) == 0


def test_tls_without_client_certificates_round_trip(pki, tmp_path, paho_client):
    with tls_broker(tls_config(pki, tmp_path / "b.toml")) as (_, urls):
        port = url_port(urls["mqtts"])
        sub, pub = tls_paho(paho_client, pki, "mqtts"), tls_paho(paho_client, pki, "mqtts")
        sub.connect(port)
        pub.connect(port)
        sub.subscribe(("tls/t", 1))
        pub.publish("tls/t", b"secret", qos=1)
        assert sub.get().payload == b"secret"
        # a plain MQTT client on the TLS port gets no CONNACK
        with __import__("socket").create_connection(("127.0.0.1", port), timeout=5) as s:
            s.sendall(b"\x10\x0d\x00\x04MQTT\x04\x02\x00\x3c\x00\x01x")
            try:
                assert s.recv(4)[:1] != b"\x20"
            except ConnectionResetError:
                pass


def test_tls_below_1_2_is_refused(pki, tmp_path):
    with tls_broker(tls_config(pki, tmp_path / "b.toml")) as (_, urls):
        port = url_port(urls["mqtts"])
        with handshake(pki, port, minimum_version=ssl.TLSVersion.TLSv1_2, maximum_version=ssl.TLSVersion.TLSv1_2) as s:
            assert s.version() == "TLSv1.2"
        with pytest.raises((ssl.SSLError, ConnectionResetError)):
            handshake(pki, port, minimum_version=ssl.TLSVersion.MINIMUM_SUPPORTED,
                      maximum_version=ssl.TLSVersion.TLSv1_1).close()


def test_required_client_auth_refuses_missing_foreign_and_expired_certificates(pki, tmp_path, paho_client):
    with tls_broker(tls_config(pki, tmp_path / "b.toml", client_auth="required")) as (_, urls):
        port = url_port(urls["mqtts"])
        assert mqtt_over_tls_answers(pki, port, pki.client("device-1"))
        assert not mqtt_over_tls_answers(pki, port, None)
        assert not mqtt_over_tls_answers(pki, port, pki.foreign_client("device-1"))
        assert not mqtt_over_tls_answers(pki, port, pki.expired_client("device-1"))
        # paho with a valid certificate: a full round trip
        c = tls_paho(paho_client, pki, "mqtts", cert=pki.client("device-2"), client_id="device-2")
        c.connect(port)
        c.subscribe(("tls/r", 1))
        c.publish("tls/r", b"x", qos=1)
        assert c.get().payload == b"x"
        # paho with a certificate from another CA: no session (refused during the handshake)
        bad = tls_paho(paho_client, pki, "mqtts", cert=pki.foreign_client("device-3"))
        with pytest.raises((ssl.SSLError, OSError, AssertionError, __import__("queue").Empty)):
            bad.connect(port)  # the handshake fails, or the alert arrives before any CONNACK
        assert bad.connack.empty()


def test_optional_client_auth_accepts_no_certificate_but_verifies_one_presented(pki, tmp_path):
    with tls_broker(tls_config(pki, tmp_path / "b.toml", client_auth="optional")) as (_, urls):
        port = url_port(urls["mqtts"])
        assert mqtt_over_tls_answers(pki, port, None)
        assert mqtt_over_tls_answers(pki, port, pki.client("device-1"))
        assert not mqtt_over_tls_answers(pki, port, pki.foreign_client("device-1"))
        assert not mqtt_over_tls_answers(pki, port, pki.expired_client("device-1"))


def test_sighup_reloads_certificates_and_keeps_open_connections(pki, tmp_path, paho_client):
    cert, key = tmp_path / "live.crt", tmp_path / "live.key"
    shutil.copy(pki.server_cert, cert)
    shutil.copy(pki.server_key, key)
    cfg = tls_config(pki, tmp_path / "b.toml", cert=cert, key=key)
    with tls_broker(cfg) as (proc, urls):
        port = url_port(urls["mqtts"])
        before = server_cert_der(pki, port)
        assert before == ssl.PEM_cert_to_DER_cert(pki.server_cert.read_text())
        sub = tls_paho(paho_client, pki, "mqtts")
        sub.connect(port)
        sub.subscribe(("reload/t", 1))
        expected = renew_and_reload(pki, proc, cert, key, port, "renewed", timeout=10)
        assert expected != before
        # the connection made before the reload still works, in both directions
        pub = tls_paho(paho_client, pki, "mqtts")
        pub.connect(port)
        pub.publish("reload/t", b"after", qos=1)
        assert sub.get().payload == b"after"
        sub.publish("reload/t", b"from-old", qos=1)
        assert sub.get().payload == b"from-old"
        assert sub.disconnects.empty()
        # a broken renewal keeps the working certificate (and the process)
        key.write_text("not a key\n")
        proc.send_signal(signal.SIGHUP)
        time.sleep(0.5)
        assert proc.poll() is None
        assert server_cert_der(pki, port) == expected


@pytest.mark.parametrize("toml, key", [
    ("[mqtt]\ntls_port = 18883\n", "mqtt.tls_port"),
    ("[mqtt]\nwss_port = 18884\n", "mqtt.wss_port"),
    ('[mqtt]\ntls_port = 18883\ntls_cert = "/nonexistent/c.pem"\ntls_key = "/nonexistent/k.pem"\n', "mqtt.tls_cert"),
    ('[mqtt]\ntls_cert = "{cert}"\n', "mqtt.tls_key"),
    ('[mqtt]\ntls_port = 18883\ntls_cert = "{cert}"\ntls_key = "{key}"\ntls_client_auth = "required"\n', "mqtt.tls_ca"),
    ('[mqtt]\ntls_port = 18883\ntls_cert = "{cert}"\ntls_key = "{key}"\ntls_client_auth = "sometimes"\n', "mqtt.tls_client_auth"),
    ('[mqtt]\ntls_port = 18883\ntls_cert = "{key}"\ntls_key = "{key}"\n', "mqtt.tls_cert"),
    ('[mqtt]\nport = 18883\nws_port = 18883\n', "mqtt.ws_port"),
])
def test_bad_listener_config_exits_2_naming_the_key(pki, tmp_path, toml, key):
    cfg = tmp_path / "bad.toml"
    cfg.write_text(toml.format(cert=pki.server_cert, key=pki.server_key))
    r = subprocess.run([sys.executable, "-m", "cluster.cli", "broker", "--config", str(cfg)],
                       cwd=REPO, capture_output=True, text=True, timeout=30)
    assert r.returncode == 2 and key in r.stderr, (r.returncode, r.stderr[-500:])
    assert r.stdout == ""
