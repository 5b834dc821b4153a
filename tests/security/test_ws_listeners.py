"""MQTT over WebSocket and WebSocket over TLS against a ``fanout broker`` subprocess: paho with
``transport="websockets"`` (path /mqtt, subprotocol mqtt), client certificates on WSS, and refusals of a
wrong path or subprotocol at the HTTP upgrade."""
from __future__ import annotations

import socket

import pytest

from .pki import mqtt_over_tls_answers, tls_broker, tls_config, tls_paho, url_port

pytestmark = pytest.mark.timeout(120)


@pytest.mark.parametrize("scheme", ["ws", "wss"])
def test_paho_over_websocket_round_trip_qos0_1_2_and_retained(pki, tmp_path, paho_client, scheme):
    with tls_broker(tls_config(pki, tmp_path / "b.toml", schemes=(scheme,)), (scheme,)) as (_, urls):
        port = url_port(urls[scheme])
        pub = tls_paho(paho_client, pki, scheme)
        pub.connect(port)
        pub.publish("ws/retained", b"kept", qos=1, retain=True)
        sub = tls_paho(paho_client, pki, scheme)
        sub.connect(port)
        sub.subscribe(("ws/#", 2))
        assert sub.get().payload == b"kept"
        big = bytes(range(256)) * 1024  # 256 KiB: many frames / TCP segments
        for qos in (0, 1, 2):
            pub.publish(f"ws/q{qos}", big if qos == 1 else b"q%d" % qos, qos=qos)
            msg = sub.get()
            assert msg.topic == f"ws/q{qos}" and msg.payload == (big if qos == 1 else b"q%d" % qos)


def test_wss_with_required_client_certificate(pki, tmp_path, paho_client):
    cfg = tls_config(pki, tmp_path / "b.toml", schemes=("wss",), client_auth="required")
    with tls_broker(cfg, ("wss",)) as (_, urls):
        port = url_port(urls["wss"])
        ok = tls_paho(paho_client, pki, "wss", cert=pki.client("dash-1"), client_id="dash-1")
        ok.connect(port)
        ok.subscribe(("wss/t", 1))
        ok.publish("wss/t", b"x", qos=1)
        assert ok.get().payload == b"x"
        assert not mqtt_over_tls_answers(pki, port, None)
        assert not mqtt_over_tls_answers(pki, port, pki.foreign_client("dash-1"))


def _upgrade(port: int, path: str, protocol: str | None) -> bytes:
    head = (f"GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
            "Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n")
    if protocol:
        head += f"Sec-WebSocket-Protocol: {protocol}\r\n"
    with socket.create_connection(("127.0.0.1", port), timeout=5) as s:
        s.sendall((head + "\r\n").encode())
        return s.recv(4096)


def test_upgrade_needs_path_mqtt_and_subprotocol_mqtt(pki, tmp_path):
    with tls_broker(tls_config(pki, tmp_path / "b.toml", schemes=("ws",)), ("ws",)) as (_, urls):
        port = url_port(urls["ws"])
        accepted = _upgrade(port, "/mqtt", "mqtt")
        assert accepted.startswith(b"HTTP/1.1 101") and b"sec-websocket-protocol: mqtt" in accepted.lower()
        assert _upgrade(port, "/other", "mqtt").startswith(b"HTTP/1.1 404")
        assert _upgrade(port, "/mqtt", None).startswith(b"HTTP/1.1 400")
        # plain MQTT on the WebSocket port is not an upgrade request: closed without a CONNACK
        with socket.create_connection(("127.0.0.1", port), timeout=5) as s:
            s.sendall(b"\x10\x0d\x00\x04MQTT\x04\x02\x00\x3c\x00\x01x")
            assert not s.recv(4096).startswith(b"\x20")
