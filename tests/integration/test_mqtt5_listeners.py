"""MQTT 5 on every listener of a ``fanout broker`` process: TLS (``mqtts``), WebSocket (``ws``) and
WebSocket over TLS (``wss``), with paho-mqtt ``protocol=MQTTv5`` (and ``mosquitto_sub``/``mosquitto_pub -V
mqttv5`` over TLS). The broker process is stopped by each test."""
from __future__ import annotations

import shutil
import subprocess

import pytest

from tests.integration.test_mqtt5_clients import Paho5, opts, pub_props
from tests.security.pki import client_context, pki, tls_broker, tls_config, url_port  # noqa: F401  (fixture)

pytestmark = pytest.mark.timeout(120)


def _paho5(pki, scheme: str, made: list) -> Paho5:  # noqa: F811
    c = Paho5()
    made.append(c)
    if scheme in ("ws", "wss"):
        c.client.transport = "websockets"
        c.client.ws_set_options(path="/mqtt")
    if scheme in ("mqtts", "wss"):
        c.client.tls_set_context(client_context(pki))
    return c


@pytest.mark.parametrize("scheme", ["mqtts", "ws", "wss"])
def test_paho5_on_tls_and_websocket_listeners(pki, tmp_path, scheme):  # noqa: F811
    made: list[Paho5] = []
    try:
        with tls_broker(tls_config(pki, tmp_path / "b.toml", schemes=(scheme,)), (scheme,)) as (_, urls):
            port = url_port(urls[scheme])
            sub = _paho5(pki, scheme, made)
            _, props = sub.connect(port)
            assert props.ReceiveMaximum > 0 and props.SharedSubscriptionAvailable == 1
            assert sub.subscribe(("l5/+", opts(1)), sub_id=11) == [1]
            pub = _paho5(pki, scheme, made)
            pub.connect(port)
            assert pub.publish("l5/a", b"over " + scheme.encode(), 1,
                               properties=pub_props(ContentType="text/plain", UserProperty=[("k", "v")])) == 0
            msg = sub.get()
            assert msg.payload == b"over " + scheme.encode()
            assert msg.properties.ContentType == "text/plain" and msg.properties.UserProperty == [("k", "v")]
            assert msg.properties.SubscriptionIdentifier == [11]
            assert pub.publish("l5-none/x", b"-", 1) == 0x10
    finally:
        for c in made:
            c.close()


@pytest.mark.skipif(shutil.which("mosquitto_sub") is None, reason="mosquitto-clients not installed (make mosquitto)")
def test_mosquitto_clients_v5_over_tls(pki, tmp_path):  # noqa: F811
    with tls_broker(tls_config(pki, tmp_path / "b.toml"), ("mqtts",)) as (_, urls):
        port = str(url_port(urls["mqtts"]))
        tls = ["--cafile", str(pki.ca_file), "-h", "127.0.0.1", "-p", port, "-V", "mqttv5"]
        sub = subprocess.Popen(["mosquitto_sub", *tls, "-t", "t5/#", "-q", "1", "-C", "1", "-W", "8",
                                "-F", "%t|%p|%C"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        try:
            out = ""
            for _ in range(40):  # until the subscription is in place
                subprocess.run(["mosquitto_pub", *tls, "-t", "t5/x", "-m", "tls5", "-q", "1",
                                "-D", "publish", "content-type", "text/x"], check=True, capture_output=True, timeout=5)
                try:
                    out, _err = sub.communicate(timeout=0.25)
                    break
                except subprocess.TimeoutExpired:
                    continue
            assert out.strip() == "t5/x|tls5|text/x"
        finally:
            if sub.poll() is None:
                sub.terminate()
            sub.wait(5)
