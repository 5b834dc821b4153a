"""The mock fleet (``scripts.mock_vehicles``) against ``fanout broker`` run as a subprocess.

A raw codec publisher (anonymous clients are ``admin`` in this broker's config) publishes a known
sequence of QoS 1 messages on the vehicles' delivery topics; the fleet's summary must count it exactly:
received, unique, duplicates with and without DUP, order violations, per-request counts and latency,
with one process and with two (the merge path). A persistent-session fleet with crash rate 1.0 shows
each crash, its reconnect and the DUP=1 redelivery.
"""
from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any, Callable

import pytest
import structlog

from fanout.mqtt.packets import Puback, Publish
from scripts import mock_platform, mock_vehicles
from scripts.fleet.payload import stamp
from scripts.fleet.runner import run_fleet
from scripts.fleet.vins import make_vins
from scripts.fleet.options import FleetOptions

from .conftest import HOST, REPO, RawClient, cli_broker, url_port

pytestmark = pytest.mark.timeout(60)


@pytest.fixture(scope="module")
def port(tmp_path_factory: pytest.TempPathFactory) -> Any:
    config = tmp_path_factory.mktemp("fleet") / "fanout.toml"
    config.write_text('[mqtt]\nanonymous_role = "admin"\n')
    # cli_broker reads only the ready line: at info level the broker logs every connect and would block
    # on a full stderr pipe after ~64 KB, so keep it quiet
    with cli_broker("--config", str(config), env={"FANOUT_LOG_LEVEL": "error"}) as (_, url):
        yield url_port(url)


class FleetRun:
    """``run_fleet`` in a background thread, with its latest merged counters."""

    def __init__(self, opts: FleetOptions) -> None:
        self.latest: dict[str, Any] = {}
        self.summary: dict[str, Any] | None = None
        self.error: BaseException | None = None
        self.stop = threading.Event()
        self._thread = threading.Thread(target=self._run, args=(opts,), daemon=True)
        self._thread.start()

    def _run(self, opts: FleetOptions) -> None:
        try:
            self.summary = run_fleet(opts, progress=self.latest.update, stop=self.stop)
        except BaseException as exc:  # reported by wait()/result()
            self.error = exc

    def wait(self, pred: Callable[[dict[str, Any]], bool], what: str, timeout: float = 20.0) -> None:
        deadline = time.monotonic() + timeout
        while not pred(self.latest):
            if self.error is not None:
                raise self.error
            if time.monotonic() > deadline:
                raise AssertionError(f"timed out waiting for {what}; fleet: {self.latest}")
            time.sleep(0.02)

    def result(self, timeout: float = 30.0) -> dict[str, Any]:
        self._thread.join(timeout)
        if self._thread.is_alive():
            self.stop.set()
            self._thread.join(15)
            raise AssertionError(f"the fleet did not stop by itself; fleet: {self.latest}")
        if self.error is not None:
            raise self.error
        assert self.summary is not None
        return self.summary


class Publisher:
    """Raw codec QoS 1 publisher (can set DUP on what it sends)."""

    def __init__(self, port: int, client_id: str) -> None:
        self.raw = RawClient(port)
        self.raw.connect(client_id)
        self.pid = 0

    def publish(self, vin: str, rid: str, payload: bytes, dup: bool = False) -> None:
        self.pid += 1
        self.raw.send(Publish(f"agent/{vin}/proxy/request/{rid}", payload, 1, False, dup, self.pid))

    def wait_acks(self) -> None:
        acks = self.raw.recv_n(self.pid)
        assert all(isinstance(a, Puback) for a in acks)
        self.raw.close()


def fleet_options(port: int, prefix: str, count: int, **kw: Any) -> FleetOptions:
    base = dict(host=HOST, port=port, vin_prefix=prefix, count=count, display="off", heartbeat_interval=0.5,
                connect_rate=0, reconnect_delay=0.2, seed=7, timeout=25.0)
    base.update(kw)
    return FleetOptions(**base)


