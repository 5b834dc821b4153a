"""``make run``: start the embedded fanout cluster, run a short demo, keep serving until Ctrl-C.

The demo, with third-party MQTT clients (paho-mqtt):

1. five mock vehicles connect (client id = VIN), subscribe ``agent/<VIN>/proxy/request/+`` and publish
   ``ecp/<VIN>/online``;
2. a platform client (the dev login ``platform``/``platform``) publishes a data blob on
   ``$SDV-FANOUT/data/<data_id>`` and a trigger on ``$SDV-FANOUT/trigger`` naming the five VINs and a
   sixth one that is offline;
3. every delivery is printed as it arrives (the vehicles PUBACK it, which deletes its row);
4. the sixth vehicle connects late and gets its copy on its ``online`` heartbeat;
5. a summary (deliveries, latency, ``fanout status`` totals), then the cluster keeps running until
   Ctrl-C (or exits at once with ``--exit-after-demo``, for CI).

Usage: ``python -m scripts.demo [--config F] [--port P] [--data-dir D] [--exit-after-demo]``.
"""
from __future__ import annotations

import argparse
import json
import signal
import sys
import threading
import time
import uuid
from typing import Any

import paho.mqtt.client as mqtt

VINS = ["WVWZZZ1JZXW000001", "WVWZZZ1JZXW000002", "WVWZZZ1JZXW000003", "WVWZZZ1JZXW000004", "WVWZZZ1JZXW000005"]
LATE_VIN = "WVWZZZ1JZXW000006"


class MockVehicle:
    """A paho client that prints and acknowledges every fanout delivery."""

    def __init__(self, host: str, port: int, vin: str, deliveries: list, lock: threading.Lock) -> None:
        self.vin = vin
        self._deliveries = deliveries
        self._lock = lock
        self.ready = threading.Event()
        self.client = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2, client_id=vin, protocol=mqtt.MQTTv311)
        self.client.on_connect = lambda c, u, f, rc, p: c.subscribe(f"agent/{vin}/proxy/request/+", qos=1)
        self.client.on_subscribe = lambda *a: self.ready.set()
        self.client.on_message = self._on_message
        self.client.connect(host, port, keepalive=30)
        self.client.loop_start()

    def _on_message(self, client: Any, userdata: Any, msg: mqtt.MQTTMessage) -> None:
        with self._lock:
            self._deliveries.append((time.monotonic(), self.vin, msg.topic))
            print(f"  delivery  {self.vin}  {msg.topic}  ({len(msg.payload)} bytes: {msg.payload[:40]!r})", flush=True)

    def online(self) -> None:
        self.client.publish(f"ecp/{self.vin}/online", b'{"status": "online"}', qos=1).wait_for_publish(10)

    def close(self) -> None:
        self.client.disconnect()
        self.client.loop_stop()


def platform_publish(host: str, port: int, data_id: str, blob: bytes, trigger: dict) -> float:
    """Publish blob and trigger with QoS 1; return the time the trigger was PUBACKed."""
    client = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2, client_id="demo-platform", protocol=mqtt.MQTTv311)
    client.username_pw_set("platform", "platform")
    client.connect(host, port, keepalive=30)
    client.loop_start()
    try:
        client.publish(f"$SDV-FANOUT/data/{data_id}", blob, qos=1).wait_for_publish(30)
        print(f"platform: blob {data_id!r} ({len(blob)} bytes) stored on every shard", flush=True)
        info = client.publish("$SDV-FANOUT/trigger", json.dumps(trigger), qos=1)
        info.wait_for_publish(30)
        if not info.is_published():
            raise RuntimeError("the trigger was not acknowledged within 30 s")
        acked = time.monotonic()
        print(f"platform: trigger {trigger['request_id']!r} for {len(trigger['ids'])} VINs is durable (PUBACK)", flush=True)
        return acked
    finally:
        client.disconnect()
        client.loop_stop()


