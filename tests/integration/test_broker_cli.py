"""``fanout broker`` as a subprocess: the ready line, real clients, clean exit on SIGTERM/SIGINT."""
from __future__ import annotations

import signal
import socket
import subprocess
import sys

import pytest

from .conftest import REPO, cli_broker, url_port

pytestmark = pytest.mark.timeout(90)


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_ready_line_serves_and_exits_0_on_signal(paho_client, sig):
    with cli_broker() as (proc, url):
        assert url.startswith("mqtt://127.0.0.1:")
        port = url_port(url)
        assert port > 0
        sub, pub = paho_client(), paho_client()
        sub.connect(port)
        pub.connect(port)
        sub.subscribe(("cli/t", 1))
        pub.publish("cli/t", b"hello", qos=1)
        assert sub.get().payload == b"hello"
        proc.send_signal(sig)
        assert proc.wait(15) == 0
        rest = proc.stdout.read()
        assert rest == ""  # the ready line is the only stdout output
        assert sub.disconnects.get(timeout=5) is not None  # the client saw the close


def test_config_file_and_acl(tmp_path, paho_client):
    cfg = tmp_path / "fanout.toml"
    cfg.write_text('[[acl]]\naction = "subscribe"\ntopic = "test/nosubscribe"\nallow = false\n')
    with cli_broker("--config", str(cfg)) as (proc, url):
        c = paho_client()
        c.connect(url_port(url))
        assert c.subscribe(("test/nosubscribe", 1)) == [0x80]


def test_port_in_use_exits_1_naming_it():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        r = subprocess.run([sys.executable, "-m", "cluster.cli",
                            "broker", "--host", "127.0.0.1", "--port", str(port)],
                           cwd=REPO, capture_output=True, text=True, timeout=30)
    assert r.returncode == 1
    assert f"127.0.0.1:{port}" in r.stderr and r.stdout == ""


def test_bad_config_exits_2(tmp_path):
    cfg = tmp_path / "bad.toml"
    cfg.write_text("[mqtt]\nmax_inflight = 0\n")
    r = subprocess.run([sys.executable, "-m", "cluster.cli",
                        "broker", "--config", str(cfg), "--port", "0"], cwd=REPO, capture_output=True, text=True, timeout=30)
    assert r.returncode == 2 and "mqtt.max_inflight" in r.stderr
