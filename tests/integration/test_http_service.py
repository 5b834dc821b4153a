"""The HTTP listener's life inside the controller: `fanout up` prints its URL, a taken port fails the start
naming it, ``http.port = 0`` means no listener, and stopping the cluster frees the port."""
from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from cluster.runtime import start_fanout

from .fanout_harness import fanout_config, running_cluster
from .http_fixtures import fetch, free_port, http_config

FANOUT = str(Path(sys.executable).parent / "fanout")
READY_TIMEOUT_S = 240  # a local Ray start takes 5-8 s idle, far more on a busy 2-core machine


def _lines(proc: subprocess.Popen, n: int, timeout: float) -> list[str]:
    box: list[str] = []
    t = threading.Thread(target=lambda: box.extend(proc.stdout.readline() for _ in range(n)), daemon=True)
    t.start()
    t.join(timeout)
    return box


def _rebind(port: int) -> None:
    """Listen on ``port`` as the HTTP listener does (SO_REUSEADDR: closed connections may linger in TIME_WAIT)."""
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        s.bind(("127.0.0.1", port))
        s.listen()


def test_fanout_up_prints_the_console_url_after_the_ready_line_and_serves_it(tmp_path):
    http_port = free_port()
    env = {**os.environ, "FANOUT_LOG_JSON": "1", "FANOUT_HTTP_PORT": str(http_port)}
    env.pop("RAY_ADDRESS", None)
    err = open(tmp_path / "up.err", "w")
    proc = subprocess.Popen([FANOUT, "up", "--port", "0", "--data-dir", str(tmp_path / "data"), "--address", "local"],
                            stdout=subprocess.PIPE, stderr=err, text=True, env=env)
    try:
        lines = _lines(proc, 2, READY_TIMEOUT_S)
        assert len(lines) == 2 and lines[0].startswith("fanout ready mqtt://127.0.0.1:"), (lines, proc.poll())
        assert lines[1] == f"fanout console http://127.0.0.1:{http_port}/\n", lines
        status = fetch(f"http://127.0.0.1:{http_port}/api/status")
        assert status.status == 200 and status.json()["nodes"][0]["port"] == int(lines[0].rsplit(":", 1)[1])
        assert b"<title>sdv-fanout console</title>" in fetch(f"http://127.0.0.1:{http_port}/").body
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(90) == 0
        assert proc.stdout.read() == ""
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(30)
        err.close()
    _rebind(http_port)  # the controller let go of the port
    # (actor log lines reach the driver's stderr behind a "(Controller pid=...)" prefix)
    assert '"event": "http console open without login (development mode)"' in (tmp_path / "up.err").read_text()


def test_a_taken_http_port_fails_the_start_naming_it(ray_local, tmp_path):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        cfg = fanout_config(tmp_path).replace("http", port=port)
        with pytest.raises(RuntimeError, match=f"cannot listen for HTTP on 127.0.0.1:{port}"):
            start_fanout(cfg, name="fanout-controller-http-taken", log_to_driver=False)


def test_port_0_means_no_listener_and_stop_frees_the_port(ray_local, tmp_path):
    with running_cluster(fanout_config(tmp_path / "off")) as off:
        assert off.info["http"] is None
    cfg = http_config(tmp_path / "on")
    with running_cluster(cfg) as on:
        assert on.info["http"] == f"http://127.0.0.1:{cfg.http.port}/"
        assert fetch(on.info["http"] + "metrics").status == 200
    _rebind(cfg.http.port)