def wait_for(pred: Any, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if pred():
            return True
        time.sleep(0.05)
    return pred()


def run_demo(cluster: Any) -> bool:
    host, port = cluster.host, cluster.port
    deliveries: list[tuple[float, str, str]] = []
    lock = threading.Lock()
    print(f"\n== {len(VINS)} vehicles connect to {cluster.url} and say they are online", flush=True)
    cars = [MockVehicle(host, port, vin, deliveries, lock) for vin in VINS]
    late: MockVehicle | None = None
    try:
        for car in cars:
            if not car.ready.wait(30):
                print(f"vehicle {car.vin} could not subscribe", file=sys.stderr)
                return False
            car.online()
        request_id = f"demo-{uuid.uuid4().hex[:6]}"
        trigger = {"ids": [*VINS, LATE_VIN], "request_id": request_id, "data_id": "demo-blob-1"}
        print("\n== the platform publishes a blob and a trigger (one VIN is offline)", flush=True)
        sent = time.monotonic()
        acked = platform_publish(host, port, "demo-blob-1", b'{"ota": "v2.1.0", "size": 42}', trigger)
        ok = wait_for(lambda: len(deliveries) >= len(VINS), 30)
        first = min((t for t, _, _ in deliveries), default=None)
        last = max((t for t, _, _ in deliveries), default=None)
        print(f"\n== {LATE_VIN} connects late and publishes ecp/{LATE_VIN}/online", flush=True)
        late = MockVehicle(host, port, LATE_VIN, deliveries, lock)
        late.ready.wait(30)
        late.online()
        ok = wait_for(lambda: len(deliveries) >= len(VINS) + 1, 30) and ok
        wait_for(lambda: cluster.status()["totals"]["pending_rows"] == 0, 10)
        totals = cluster.status()["totals"]
        print("\n== summary", flush=True)
        print(f"  deliveries: {len(deliveries)} of {len(VINS) + 1}")
        print(f"  trigger PUBACK after {1000 * (acked - sent):.1f} ms")
        if first is not None and last is not None:
            print(f"  first delivery {1000 * (first - sent):.1f} ms, last realtime delivery "
                  f"{1000 * (last - sent):.1f} ms after the blob was published")
        print(f"  cluster: {json.dumps(totals)}", flush=True)
        return ok and len(deliveries) == len(VINS) + 1
    finally:
        for car in [*cars, *([late] if late else [])]:
            car.close()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m scripts.demo", description=__doc__.splitlines()[0])
    parser.add_argument("--config", default=None, help="TOML config file")
    parser.add_argument("--host", default=None, help="MQTT listener address (default mqtt.host)")
    parser.add_argument("--port", type=int, default=None, help="MQTT port (default mqtt.port; 0 = any free port)")
    parser.add_argument("--data-dir", default=None, help="shard directory root (default storage.data_dir)")
    parser.add_argument("--exit-after-demo", action="store_true", help="stop the cluster after the demo (CI)")
    args = parser.parse_args(argv)

    from fanout import log
    from fanout.config import ConfigError, load_config

    log.configure(level="warning")
    try:
        cfg = load_config(args.config, overrides={"mqtt": {"host": args.host, "port": args.port},
                                                  "storage": {"data_dir": args.data_dir}})
    except ConfigError as exc:
        print(f"demo: config error: {exc}", file=sys.stderr)
        return 2

    from cluster.runtime import start_fanout

    print("starting the embedded fanout cluster (local Ray; this takes a few seconds) ...", flush=True)
    try:
        cluster = start_fanout(cfg, address="local", log_to_driver=False)
    except RuntimeError as exc:
        print(f"demo: {exc}", file=sys.stderr)
        return 1
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    try:
        print(f"fanout ready {cluster.url}", flush=True)
        if cluster.info.get("http"):
            print(f"fanout console {cluster.info['http']}", flush=True)
        ok = run_demo(cluster)
        print("\ndemo " + ("passed" if ok else "FAILED"), flush=True)
        if args.exit_after_demo:
            return 0 if ok else 1
        print(f"\nthe cluster keeps running at {cluster.url} (try `fanout status --data-dir "
              f"{cfg.storage.data_dir}`); press Ctrl-C to stop", flush=True)
        while not stop.wait(0.5):
            pass
        return 0 if ok else 1
    finally:
        print("stopping ...", flush=True)
        cluster.stop()


if __name__ == "__main__":
    sys.exit(main())
