"""Certificate identity over TLS: the verified client-certificate CN reaches the broker core as
``Peer.cert_cn`` (and only a verified one), and, with users configured, a vehicle certificate serves only
the VIN it names (another client id: CONNACK 0x05)."""
from __future__ import annotations

import asyncio
import threading
from pathlib import Path

import pytest

from fanout.config import listener_settings, load_config, mqtt_settings
from fanout.mqtt.aio import MQTTServer, new_event_loop
from fanout.mqtt.auth import hash_password

from .pki import tls_broker, tls_config, tls_paho, url_port

pytestmark = pytest.mark.timeout(120)

VIN = "WVWZZZ1JZXW000001"
OTHER_VIN = "WVWZZZ1JZXW000002"


class _ThreadBroker:
    """An MQTTServer with its extra listeners on an event loop in a daemon thread."""

    def __init__(self, cfg_path: Path) -> None:
        cfg = load_config(cfg_path, env={})
        self.server = MQTTServer(mqtt_settings(cfg), listeners=listener_settings(cfg), port=0, sweep_interval_s=0.1)
        self.loop = new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()
        self.call(self.server.start())

    def call(self, coro):
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(10)

    def peers(self) -> list:
        async def read():
            return [p._conn.peer for p in self.server._protocols if p._conn is not None]
        return self.call(read())

    def stop(self) -> None:
        self.call(self.server.stop())
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(5)


@pytest.mark.parametrize("client_auth", ["required", "optional", "none"])
def test_only_a_verified_certificate_cn_reaches_the_broker(pki, tmp_path, paho_client, client_auth):
    rb = _ThreadBroker(tls_config(pki, tmp_path / "b.toml", client_auth=client_auth, schemes=("mqtts", "wss")))
    try:
        ports = {u.split("://")[0]: url_port(u) for u in rb.server.extra_urls}
        for scheme in ("mqtts", "wss"):
            c = tls_paho(paho_client, pki, scheme, cert=pki.client(VIN), client_id=VIN)
            c.connect(ports[scheme])
            peers = [p for p in rb.peers() if p.transport == scheme]
            assert len(peers) == 1
            # "none" does not verify, so the CN the client claims is not an identity
            assert peers[0].cert_cn == (None if client_auth == "none" else VIN)
            assert peers[0].host == "127.0.0.1" and peers[0][0] == "127.0.0.1"  # still reads as a peername
            c.close()
        plain = tls_paho(paho_client, pki, "mqtt")
        plain.connect(rb.server.port)
        assert {p.cert_cn for p in rb.peers() if p.transport == "mqtt"} == {None}
    finally:
        rb.stop()


def test_vehicle_certificate_serves_only_its_own_vin(pki, tmp_path, paho_client):
    users = f'[users.ops]\npassword_hash = "{hash_password("ops-secret", iterations=1000)}"\nrole = "admin"\n'
    cfg = tls_config(pki, tmp_path / "b.toml", client_auth="required", cert_role="vehicle",
                     extra=users.replace("[users.ops]", '\n[users.ops]'))
    text = cfg.read_text().replace('[mqtt]\n', '[mqtt]\nanonymous_role = "none"\n', 1)
    cfg.write_text(text)
    with tls_broker(cfg) as (_, urls):
        port = url_port(urls["mqtts"])
        own = tls_paho(paho_client, pki, "mqtts", cert=pki.client(VIN), client_id=VIN)
        own.connect(port)  # CONNACK 0: the certificate is the credential, no password
        other = tls_paho(paho_client, pki, "mqtts", cert=pki.client(VIN), client_id=OTHER_VIN)
        other.connect(port, expect_rc=5)
        # a CN naming a configured user takes that user's role (admin may use any client id)
        admin = tls_paho(paho_client, pki, "mqtts", cert=pki.client("ops"), client_id="ops-console")
        admin.connect(port)
