"""``fanout up`` with ``[[topics]]`` in its config (a subprocess, own local Ray), then ``fanout topics
create|list|show`` and ``fanout consume`` against it as a user runs them; a bad ``[[topics]]`` table stops
start-up naming its key."""
from __future__ import annotations

import json
import signal
import subprocess
import time

import paho.mqtt.client as mqtt

from .test_fanout_cli import FANOUT, READY_TIMEOUT_S, _env, _read_ready_line

CONFIG = """
[mqtt]
sys_interval = "0s"

[http]
port = 0

[[topics]]
name = "responses"
filter = "ecp/+/response"
"""


def _publish(port: int, topic: str, payloads: list[bytes]) -> None:
    c = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2, client_id="cli-topics-pub", protocol=mqtt.MQTTv311)
    c.connect("127.0.0.1", port, keepalive=30)
    c.loop_start()
    try:
        for p in payloads:
            c.publish(topic, p, qos=1).wait_for_publish(30)
    finally:
        c.disconnect()
        c.loop_stop()


def test_topics_and_consume_commands_against_fanout_up(tmp_path):
    data_dir = tmp_path / "data"
    conf = tmp_path / "fanout.toml"
    conf.write_text(CONFIG)
    err = open(tmp_path / "up.err", "w")
    proc = subprocess.Popen([FANOUT, "up", "--config", str(conf), "--port", "0", "--data-dir", str(data_dir),
                             "--address", "local"], stdout=subprocess.PIPE, stderr=err, text=True, env=_env())

    def fanout(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run([FANOUT, *args, "--data-dir", str(data_dir)], capture_output=True, text=True,
                              timeout=180, env=_env())

    try:
        port = int(_read_ready_line(proc, READY_TIMEOUT_S).strip().rsplit(":", 1)[1])
        _publish(port, "ecp/VINCLI0000000001/response", [b"one", b"\xff\xfe"])
        listed = fanout("topics", "list", "--json")
        assert listed.returncode == 0, listed.stderr[-2000:]
        assert [(t["name"], t["high"]) for t in json.loads(listed.stdout)] == [("receipts", 0), ("responses", 2)]
        out = fanout("consume", "responses", "--group", "ops", "--from", "earliest", "--json", "--ack")
        assert out.returncode == 0, out.stderr[-2000:]
        lines = [json.loads(line) for line in out.stdout.splitlines()]
        assert [x.get("payload") or x.get("payload_b64") for x in lines] == ["one", "//4="]
        assert fanout("consume", "responses", "--group", "ops", "--json").stdout == ""  # acknowledged: nothing left
        created = fanout("topics", "create", "plant", "--filter", "plant/#", "--partitions", "1", "--json")
        assert created.returncode == 0, created.stderr[-2000:]
        assert json.loads(created.stdout)["partitions"] == [{"partition": 0, "low": 0, "next": 0}]
        _publish(port, "plant/line1", [b"21"])
        shown = fanout("topics", "show", "plant")
        assert shown.returncode == 0 and "high        1" in shown.stdout, shown.stdout + shown.stderr[-2000:]
        bad = fanout("topics", "create", "x", "--filter", "$SYS/#")
        assert bad.returncode == 2 and "topic.filter" in bad.stderr
        unknown = fanout("consume", "nope", "--group", "g")
        assert unknown.returncode == 2 and "no durable topic 'nope'" in unknown.stderr
        status = fanout("status")
        assert {t["name"] for t in json.loads(status.stdout)["topics"]} == {"receipts", "responses", "plant"}
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(90) == 0
        # stopped: --data-dir reads the stores themselves, offsets included
        after = fanout("consume", "plant", "--group", "ops2", "--from", "earliest")
        assert after.returncode == 0 and after.stdout.split()[-1] == "21", after.stdout + after.stderr[-2000:]
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(30)
        err.close()


def test_a_bad_topics_table_stops_start_up_naming_it(tmp_path):
    bad = tmp_path / "bad.toml"
    bad.write_text('[[topics]]\nname = "a"\nfilter = "$share/g/x"\n')
    started = time.monotonic()
    r = subprocess.run([FANOUT, "up", "--config", str(bad), "--data-dir", str(tmp_path / "d")], capture_output=True,
                       text=True, timeout=120, env=_env())
    assert r.returncode == 2 and "topics[0].filter" in r.stderr and r.stdout == ""
    assert time.monotonic() - started < 60
