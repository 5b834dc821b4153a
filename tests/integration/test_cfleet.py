"""cfleet, the compiled load generator, against a real Mosquitto started here on a free loopback port.

What is checked (small sizes, every wait bounded; the whole file takes ~20 s):

- every vehicle connects and subscribes, every PUBLISH ``cfleet publish`` sends is received once,
  PUBACKed once and acknowledged to the publisher; the JSON figures agree with each other;
- PUBACKs really reached the broker: the same VINs reconnect with persistent sessions and Mosquitto,
  which resends unacknowledged QoS 1 messages to a resumed session, has nothing left for them;
- a message the broker redelivers with DUP=1 (a raw client took it without PUBACK) is PUBACKed and
  counted (``dup_flag``), and is not redelivered again afterwards;
- packets larger than one read (partial reads) and the online / heartbeat publishes, counted by an
  independent subscriber;
- ``--until-signal`` with SIGUSR1 snapshots and SIGTERM;
- ``benchmarks.server_bench`` in quick mode with Mosquitto alone (its plumbing; the cluster's side
  starts Ray and is left to the benchmark runs).

Skips only when gcc or Mosquitto is missing (``make mosquitto`` installs it).
"""
from __future__ import annotations

import json
import shutil
import socket
import subprocess
import threading
import time
from dataclasses import replace
from typing import Any, Iterator

import pytest

from benchmarks import cfleet_run, server_bench
from benchmarks.cfleet_run import FleetProcess, FleetSpec, PublishSpec, run_fleet, run_publish
from benchmarks.harness.peers import PeerBroker
from benchmarks.harness.versions import mosquitto_binary
from fanout.mqtt.codec import PacketReader, encode
from fanout.mqtt.packets import Connack, Connect, Publish, Suback, Subscribe
from tests.integration.fanout_harness import wait_until

pytestmark = [
    pytest.mark.timeout(60),
    pytest.mark.skipif(shutil.which("gcc") is None, reason="gcc is not installed"),
    pytest.mark.skipif(mosquitto_binary() is None,
                       reason="mosquitto is not installed (run `make mosquitto`: apt-get install mosquitto)"),
]

CAP_S = 20.0


@pytest.fixture(scope="module")
def binary() -> str:
    return str(cfleet_run.build())


@pytest.fixture(scope="module")
def mosquitto(binary: str) -> Iterator[PeerBroker]:
    with PeerBroker("mosquitto") as broker:
        yield broker


class Observer:
    """A plain subscriber (the project's codec on a socket, in a thread) counting what it receives."""

    def __init__(self, port: int, topic_filter: str) -> None:
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=5)
        self.sock.sendall(encode(Connect(f"observer-{time.monotonic_ns()}")) + encode(Subscribe(1, ((topic_filter, 0),))))
        self.reader = PacketReader()
        self.topics: list[str] = []
        self.subscribed = threading.Event()
        self._stop = False
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()
        assert self.subscribed.wait(5), "observer not subscribed"

    def _run(self) -> None:
        self.sock.settimeout(0.2)
        while not self._stop:
            try:
                data = self.sock.recv(65536)
            except socket.timeout:
                continue
            except OSError:
                return
            if not data:
                return
            for p in self.reader.feed(data):
                if isinstance(p, Suback):
                    self.subscribed.set()
                elif isinstance(p, Publish):
                    self.topics.append(p.topic)

    def count(self, suffix: str) -> int:
        return sum(t.endswith(suffix) for t in list(self.topics))

    def close(self) -> None:
        self._stop = True
        self._thread.join(2)
        self.sock.close()