def send_known_sequence(port: int, vins: list[str]) -> None:
    """r1 to all, r2 to ten, a plain duplicate and a DUP=1 resend of r1, then r4 before r3 to one."""
    pub = Publisher(port, f"tester-{vins[0]}")
    for vin in vins:
        pub.publish(vin, "r1", stamp(b"blob-1"))
    for vin in vins[:10]:
        pub.publish(vin, "r2", b"no header")
    pub.publish(vins[0], "r1", stamp(b"blob-1"))  # the sender queued it twice: a non-DUP duplicate
    # DUP=1 from the publisher is not propagated (MQTT-3.3.1-3): a non-DUP duplicate for the vehicle too
    pub.publish(vins[1], "r1", stamp(b"blob-1"), dup=True)
    pub.publish(vins[2], "r4", b"four")
    pub.publish(vins[2], "r3", b"three")  # arrives after r4: one order violation
    pub.wait_acks()


def check_known_sequence(s: dict[str, Any], n: int, processes: int) -> None:
    assert s["stop_reason"] == "expect" and s["complete"], s
    assert s["vehicles"] == n and s["processes"] == processes
    assert (s["connected"], s["subscribed"], s["connects"], s["connect_errors"]) == (n, n, n, 0)
    assert (s["crashes"], s["reconnects"], s["connection_losses"], s["unexpected_topics"]) == (0, 0, 0, 0)
    assert s["received"] == n + 10 + 2 + 2
    assert s["unique"] == n + 10 + 2
    assert s["duplicates"] == {"total": 2, "dup_flag": 0, "no_dup_flag": 2}
    assert s["order_violations"] == 1
    assert s["pubacks"] == s["received"]
    assert list(s["requests"]) == ["r1", "r2", "r3", "r4"]
    r1, r2 = s["requests"]["r1"], s["requests"]["r2"]
    assert (r1["count"], r1["duplicates"], r1["timestamped"]) == (n, 2, True)
    assert (r2["count"], r2["duplicates"], r2["timestamped"]) == (10, 0, False)
    assert (s["requests"]["r3"]["count"], s["requests"]["r4"]["count"]) == (1, 1)
    lat = r1["latency_ms"]
    assert 0 <= lat["p50"] <= lat["p90"] <= lat["p99"] <= lat["max"] < 10_000
    assert r2["latency_ms"]["p50"] >= 0
    assert s["connect"]["first_connects"] == n and s["connect"]["rate_per_s"] > 0
    assert s["rss"]["per_connection_bytes"] > 0 and len(s["rss"]["per_process"]) == processes
    assert s["heartbeats"] >= n  # online at least


@pytest.mark.parametrize("processes", [1, 2])
def test_known_sequence_is_counted_exactly(port: int, processes: int) -> None:
    n = 50
    prefix = f"SEQ{processes}X"
    vins = make_vins(prefix, n)
    run = FleetRun(fleet_options(port, prefix, n, processes=processes, expect=n + 12, linger=0.5,
                                 expect_order=True, order_ids=["r1", "r2", "r3", "r4"]))
    run.wait(lambda m: m.get("subscribed") == n, f"{n} subscribed vehicles")
    send_known_sequence(port, vins)
    check_known_sequence(run.result(), n, processes)


def test_crash_before_puback_reconnects_and_gets_dup_redelivery(port: int) -> None:
    vins = make_vins("CRASH", 2)
    run = FleetRun(fleet_options(port, "CRASH", 2, persistent=True, crash_rate=1.0))
    run.wait(lambda m: m.get("subscribed") == 2, "2 subscribed vehicles")
    pub = Publisher(port, "tester-crash")
    for vin in vins:
        pub.publish(vin, "ota-1", stamp(b"update"))
    pub.wait_acks()
    # each vehicle crashes on its first receipt, resumes its session, gets ota-1 again with DUP=1, acks it
    run.wait(lambda m: m.get("pubacks") == 2 and m.get("subscribed") == 2, "both redeliveries acknowledged")
    time.sleep(0.3)  # nothing more may arrive
    run.stop.set()
    s = run.result()
    assert s["stop_reason"] == "external"
    assert (s["crashes"], s["reconnects"], s["connects"], s["connection_losses"]) == (2, 2, 4, 0)
    assert (s["received"], s["unique"], s["pubacks"]) == (4, 2, 2)
    assert s["duplicates"] == {"total": 2, "dup_flag": 2, "no_dup_flag": 0}
    assert s["requests"]["ota-1"]["count"] == 2 and s["requests"]["ota-1"]["duplicates"] == 2


