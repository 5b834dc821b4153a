"""Helpers for the platform-client integration tests (imported by ``test_client_*.py``).

- :class:`BrokerProcess`: the project's broker as a subprocess (``fanout broker --port 0 --config``),
  restartable on the same port. ``FANOUT_CLIENT_TEST_BROKER=mosquitto`` swaps in Mosquitto for local
  development only; the default, and what CI runs, is the project's broker.
- :func:`write_broker_config`: a TOML with a ``platform`` user (publishes ``$SDV-FANOUT/#``) and an
  ``admin`` user (may subscribe ``$SDV-FANOUT/trigger`` to observe what the client sent).
- :class:`Watcher`: a paho subscriber (own network thread) recording triggers and blobs in arrival order.
- :class:`MqttProxy`: an asyncio TCP proxy between client and broker that can refuse connections
  (hold a client off while the test reconnects its watcher), cut connections, and drop PUBACKs sent
  to the client, which emulates the cluster contract for invalid input (error on the errors topic,
  no PUBACK, then close) until the fanout layer exists.
- :func:`publish_cluster_error`: a tiny real MQTT publisher that publishes a JSON error on
  ``$SDV-FANOUT/errors/<client_id>``, as the cluster will.
"""
from __future__ import annotations

import asyncio
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any, Callable

import paho.mqtt.client as mqtt
from paho.mqtt.enums import CallbackAPIVersion

PLATFORM = ("platform", "platform-secret")
ADMIN = ("admin", "admin-secret")
FANOUT_BIN = Path(sys.executable).parent / "fanout"
BROKER_KIND = os.environ.get("FANOUT_CLIENT_TEST_BROKER", "fanout")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def write_broker_config(path: Path, *, max_packet_size: str | None = None) -> Path:
    """Write a broker TOML with platform and admin users (cheap PBKDF2 for fast tests)."""
    if BROKER_KIND == "mosquitto":
        lines = ["allow_anonymous true", "persistence false"]
        if max_packet_size:
            from fanout.units import parse_size_bytes

            lines.append(f"max_packet_size {parse_size_bytes(max_packet_size)}")
        path.write_text("\n".join(lines) + "\n")
        return path
    from fanout.mqtt.auth import hash_password

    mqtt_section = "[mqtt]\nsys_interval = \"0s\"\n"
    if max_packet_size:
        # The test clients log in as platform, which has its own (larger) limit: pin both.
        mqtt_section += f'max_packet_size = "{max_packet_size}"\nmax_platform_packet_size = "{max_packet_size}"\n'
    users = "".join(
        f'[users.{name}]\npassword_hash = "{hash_password(pw, iterations=1000)}"\nrole = "{name}"\n\n'
        for name, pw in (PLATFORM, ADMIN)
    )
    path.write_text(mqtt_section + "\n" + users)
    return path


class BrokerProcess:
    """A broker subprocess that can be stopped and restarted on the same port.

    Args:
        config: TOML (or mosquitto.conf in development mode).
        log_path: file receiving the broker's stderr.
    """

    def __init__(self, config: Path, log_path: Path) -> None:
        self.config = config
        self.log_path = log_path
        self.port = 0
        self.proc: subprocess.Popen[str] | None = None

    def start(self, timeout: float = 30.0) -> int:
        """Start (on the previous port when restarting) and wait for the ready line.

        Returns:
            The listening port.
        """
        log = open(self.log_path, "a")
        if BROKER_KIND == "mosquitto":
            self.port = self.port or free_port()
            conf = self.config.with_suffix(".run.conf")
            conf.write_text(f"listener {self.port} 127.0.0.1\n" + self.config.read_text())
            self.proc = subprocess.Popen(["mosquitto", "-c", str(conf)], stdout=subprocess.DEVNULL, stderr=log, text=True)
            _wait_port(self.port, timeout)
            return self.port
        cmd = [str(FANOUT_BIN), "broker", "--port", str(self.port), "--config", str(self.config)]
        self.proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=log, text=True)
        line = _readline(self.proc, timeout)
        prefix = "fanout broker ready mqtt://"
        if not line.startswith(prefix):
            self.stop()
            raise RuntimeError(f"broker did not start: {line!r}; see {self.log_path}")
        self.port = int(line.strip().rsplit(":", 1)[1])
        return self.port

    def stop(self) -> None:
        """SIGTERM and wait (kill after 10 s)."""
        if self.proc is None:
            return
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)
        if self.proc.stdout:
            self.proc.stdout.close()
        self.proc = None


