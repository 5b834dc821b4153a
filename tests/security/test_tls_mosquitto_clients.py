"""A third-party client over TLS with a client certificate: Debian's ``mosquitto_sub``/``mosquitto_pub``
against a ``fanout broker`` subprocess whose TLS listener requires client certificates."""
from __future__ import annotations

import shutil
import subprocess

import pytest

from .pki import tls_broker, tls_config, url_port

pytestmark = [pytest.mark.timeout(120),
              pytest.mark.skipif(shutil.which("mosquitto_sub") is None,
                                 reason="mosquitto-clients is not installed (`make mosquitto`)")]


def _tls_args(pki, cn: str, port: int) -> list[str]:
    cert = pki.client(cn)
    return ["-h", "127.0.0.1", "-p", str(port), "--cafile", str(pki.ca_file), "--cert", str(cert.cert),
            "--key", str(cert.key), "-V", "mqttv311"]


def test_mosquitto_sub_and_pub_over_tls_with_client_certificates(pki, tmp_path):
    with tls_broker(tls_config(pki, tmp_path / "b.toml", client_auth="required")) as (_, urls):
        port = url_port(urls["mqtts"])
        sub = subprocess.Popen(["mosquitto_sub", *_tls_args(pki, "mosq-sub", port), "-t", "third/party", "-q", "1",
                                "-C", "1", "-W", "20", "-i", "mosq-sub"],
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        try:
            out = ""
            for _ in range(40):  # publish until the subscriber (connecting in parallel) has it
                r = subprocess.run(["mosquitto_pub", *_tls_args(pki, "mosq-pub", port), "-t", "third/party",
                                    "-q", "1", "-m", "hello over tls", "-i", "mosq-pub"],
                                   capture_output=True, text=True, timeout=20)
                assert r.returncode == 0, r.stderr
                try:
                    out, err = sub.communicate(timeout=0.5)
                    break
                except subprocess.TimeoutExpired:
                    continue
            assert sub.returncode == 0 and out.strip() == "hello over tls", (out, sub.stderr)
        finally:
            if sub.poll() is None:
                sub.kill()
                sub.communicate()
        # without a client certificate the handshake is refused: mosquitto_pub fails
        r = subprocess.run(["mosquitto_pub", "-h", "127.0.0.1", "-p", str(port), "--cafile", str(pki.ca_file),
                            "-t", "third/party", "-m", "x", "-q", "1", "-V", "mqttv311"],
                           capture_output=True, text=True, timeout=20)
        assert r.returncode != 0