def _consistent(r: dict[str, Any]) -> None:
    """Figures of one fleet JSON that must agree with each other whatever the load."""
    assert r["connect_latency_ms"]["count"] == r["connects"]
    assert r["subscribe_latency_ms"]["count"] == r["ever_subscribed"]
    assert r["deliveries"] == r["unique"] + r["duplicates"]
    assert r["delivery_latency_ms"]["count"] <= r["unique"]
    for key in ("connect_latency_ms", "subscribe_latency_ms", "delivery_latency_ms"):
        h = r[key]
        if h["count"]:
            assert 0 <= h["p50"] <= h["p90"] <= h["p99"] <= h["max"] + 1e-9
    if r["connects"]:
        assert r["first_connect_unix_us"] <= r["last_connack_unix_us"] <= r["last_suback_unix_us"]
        assert r["cpu_us_per_connect"] == pytest.approx(r["cpu_connect_s"] / r["connects"] * 1e6, rel=0.01, abs=0.02)
    if r["unique"] > 1:
        span = (r["last_delivery_unix_us"] - r["first_delivery_unix_us"]) / 1e6
        assert r["first_delivery_unix_us"] > 0 and span > 0
        assert r["deliveries_per_s"] == pytest.approx(r["unique"] / span, rel=0.01)
        assert r["cpu_us_per_delivery"] == pytest.approx(r["cpu_run_s"] / r["deliveries"] * 1e6, rel=0.01, abs=0.02)
    assert r["cpu_s"] >= r["cpu_connect_s"] + r["cpu_run_s"] - 0.01
    assert r["cpu_s"] == pytest.approx(r["cpu_user_s"] + r["cpu_sys_s"], abs=0.002)
    assert r["processes"] >= 1 and r["wall_s"] > 0


def test_every_publish_is_received_and_acknowledged_once(mosquitto: PeerBroker) -> None:
    vehicles, requests = 300, 3
    observer = Observer(mosquitto.port, "ecp/+/online")
    try:
        spec = FleetSpec(mosquitto.port, vehicles, requests=requests, start=1, processes=2, concurrency=50,
                         settle_s=0.3, time_cap_s=CAP_S)
        with FleetProcess(spec) as fleet:
            ready_s = fleet.wait_ready(CAP_S)
            pub = run_publish(PublishSpec(mosquitto.port, vehicles, requests, start=1, window=64, request_prefix="once",
                                          time_cap_s=CAP_S))
            r = fleet.result(CAP_S + 10)
        wait_until(lambda: observer.count("/online") >= vehicles, 5.0, "every online publish at the observer")
        assert observer.count("/online") == vehicles
    finally:
        observer.close()
    assert pub["status"] == "done"
    assert pub["publishes"] == pub["pubacks"] == vehicles * requests
    assert pub["unknown_pubacks"] == 0
    assert r["status"] == "done" and 0 < ready_s <= r["ready_s"] + 0.01
    assert r["processes"] == 2 and r["vehicles"] == vehicles
    assert r["connects"] == r["ever_subscribed"] == r["subscribed_at_stop"] == vehicles
    assert r["connect_errors"] == r["losses"] == r["subscribe_errors"] == 0
    assert r["onlines"] == vehicles
    assert r["expected_unique"] == vehicles * requests
    assert r["deliveries"] == r["unique"] == r["pubacks"] == vehicles * requests
    assert r["duplicates"] == r["dup_flag"] == r["wrong_topic"] == r["protocol_errors"] == r["qos2"] == 0
    assert r["delivery_latency_ms"]["count"] == vehicles * requests  # every payload carried the send time
    assert pub["first_publish_unix_us"] <= r["first_delivery_unix_us"]
    assert r["last_delivery_unix_us"] <= pub["last_puback_unix_us"] + 2_000_000
    _consistent(r)


def test_publish_without_request_ids_uses_one_topic_per_vehicle(mosquitto: PeerBroker) -> None:
    """``--request-prefix ''`` (topics_bench's durable appends): every PUBLISH on the VIN's own topic, acknowledged."""
    vehicles, requests = 20, 3
    observer = Observer(mosquitto.port, "ecp/#")
    try:
        pub = run_publish(PublishSpec(mosquitto.port, vehicles, requests, start=7001, prefix="BENCH", digits=12,
                                      topic_prefix="ecp/{VIN}/response", request_prefix="", payload=1024, window=8,
                                      client_id="cfleet-no-rid", time_cap_s=CAP_S))
        wait_until(lambda: len(observer.topics) >= vehicles * requests, 5.0, "every publish at the observer")
        got = list(observer.topics)
    finally:
        observer.close()
    assert pub["status"] == "done" and pub["publishes"] == pub["pubacks"] == vehicles * requests
    expected = {f"ecp/BENCH{7001 + i:012d}/response" for i in range(vehicles)}
    assert set(got) == expected and len(got) == vehicles * requests


