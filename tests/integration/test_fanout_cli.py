"""The command line: ``fanout up`` as a subprocess (own local Ray), ``fanout status``/``inspect`` against it,
and the data dir lock between ``fanout up`` and offline ``fanout gc``."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from storage.data_dir_lock import DataDirLock

from .fanout_harness import Vehicle, publish_batch

FANOUT = str(Path(sys.executable).parent / "fanout")
READY_TIMEOUT_S = 240  # a local Ray start takes 5-8 s idle, far more on a busy 2-core machine


def _env() -> dict[str, str]:
    env = dict(os.environ)
    env.pop("RAY_ADDRESS", None)
    env["FANOUT_LOG_JSON"] = "1"
    return env


def _read_ready_line(proc: subprocess.Popen, timeout: float) -> str:
    box: list[str] = []
    t = threading.Thread(target=lambda: box.append(proc.stdout.readline()), daemon=True)
    t.start()
    t.join(timeout)
    if not box or not box[0]:
        proc.kill()
        raise AssertionError(f"`fanout up` printed no ready line within {timeout:.0f}s (exit code {proc.poll()})")
    return box[0]


def test_fanout_up_prints_ready_line_serves_status_refuses_offline_gc_and_stops_on_sigterm(tmp_path):
    data_dir = tmp_path / "data"
    err = open(tmp_path / "up.err", "w")
    proc = subprocess.Popen([FANOUT, "up", "--port", "0", "--data-dir", str(data_dir), "--address", "local"],
                            stdout=subprocess.PIPE, stderr=err, text=True, env=_env())
    try:
        line = _read_ready_line(proc, READY_TIMEOUT_S)
        assert line.startswith("fanout ready mqtt://127.0.0.1:"), line
        port = int(line.strip().rsplit(":", 1)[1])
        publish_batch(port, ["CLI1"], "cli-1")
        car = Vehicle(port, "CLI1")
        try:
            car.heartbeat()
            assert car.next_message(30).topic == "agent/CLI1/proxy/request/cli-1"
        finally:
            car.close()
        status = subprocess.run([FANOUT, "status", "--data-dir", str(data_dir)], capture_output=True, text=True,
                                timeout=120, env=_env())
        assert status.returncode == 0, status.stderr[-2000:]
        st = json.loads(status.stdout)
        assert st["nodes"][0]["port"] == port and len(st["shards"]) >= 1
        inspect = subprocess.run([FANOUT, "inspect", "request", "cli-1", "--data-dir", str(data_dir)],
                                 capture_output=True, text=True, timeout=120, env=_env())
        assert inspect.returncode == 0, inspect.stderr[-2000:]
        assert json.loads(inspect.stdout)["rows"] == 1
        publish_batch(port, ["CLI2", "CLI3"], "cli-2")  # nobody connected: pending

        def requests(*args: str) -> subprocess.CompletedProcess:
            return subprocess.run([FANOUT, "requests", *args, "--data-dir", str(data_dir)], capture_output=True,
                                  text=True, timeout=120, env=_env())

        listed = requests("list")
        assert listed.returncode == 0, listed.stderr[-2000:]
        rows = [line.split() for line in listed.stdout.splitlines()[1:]]
        assert [(r[0], r[-1]) for r in rows] == [("cli-1", "done"), ("cli-2", "active")], listed.stdout
        shown = requests("show", "cli-1", "--json")
        assert shown.returncode == 0 and json.loads(shown.stdout)["delivered"] == 1, shown.stderr[-2000:]
        cancelled = requests("cancel", "cli-2", "--json")
        assert cancelled.returncode == 0, cancelled.stderr[-2000:]
        after = json.loads(cancelled.stdout)
        assert (after["cancelled"], after["pending"], after["state"]) == (2, 0, "cancelled")
        unknown = requests("show", "no-such-request")
        assert unknown.returncode == 2 and "no request 'no-such-request'" in unknown.stderr and unknown.stdout == ""
        # offline GC would write the shards behind the dispatchers' backs: refused at once, pointing at --live
        started = time.monotonic()
        gc = subprocess.run([FANOUT, "gc", "--now", "--data-dir", str(data_dir)], capture_output=True, text=True,
                            timeout=120, env=_env())
        assert gc.returncode == 1 and gc.stdout.strip() == "", gc.stderr[-2000:]  # (the progress display ends its line)
        assert f"in use by fanout up (pid {proc.pid})" in gc.stderr and "fanout gc --live" in gc.stderr, gc.stderr
        assert time.monotonic() - started < 60  # refused before Spark starts
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(90) == 0
        rest = proc.stdout.read()
        assert rest == "", f"only the ready line goes to stdout, got {rest!r}"
        with DataDirLock(data_dir, "test"):  # released with the process
            pass
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(30)
        err.close()


def test_taken_port_fails_start_with_a_message_naming_it(ray_local, tmp_path):
    """In process on the session Ray (no other fanout cluster may hold the fanout_node resource)."""
    import socket

    from cluster.runtime import start_fanout

    from .fanout_harness import fanout_config

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        cfg = fanout_config(tmp_path).replace("mqtt", port=port)
        with pytest.raises(RuntimeError, match=f"cannot listen on 127.0.0.1:{port}"):
            start_fanout(cfg, name="fanout-controller-port-taken", log_to_driver=False)


def test_fanout_up_with_a_bad_config_exits_2_naming_the_key(tmp_path):
    bad = tmp_path / "bad.toml"
    bad.write_text('[fanout]\ntopic_prefix = "no-placeholder"\n')
    started = time.monotonic()
    r = subprocess.run([FANOUT, "up", "--config", str(bad), "--data-dir", str(tmp_path / "d")], capture_output=True,
                       text=True, timeout=120, env=_env())
    assert r.returncode == 2 and "fanout.topic_prefix" in r.stderr and r.stdout == ""
    assert time.monotonic() - started < 60  # refused before any Ray start


def test_fanout_up_refuses_a_data_dir_that_offline_gc_holds(tmp_path):
    data_dir = tmp_path / "data"
    data_dir.mkdir()
    started = time.monotonic()
    with DataDirLock(data_dir, "offline gc"):
        r = subprocess.run([FANOUT, "up", "--port", "0", "--data-dir", str(data_dir), "--address", "local"],
                           capture_output=True, text=True, timeout=120, env=_env())
    assert r.returncode == 1 and r.stdout == "", r.stderr[-2000:]
    assert f"in use by offline gc (pid {os.getpid()})" in r.stderr, r.stderr
    assert time.monotonic() - started < 60  # refused before any Ray start
    assert not (data_dir / "ray_address").exists()


def test_fanout_status_without_a_cluster_exits_1(tmp_path):
    r = subprocess.run([FANOUT, "status", "--address", "127.0.0.1:1"], capture_output=True, text=True, timeout=120,
                       env=_env())
    assert r.returncode == 1 and "no Ray cluster" in r.stderr


@pytest.mark.parametrize("module", ["cluster.cli.up", "cluster.cli.status", "cluster.cli.gc"])
def test_cli_modules_import_without_ray(module):
    """Ray is imported by the commands that use it, when they run: ``fanout --help`` or ``send`` stay quick."""
    code = f"import sys, {module}, cluster.cli; cluster.cli.build_parser(); assert 'ray' not in sys.modules"
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)
