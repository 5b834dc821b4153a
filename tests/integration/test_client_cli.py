"""``fanout send`` and ``fanout outbox status|dead-letters|replay`` as real subprocesses."""
from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

from fanout.client.outbox import Failure, Outbox, OutboxBatch
from fanout.client.submission import make_submission
from tests.integration.client_fixtures import (  # noqa: F401 - pytest fixtures
    FANOUT_BIN,
    PLATFORM,
    BrokerProcess,
    Watcher,
    client_broker,
    free_port,
    start_client_broker,
    client_watcher,
)


def fanout(*args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, FANOUT_LOG_LEVEL="warning", FANOUT_LOG_JSON="1")
    return subprocess.run([str(FANOUT_BIN), *args], capture_output=True, text=True, timeout=timeout, env=env)


def test_send_with_vins_file_then_outage_keeps_it_in_the_outbox(client_broker: BrokerProcess, client_watcher: Watcher, tmp_path: Path) -> None:
    (tmp_path / "vins.txt").write_text("VIN00000000000001\n# a comment\n\nVIN00000000000002\nVIN00000000000003\n")
    (tmp_path / "blob.bin").write_bytes(b"\x00firmware\xff")
    outbox = str(tmp_path / "ob")
    common = ["--username", PLATFORM[0], "--password", PLATFORM[1], "--payload-file", str(tmp_path / "blob.bin"), "--outbox-dir", outbox]
    r = fanout("send", "--port", str(client_broker.port), "--vins", str(tmp_path / "vins.txt"), "--request-id", "cli-1", "--max-batch", "2", *common)
    assert r.returncode == 0, r.stderr
    assert "sent cli-1: 3 VINs in 2 trigger(s)" in r.stdout
    assert client_watcher.wait_for(lambda w: w.request_ids() == ["cli-1", "cli-1"], 10)
    assert [v for t in client_watcher.triggers() for v in t["ids"]] == ["VIN00000000000001", "VIN00000000000002", "VIN00000000000003"]

    dead_port = str(free_port())
    r = fanout("send", "--port", dead_port, "--vin", "VINX", "--request-id", "cli-2", "--timeout", "0.5", "--quiet", *common)
    assert r.returncode == 3 and "stays in the outbox" in r.stderr
    status = json.loads(fanout("outbox", "status", "--outbox-dir", outbox, "--json").stdout)
    assert (status["depth"], status["dead_letters"]) == (1, 0)

    r = fanout("send", "--port", str(client_broker.port), "--vin", "VINY", "--request-id", "cli-3", "--quiet", *common)
    assert r.returncode == 0, r.stderr
    assert client_watcher.wait_for(lambda w: w.request_ids()[2:] == ["cli-2", "cli-3"], 10)  # the leftover goes first
    assert json.loads(fanout("outbox", "status", "--outbox-dir", outbox, "--json").stdout)["depth"] == 0


def test_send_rejects_bad_arguments(tmp_path: Path) -> None:
    (tmp_path / "blob").write_bytes(b"x")
    r = fanout("send", "--port", "1", "--vin", "A", "--payload-file", str(tmp_path / "missing"))
    assert r.returncode == 2 and "missing" in r.stderr
    r = fanout("send", "--port", "1", "--vin", "A", "--payload-file", str(tmp_path / "blob"), "--data-id", "a/b",
               "--outbox-dir", str(tmp_path / "ob"), "--timeout", "0.1")
    assert r.returncode == 2 and "data_id" in r.stderr


def test_outbox_status_dead_letters_and_replay(tmp_path: Path) -> None:
    path = tmp_path / "ob"
    ob = Outbox(path)
    subs = [make_submission(i, [f"V{i}"], b"p", f"req-{i}", None, 1000 + i) for i in (1, 2, 3)]
    ob.apply(OutboxBatch(appends=subs, failures=[Failure(2, "invalid_trigger: ids[0]: not a VIN", final=True)]))
    ob.close()

    status = json.loads(fanout("outbox", "status", "--outbox-dir", str(path), "--json").stdout)
    assert (status["depth"], status["dead_letters"], status["oldest_ts_ms"]) == (2, 1, 1001)
    text = fanout("outbox", "status", "--outbox-dir", str(path)).stdout
    assert "dead letters  1" in text
    [dead] = json.loads(fanout("outbox", "dead-letters", "--outbox-dir", str(path), "--json").stdout)
    assert (dead["seq"], dead["request_id"], dead["attempts"]) == (2, "req-2", 1) and "ids[0]" in dead["last_error"]
    assert "ids[0]" in fanout("outbox", "dead-letters", "--outbox-dir", str(path)).stdout

    holder = Outbox(path)  # a running client holds the lock: replay refuses
    r = fanout("outbox", "replay", "--outbox-dir", str(path))
    assert r.returncode == 1 and "in use by process" in r.stderr
    holder.close()
    r = fanout("outbox", "replay", "--outbox-dir", str(path), "--seq", "2")
    assert r.returncode == 0 and "replayed 1 dead letter(s): seq 2" in r.stdout
    status = json.loads(fanout("outbox", "status", "--outbox-dir", str(path), "--json").stdout)
    assert (status["depth"], status["dead_letters"]) == (3, 0)
    r = fanout("outbox", "status", "--outbox-dir", str(tmp_path / "nothing"))
    assert r.returncode == 1 and "no outbox" in r.stderr