def _readline(proc: subprocess.Popen[str], timeout: float) -> str:
    box: list[str] = []
    t = threading.Thread(target=lambda: box.append(proc.stdout.readline() if proc.stdout else ""), daemon=True)
    t.start()
    t.join(timeout)
    return box[0] if box else ""


def _wait_port(port: int, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            socket.create_connection(("127.0.0.1", port), 0.2).close()
            return
        except OSError:
            time.sleep(0.05)
    raise RuntimeError(f"nothing listens on {port}")


class Watcher:
    """Records ``$SDV-FANOUT/trigger`` and ``$SDV-FANOUT/data/#`` as seen by an admin subscriber."""

    def __init__(self, port: int) -> None:
        self.port = port
        self.messages: list[tuple[str, bytes]] = []
        self._lock = threading.Lock()
        self._client: mqtt.Client | None = None

    def connect(self, timeout: float = 10.0) -> None:
        """Connect (again, replacing the previous connection) and wait for the SUBACK."""
        self.disconnect()
        subscribed = threading.Event()
        c = mqtt.Client(CallbackAPIVersion.VERSION2, client_id=f"watcher-{os.getpid()}-{time.monotonic_ns()}", protocol=mqtt.MQTTv311)
        if BROKER_KIND != "mosquitto":
            c.username_pw_set(*ADMIN)
        c.on_message = self._on_message
        c.on_connect = lambda cl, u, f, rc, p: cl.subscribe([("$SDV-FANOUT/trigger", 1), ("$SDV-FANOUT/data/#", 1)])
        c.on_subscribe = lambda cl, u, mid, codes, p: subscribed.set()
        c.connect("127.0.0.1", self.port)
        c.loop_start()
        if not subscribed.wait(timeout):
            c.loop_stop()
            raise RuntimeError("watcher could not subscribe")
        self._client = c

    def _on_message(self, client: mqtt.Client, userdata: object, msg: mqtt.MQTTMessage) -> None:
        with self._lock:
            self.messages.append((msg.topic, msg.payload))

    def triggers(self) -> list[dict[str, Any]]:
        with self._lock:
            return [json.loads(p) for t, p in self.messages if t == "$SDV-FANOUT/trigger"]

    def request_ids(self) -> list[str]:
        return [t["request_id"] for t in self.triggers()]

    def wait_for(self, pred: Callable[["Watcher"], bool], timeout: float = 20.0) -> bool:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if pred(self):
                return True
            time.sleep(0.02)
        return pred(self)

    async def await_for(self, pred: Callable[["Watcher"], bool], timeout: float = 20.0) -> bool:
        """:meth:`wait_for` without blocking the event loop."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if pred(self):
                return True
            await asyncio.sleep(0.02)
        return pred(self)

    def disconnect(self) -> None:
        if self._client is not None:
            self._client.disconnect()
            self._client.loop_stop()
            self._client = None


def publish_cluster_error(port: int, client_id: str, detail: dict[str, Any]) -> None:
    """Publish ``detail`` as JSON on ``$SDV-FANOUT/errors/<client_id>`` (QoS 1) as the platform."""
    c = mqtt.Client(CallbackAPIVersion.VERSION2, client_id=f"cluster-emulator-{time.monotonic_ns()}", protocol=mqtt.MQTTv311)
    if BROKER_KIND != "mosquitto":
        c.username_pw_set(*PLATFORM)
    c.connect("127.0.0.1", port)
    c.loop_start()
    try:
        c.publish(f"$SDV-FANOUT/errors/{client_id}", json.dumps(detail), qos=1).wait_for_publish(10)
    finally:
        c.disconnect()
        c.loop_stop()


class MqttProxy:
    """TCP proxy client <-> broker with a gate, a hold, a cut switch and PUBACK dropping (client side)."""

    def __init__(self, upstream_port: int) -> None:
        self.upstream_port = upstream_port
        self.gate_open = True
        self._flowing = asyncio.Event()
        self._flowing.set()
        self.drop_pubacks = False
        self.dropped = 0
        self._server: asyncio.base_events.Server | None = None
        self._pairs: set[tuple[asyncio.StreamWriter, asyncio.StreamWriter]] = set()
        self.port = 0

    async def start(self) -> int:
        self._server = await asyncio.start_server(self._accept, "127.0.0.1", 0)
        self.port = self._server.sockets[0].getsockname()[1]
        return self.port

    async def _accept(self, cr: asyncio.StreamReader, cw: asyncio.StreamWriter) -> None:
        if not self.gate_open:
            cw.close()
            return
        try:
            ur, uw = await asyncio.open_connection("127.0.0.1", self.upstream_port)
        except OSError:
            cw.close()
            return
        pair = (cw, uw)
        self._pairs.add(pair)
        try:
            await asyncio.gather(self._pipe(cr, uw), self._pipe_filtered(ur, cw), return_exceptions=True)
        finally:
            self._pairs.discard(pair)
            for w in pair:
                w.close()

    @property
    def hold(self) -> bool:
        """True: bytes from the client are held back (the broker side keeps flowing)."""
        return not self._flowing.is_set()

    @hold.setter
    def hold(self, value: bool) -> None:
        if value:
            self._flowing.clear()
        else:
            self._flowing.set()

    async def _pipe(self, r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        """Client -> broker."""
        try:
            while data := await r.read(65536):
                await self._flowing.wait()
                w.write(data)
                await w.drain()
        finally:
            w.close()

    async def _pipe_filtered(self, r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        """Broker -> client, packet by packet, so PUBACKs can be dropped."""
        try:
            while True:
                first = await r.readexactly(1)
                header, length, mult = bytearray(first), 0, 1
                while True:
                    b = (await r.readexactly(1))[0]
                    header.append(b)
                    length += (b & 0x7F) * mult
                    mult *= 128
                    if not b & 0x80:
                        break
                body = await r.readexactly(length)
                if self.drop_pubacks and first[0] >> 4 == 4:
                    self.dropped += 1
                    continue
                w.write(bytes(header) + body)
                await w.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            w.close()

    def cut(self) -> None:
        """Close every proxied connection now."""
        for pair in list(self._pairs):
            for w in pair:
                w.transport.abort()

    async def close(self) -> None:
        self.cut()
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()


# ------------------------------------------------------------------------------------ pytest fixtures
# (imported by the test modules; tests/integration/conftest.py belongs to the broker tests)

import pytest  # noqa: E402


@pytest.fixture
def start_client_broker(tmp_path: Path):
    """Factory: ``start_client_broker(max_packet_size=None, port=0) -> BrokerProcess``; all stopped after the test.

    Named apart from ``tests/integration/conftest.py``'s in-process ``start_broker``/``broker``: these
    run the broker as a subprocess.
    """
    started: list[BrokerProcess] = []

    def start(max_packet_size: str | None = None, port: int = 0) -> BrokerProcess:
        n = len(started)
        b = BrokerProcess(write_broker_config(tmp_path / f"broker{n}.toml", max_packet_size=max_packet_size), tmp_path / f"broker{n}.log")
        b.port = port
        b.start()
        started.append(b)
        return b

    yield start
    for b in started:
        b.stop()


@pytest.fixture
def client_broker(start_client_broker) -> BrokerProcess:
    return start_client_broker()


@pytest.fixture
def client_watcher(client_broker: BrokerProcess):
    w = Watcher(client_broker.port)
    w.connect()
    yield w
    w.disconnect()


def client_kwargs(port: int, outbox_dir: Path, **overrides: Any) -> dict[str, Any]:
    """FanoutClient arguments for tests: platform login, fast reconnects and backoff."""
    kw: dict[str, Any] = dict(
        host="127.0.0.1", port=port, username=PLATFORM[0], password=PLATFORM[1], outbox_dir=outbox_dir,
        reconnect_min_s=0.05, reconnect_max_s=0.5, connect_timeout_s=5.0, backoff_base_s=0.05, backoff_max_s=0.5,
    )
    kw.update(overrides)
    return kw


def vins(n: int, tag: str = "") -> list[str]:
    return [f"WVW{tag}{i:011d}"[-17:] for i in range(n)]