def test_pubacks_reached_the_broker_and_dup_redelivery_is_acknowledged(mosquitto: PeerBroker) -> None:
    """Persistent sessions: whatever the fleet did not PUBACK, Mosquitto would resend on reconnect."""
    vehicles, requests, start = 50, 2, 1001

    def spec(requests: int = 0, settle_s: float = 0.0) -> FleetSpec:
        return FleetSpec(mosquitto.port, vehicles, requests=requests, start=start, persistent=True, settle_s=settle_s,
                         time_cap_s=CAP_S, progress_s=0)

    assert run_fleet(spec())["ever_subscribed"] == vehicles  # the sessions now exist on the broker
    with FleetProcess(spec(requests, settle_s=0.2)) as fleet:
        fleet.wait_ready(CAP_S)
        pub = run_publish(PublishSpec(mosquitto.port, vehicles, requests, start=start, request_prefix="persist",
                                      time_cap_s=CAP_S))
        got = fleet.result(CAP_S + 10)
    assert pub["pubacks"] == vehicles * requests
    assert got["unique"] == got["pubacks"] == vehicles * requests and got["duplicates"] == 0
    # resumed sessions: nothing unacknowledged is left, so nothing comes again
    again = run_fleet(spec(settle_s=1.0))
    assert again["ever_subscribed"] == vehicles
    assert again["deliveries"] == 0, again

    # a raw client takes one message for the first VIN without PUBACK; the fleet then gets it with DUP=1
    vin = f"WVW{start:014d}"
    raw = socket.create_connection(("127.0.0.1", mosquitto.port), timeout=5)
    reader = PacketReader()
    raw.sendall(encode(Connect(vin, clean_session=False)) + encode(Subscribe(7, ((f"agent/{vin}/proxy/request/+", 1),))))
    packets: list[Any] = []
    deadline = time.monotonic() + 5
    while not any(isinstance(p, Suback) for p in packets) and time.monotonic() < deadline:
        packets += reader.feed(raw.recv(65536))
    assert isinstance(packets[0], Connack)
    one = run_publish(PublishSpec(mosquitto.port, 1, 1, start=start, request_prefix="dup", time_cap_s=CAP_S))
    assert one["pubacks"] == 1
    while not any(isinstance(p, Publish) for p in packets) and time.monotonic() < deadline:
        packets += reader.feed(raw.recv(65536))
    assert any(isinstance(p, Publish) and p.qos == 1 for p in packets)
    raw.close()  # without PUBACK
    redelivered = run_fleet(spec(settle_s=1.0))
    assert redelivered["deliveries"] == redelivered["dup_flag"] == redelivered["pubacks"] == 1
    assert redelivered["unique"] == 1 and redelivered["duplicates"] == 0
    _consistent(redelivered)
    assert run_fleet(spec(settle_s=1.0))["deliveries"] == 0  # acknowledged: not sent a third time