def test_refused_connects_are_counted_and_retried_with_backoff(port: int) -> None:
    run = FleetRun(fleet_options(port, "REFUSED", 3, username="nobody", password="wrong", duration=1.5))
    s = run.result()
    assert (s["connected"], s["connects"], s["subscribed"]) == (0, 0, 0)
    # 3 vehicles, backoff 0.2, 0.4, 0.8 s (+-20%): 3 or 4 attempts each in 1.5 s
    assert 9 <= s["connect_errors"] <= 12 and s["errors"] == {"CONNACK return code 4": s["connect_errors"]}


@pytest.fixture
def keep_logging(monkeypatch: pytest.MonkeyPatch) -> Any:
    """main() configures structlog for its process; in-process calls must not change the test session's
    configuration, and their log lines must not land on the stdout the JSON summary is read from."""
    monkeypatch.setattr("fanout.log.configure", lambda **_: None)
    with structlog.testing.capture_logs() as logs:
        yield logs


def test_cli_prints_json_summary_and_exit_status(port: int, tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                 keep_logging: Any) -> None:
    out = tmp_path / "summary.json"
    proc = subprocess.run([sys.executable, "-m", "scripts.mock_vehicles", "--port", str(port), "--vin-prefix", "CLI",
                           "--count", "5", "--duration", "1", "--display", "off", "--summary", str(out)],
                          capture_output=True, text=True, timeout=30, cwd=REPO)
    assert proc.returncode == 0, proc.stderr
    summary = json.loads(proc.stdout)
    assert summary == json.loads(out.read_text())
    assert (summary["stop_reason"], summary["connected"], summary["subscribed"]) == ("duration", 5, 5)
    # --expect not reached by --timeout: exit status 1, complete false (main() in-process: no interpreter start-up)
    assert mock_vehicles.main(["--port", str(port), "--vin-prefix", "CLJ", "--count", "2", "--expect", "1",
                               "--timeout", "0.5", "--display", "off"]) == 1
    summary = json.loads(capsys.readouterr().out)
    assert (summary["stop_reason"], summary["complete"]) == ("timeout", False)
    assert mock_vehicles.main(["--port", str(port), "--crash-rate", "2"]) == 2


def test_mock_platform_sends_requests_and_fails_on_errors(port: int, tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                         keep_logging: Any) -> None:
    order = tmp_path / "order.txt"
    proc = subprocess.run([sys.executable, "-m", "scripts.mock_platform", "--port", str(port), "--username", "platform",
                           "--password", "platform", "--vin-prefix", "PLT", "--count", "20", "--requests", "3",
                           "--request-id", "job", "--payload-size", "64", "--order-file", str(order), "--quiet"],
                          capture_output=True, text=True, timeout=30, cwd=REPO)
    assert proc.returncode == 0, proc.stderr
    s = json.loads(proc.stdout)
    assert (s["submissions"], s["acked"], s["errors"], s["vins"], s["payload_bytes"]) == (3, 3, [], 20, 64)
    assert s["request_ids"] == ["job-000001", "job-000002", "job-000003"] == order.read_text().split()
    assert s["outbox_dir"] is None
    # nothing listens on port 1: not acknowledged within --timeout -> exit 1, the outbox is kept
    assert mock_platform.main(["--port", "1", "--count", "2", "--timeout", "0.5", "--outbox-dir",
                               str(tmp_path / "outbox"), "--quiet"]) == 1
    s = json.loads(capsys.readouterr().out)
    assert (s["acked"], s["timed_out"]) == (0, 1) and s["outbox_dir"] == str(tmp_path / "outbox")
    assert mock_platform.main(["--payload-size", "4"]) == 2
    assert "payload-size" in capsys.readouterr().err
