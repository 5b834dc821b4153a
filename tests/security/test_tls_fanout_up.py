"""``fanout up`` (own local Ray, subprocess) with TLS and WSS listeners: a ready line per listener, a vehicle
over TLS receives its fanout message, and SIGHUP in the driver reloads the certificates of the connection
nodes (forwarded as a Ray call) without dropping the vehicle."""
from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from tests.integration.fanout_harness import publish_batch

from .pki import renew_and_reload, tls_config, tls_paho, url_port

pytestmark = pytest.mark.timeout(600)

FANOUT = str(Path(sys.executable).parent / "fanout")
READY_TIMEOUT_S = 240  # a local Ray start takes 5-8 s idle, far more on a busy 2-core machine
VIN = "TLSUP0000000001"


def _lines(proc: subprocess.Popen, n: int, timeout: float) -> list[str]:
    box: list[str] = []

    def read() -> None:
        for _ in range(n):
            box.append(proc.stdout.readline())  # type: ignore[union-attr]

    t = threading.Thread(target=read, daemon=True)
    t.start()
    t.join(timeout)
    if len(box) < n or not all(box):
        proc.kill()
        raise AssertionError(f"`fanout up` printed {box!r}, not {n} ready lines, within {timeout:.0f}s")
    return [line.strip() for line in box]


def test_vehicle_over_tls_gets_its_fanout_message_and_sighup_reloads(pki, tmp_path, paho_client):
    cert, key = tmp_path / "live.crt", tmp_path / "live.key"
    shutil.copy(pki.server_cert, cert)
    shutil.copy(pki.server_key, key)
    cfg = tls_config(pki, tmp_path / "up.toml", schemes=("mqtts", "wss"), cert=cert, key=key)
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    env["FANOUT_LOG_JSON"] = "1"
    err = open(tmp_path / "up.err", "w")
    proc = subprocess.Popen([FANOUT, "up", "--config", str(cfg), "--port", "0", "--data-dir", str(tmp_path / "data"),
                             "--address", "local"], stdout=subprocess.PIPE, stderr=err, text=True, env=env)
    try:
        lines = _lines(proc, 3, READY_TIMEOUT_S)
        assert lines[0].startswith("fanout ready mqtt://127.0.0.1:")
        assert lines[1].startswith("fanout ready mqtts://127.0.0.1:")
        assert lines[2].startswith("fanout ready wss://127.0.0.1:") and lines[2].endswith("/mqtt")
        port, tls_port = url_port(lines[0].split()[-1]), url_port(lines[1].split()[-1])
        car = tls_paho(paho_client, pki, "mqtts", client_id=VIN)
        car.connect(tls_port)
        car.subscribe((f"agent/{VIN}/proxy/request/+", 1))
        publish_batch(port, [VIN], "tls-1", blob=b"OTA over TLS")
        car.publish(f"ecp/{VIN}/heartbeat", b"{}", qos=1)
        msg = car.get(timeout=60)
        assert msg.topic == f"agent/{VIN}/proxy/request/tls-1"
        # SIGHUP to the driver: the connection node loads the renewed certificate, the car stays
        renew_and_reload(pki, proc, cert, key, tls_port, "renewed-up", timeout=60)
        publish_batch(port, [VIN], "tls-2", data_id="d2", blob=b"after reload")
        assert car.get(timeout=60).topic == f"agent/{VIN}/proxy/request/tls-2"
        assert car.disconnects.empty()
        car.close()
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(120) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(30)
        err.close()