def test_partial_reads_heartbeats_and_signals(mosquitto: PeerBroker) -> None:
    vehicles = 40
    big = 300_000  # several reads per PUBLISH (the read buffer is 64 KiB)
    observer = Observer(mosquitto.port, "ecp/+/heartbeat")
    try:
        spec = FleetSpec(mosquitto.port, vehicles, start=2001, heartbeat_interval=0.4, until_signal=True,
                         time_cap_s=CAP_S, progress_s=0)
        with FleetProcess(spec) as fleet:
            fleet.wait_ready(CAP_S)
            pub = run_publish(PublishSpec(mosquitto.port, vehicles, 2, start=2001, payload=big, window=16,
                                          request_prefix="big", time_cap_s=CAP_S))
            assert pub["pubacks"] == 2 * vehicles
            wait_until(lambda: fleet.snapshot()["unique"] >= 2 * vehicles, CAP_S / 2, "every big PUBLISH at the fleet")
            a = fleet.snapshot()
            time.sleep(1.0)
            b = fleet.snapshot()
            fleet.stop()
            r = fleet.result(CAP_S)
        rate = (b["heartbeats"] - a["heartbeats"]) / (b.at - a.at)
        assert vehicles / 0.4 * 0.6 <= rate <= vehicles / 0.4 * 1.4, rate
        wait_until(lambda: observer.count("/heartbeat") >= r["heartbeats"], 5.0, "every heartbeat at the observer")
        assert observer.count("/heartbeat") == r["heartbeats"]  # QoS 0 over loopback: none lost
    finally:
        observer.close()
    assert r["status"] == "signal"
    assert r["deliveries"] == r["unique"] == r["pubacks"] == 2 * vehicles and r["duplicates"] == 0
    assert r["protocol_errors"] == 0 and r["wrong_topic"] == 0
    _consistent(r)


def test_server_bench_quick_with_mosquitto(binary: str, tmp_path: Any) -> None:
    """The side-by-side benchmark's plumbing with Mosquitto alone (the cluster's side starts Ray: the
    benchmark suite covers it): every phase measured by cfleet, JSON and PNG written."""
    sizes = replace(server_bench.QUICK, vehicles=200, hb_vehicles=200, hb_rate=200.0, hb_window_s=1.0,
                    storm_vehicles=300, idle_s=0.5)
    result = server_bench.run(True, out_dir=tmp_path, systems=["mosquitto"], sizes=sizes)
    assert result["errors"] == {}
    # one system at other sizes: not the whole benchmark, so it must not take the whole run's file name
    assert result["json_path"] == str(tmp_path / "server_bench_quick_partial.json")
    assert not (tmp_path / "server_bench_quick.json").exists()
    data = json.loads((tmp_path / "server_bench_quick_partial.json").read_text())
    assert (tmp_path / "server_bench_quick_partial.png").stat().st_size > 0
    f = data["systems"]["mosquitto"]
    for key in ("deliveries_per_s", "server_cpu_us_per_delivery", "connects_per_s", "server_cpu_us_per_connect",
                "heartbeats_per_s", "server_cpu_us_per_heartbeat", "hb_storm_deliveries_per_s",
                "fleet_cpu_us_per_delivery", "fleet_cpu_us_per_connect"):
        assert isinstance(f[key], (int, float)) and f[key] > 0, key
    assert f["deliveries_complete"] is True and f["fleet_duplicates"] == 0
    assert f["storm_vehicles"] == 300 and f["storm_connect_errors"] == 0
    ph = data["phases"]["mosquitto"]
    assert ph["fanout"]["deliveries"] == 200 * sizes.requests
    assert ph["heartbeat_storm"]["deliveries"] == 200 * sizes.hb_requests
    assert ph["connection_storm"]["connects"] == 300
    assert data["fleet"]["name"] == "cfleet" and data["fleet"]["cpu_us_per_delivery"]["mosquitto"] > 0
    assert len(data["load_average"]["start"]) == 3 and len(data["load_average"]["end"]) == 3
    assert all(len(ph[k]["load_before"]) == 3 for k in ("fanout", "heartbeat_storm", "connection_storm"))


def test_bad_arguments_and_non_loopback_are_refused(binary: str) -> None:
    out = subprocess.run([binary, "fleet", "--host", "10.1.2.3"], capture_output=True, text=True, timeout=10)
    assert out.returncode == 2 and "loopback" in out.stderr
    out = subprocess.run([binary, "fleet", "--vehicles", "x"], capture_output=True, text=True, timeout=10)
    assert out.returncode == 2 and "--vehicles" in out.stderr
    out = subprocess.run([binary, "publish", "--requests", "0"], capture_output=True, text=True, timeout=10)
    assert out.returncode == 2
    out = subprocess.run([binary, "--help"], capture_output=True, text=True, timeout=10)
    assert out.returncode == 0 and "fleet" in out.stdout
