"""Fixtures for broker integration tests: a real TCP listener on 127.0.0.1, real clients.

- ``start_broker(mqtt={...}, users={...}, acl=[...], hooks=...)``: starts an :class:`MQTTServer` on
  127.0.0.1 with port 0 in a background thread running its own (uvloop) event loop, returns a
  :class:`RunningBroker`; every broker started is stopped at the end of the test. The sweep runs every
  0.1 s so timeout tests take fractions of a second. ``broker`` is the default one.
- ``RawClient``: a blocking socket client speaking through the project codec, for what third-party
  clients cannot do (withhold acks, send malformed bytes, inspect DUP flags).
- ``paho_client(...)``: a connected paho-mqtt 2.x client (MQTT 3.1.1, VERSION2 callbacks) recording
  messages in a queue; disconnected and its network thread stopped at the end of the test.
- ``cli_broker(*args)``: runs ``fanout broker --port 0 ...`` as a subprocess, parses its ready line,
  always terminates it.
"""
from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import os
import queue
import socket
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path
from typing import Any, Callable, Iterator

import paho.mqtt.client as mqtt
import pytest

from fanout.config import AclRule, UserConfig, load_config, mqtt_settings
from fanout.mqtt.aio import MQTTServer, new_event_loop
from fanout.mqtt.auth import hash_password
from fanout.mqtt.codec import PacketReader, encode
from fanout.mqtt.packets import Connack, Connect, Packet, Publish

REPO = Path(__file__).resolve().parents[2]
HOST = "127.0.0.1"
TIMEOUT = 5.0  # upper bound for any single wait in these tests


def make_config(mqtt: dict | None = None, users: dict[str, tuple[str, str]] | None = None, acl: list[dict] | None = None):
    """Config from defaults plus ``[mqtt]`` values (TOML form), users ``{name: (password, role)}``, ACL rules."""
    cfg = load_config(None, env={})
    if mqtt:
        cfg = cfg.replace("mqtt", **mqtt)
    if users or acl:
        cfg = dataclasses.replace(
            cfg,
            users={n: UserConfig(n, hash_password(pw, iterations=1000), role) for n, (pw, role) in (users or {}).items()},
            acl=tuple(AclRule(**r) for r in (acl or [])),
        )
    return cfg


class RunningBroker:
    """An MQTTServer on its own event loop in a daemon thread."""

    def __init__(self, config: Any, hooks: Any = None, sweep_interval_s: float = 0.1) -> None:
        self.server = MQTTServer(mqtt_settings(config), host=HOST, port=0, hooks=hooks, sweep_interval_s=sweep_interval_s)
        self.loop = new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, name="mqtt-broker", daemon=True)
        self._thread.start()
        self.call_async(self.server.start())
        self.host = HOST
        self.port = self.server.port

    @property
    def broker(self):
        return self.server.broker

    def call_async(self, coro: Any, timeout: float = TIMEOUT) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)

    def call(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        """Run ``fn`` in the broker's loop thread and return its result (thread-safe inspection)."""

        async def wrapper() -> Any:
            return fn(*args, **kwargs)

        return self.call_async(wrapper())

    def stop(self, drain: bool = True) -> None:
        if self.loop.is_closed():
            return
        try:
            self.call_async(self.server.stop(drain=drain), timeout=10)
        finally:
            self.loop.call_soon_threadsafe(self.loop.stop)
            self._thread.join(5)
            if not self._thread.is_alive():
                self.loop.close()


@pytest.fixture
def start_broker() -> Iterator[Callable[..., RunningBroker]]:
    started: list[RunningBroker] = []

    def start(mqtt: dict | None = None, users: dict | None = None, acl: list[dict] | None = None, hooks: Any = None) -> RunningBroker:
        rb = RunningBroker(make_config(mqtt, users, acl), hooks=hooks)
        started.append(rb)
        return rb

    try:
        yield start
    finally:
        for rb in started:
            rb.stop()


@pytest.fixture
def broker(start_broker) -> RunningBroker:
    return start_broker()


def wait_for(pred: Callable[[], Any], timeout: float = TIMEOUT, what: str = "condition") -> Any:
    deadline = time.monotonic() + timeout
    while True:
        value = pred()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.01)


class RawClient:
    """Blocking TCP client that speaks MQTT through the project codec."""

    def __init__(self, port: int, host: str = HOST) -> None:
        self.sock = socket.create_connection((host, port), timeout=TIMEOUT)
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.reader = PacketReader()
        self.pending: list[Packet] = []

    def send(self, *packets: Packet) -> None:
        self.sock.sendall(b"".join(encode(p) for p in packets))

    def send_raw(self, data: bytes) -> None:
        self.sock.sendall(data)

    def recv(self, timeout: float = TIMEOUT) -> Packet:
        """Next packet; AssertionError on timeout or close."""
        deadline = time.monotonic() + timeout
        while not self.pending:
            left = deadline - time.monotonic()
            if left <= 0:
                raise AssertionError("no packet received in time")
            self.sock.settimeout(left)
            try:
                data = self.sock.recv(65536)
            except socket.timeout:
                raise AssertionError("no packet received in time") from None
            if not data:
                raise AssertionError("connection closed by the broker")
            self.pending.extend(self.reader.feed(data))
        return self.pending.pop(0)

    def recv_n(self, n: int, timeout: float = TIMEOUT) -> list[Packet]:
        return [self.recv(timeout) for _ in range(n)]

    def expect_nothing(self, wait: float = 0.3) -> None:
        try:
            p = self.recv(wait)
        except AssertionError as exc:
            if "closed" in str(exc):
                raise
            return
        raise AssertionError(f"unexpected packet {p!r}")

    def connect(self, client_id: str, clean: bool = True, keepalive: int = 60, **kw: Any) -> Connack:
        self.send(Connect(client_id, clean, keepalive, **kw))
        ack = self.recv()
        assert isinstance(ack, Connack), ack
        return ack

    def is_closed(self, timeout: float = TIMEOUT) -> bool:
        """Wait until the broker closes the connection (True) or ``timeout`` passes (False)."""
        deadline = time.monotonic() + timeout
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                return False
            self.sock.settimeout(left)
            try:
                data = self.sock.recv(65536)
            except socket.timeout:
                return False
            except ConnectionResetError:
                return True
            if not data:
                self.sock.close()  # as a real client does on EOF (a stopping broker waits for it)
                return True
            self.pending.extend(self.reader.feed(data))

    def kill(self) -> None:
        """Drop the TCP connection abruptly (RST), as a crashed client would."""
        with contextlib.suppress(OSError):
            self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00")
        self.close()

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self.sock.close()


@pytest.fixture
def raw_client() -> Iterator[Callable[[RunningBroker], RawClient]]:
    clients: list[RawClient] = []

    def make(rb: RunningBroker) -> RawClient:
        c = RawClient(rb.port)
        clients.append(c)
        return c

    try:
        yield make
    finally:
        for c in clients:
            c.close()


# paho 2.x reports 3.1.1 CONNACK codes as MQTT 5 reason codes; map them back by name.
CONNACK_CODES = {"Success": 0, "Unsupported protocol version": 1, "Client identifier not valid": 2,
                 "Server unavailable": 3, "Bad user name or password": 4, "Not authorized": 5}


class PahoClient:
    """A paho-mqtt 2.x client (MQTT 3.1.1) with a message queue and synchronous helpers.

    Automatic reconnects are slowed to 10+ s so a connection the broker closes stays closed for the
    duration of a test.
    """

    def __init__(self, client_id: str, clean_session: bool = True, protocol: int = mqtt.MQTTv311) -> None:
        self.client = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2, client_id=client_id,
                                  protocol=protocol, clean_session=clean_session)
        self.client.reconnect_delay_set(10, 20)
        self.messages: queue.Queue = queue.Queue()
        self.connack: queue.Queue = queue.Queue()
        self.subacks: queue.Queue = queue.Queue()
        self.unsubacks: queue.Queue = queue.Queue()
        self.disconnects: queue.Queue = queue.Queue()
        c = self.client
        c.on_connect = lambda cl, ud, flags, rc, props: self.connack.put((flags.session_present, CONNACK_CODES[rc.getName()]))
        c.on_message = lambda cl, ud, msg: self.messages.put(msg)
        c.on_subscribe = lambda cl, ud, mid, rcs, props: self.subacks.put([r.value for r in rcs])
        c.on_unsubscribe = lambda cl, ud, mid, rcs, props: self.unsubacks.put(mid)
        c.on_disconnect = lambda cl, ud, flags, rc, props: self.disconnects.put(rc)

    def connect(self, port: int, keepalive: int = 60, expect_rc: int = 0) -> tuple[bool, int]:
        self.client.connect(HOST, port, keepalive)
        self.client.loop_start()
        session_present, rc = self.connack.get(timeout=TIMEOUT)
        assert rc == expect_rc, f"CONNACK return code {rc}, expected {expect_rc}"
        return session_present, rc

    def subscribe(self, *filters: tuple[str, int]) -> list[int]:
        self.client.subscribe(list(filters))
        return self.subacks.get(timeout=TIMEOUT)

    def publish(self, topic: str, payload: bytes, qos: int = 0, retain: bool = False) -> None:
        info = self.client.publish(topic, payload, qos, retain)
        info.wait_for_publish(TIMEOUT)

    def get(self, timeout: float = TIMEOUT) -> mqtt.MQTTMessage:
        return self.messages.get(timeout=timeout)

    def expect_nothing(self, wait: float = 0.3) -> None:
        with contextlib.suppress(queue.Empty):
            msg = self.messages.get(timeout=wait)
            raise AssertionError(f"unexpected message on {msg.topic}")

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self.client.disconnect()
        with contextlib.suppress(Exception):
            self.client.loop_stop()


@pytest.fixture
def paho_client() -> Iterator[Callable[..., PahoClient]]:
    clients: list[PahoClient] = []

    def make(client_id: str | None = None, clean_session: bool = True, protocol: int = mqtt.MQTTv311) -> PahoClient:
        c = PahoClient(client_id if client_id is not None else f"paho-{uuid.uuid4().hex[:8]}", clean_session, protocol)
        clients.append(c)
        return c

    try:
        yield make
    finally:
        for c in clients:
            c.close()


@contextlib.contextmanager
def cli_broker(*args: str, timeout: float = 20.0, env: dict | None = None) -> Iterator[tuple[subprocess.Popen, str]]:
    """Run ``fanout broker --host 127.0.0.1 --port 0 *args``; yield (process, url) once ready; always terminate."""
    cmd = [sys.executable, "-m", "cluster.cli",
           "broker", "--host", HOST, "--port", "0", *args]
    # stderr (the logs) goes to a file, not a pipe: nobody drains a pipe after the ready line, and a
    # broker logging more than a pipe buffer (~64 KB) would block on write and hang the test.
    err_file = tempfile.TemporaryFile(mode="w+")
    proc = subprocess.Popen(cmd, cwd=REPO, stdout=subprocess.PIPE, stderr=err_file, text=True,
                            env={**os.environ, "FANOUT_LOG_JSON": "1", **(env or {})})
    try:
        line: list[str] = []
        reader = threading.Thread(target=lambda: line.append(proc.stdout.readline()), daemon=True)  # type: ignore[union-attr]
        reader.start()
        reader.join(timeout)
        if not line or not line[0].startswith("fanout broker ready mqtt://"):
            proc.kill()
            proc.wait(5)
            err_file.seek(0)
            err = err_file.read()
            raise AssertionError(f"no ready line from fanout broker: {line!r}\nstderr: {err[-2000:]}")
        yield proc, line[0].strip().split(" ")[-1]
    finally:
        if proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(5)
        if proc.stdout is not None:
            proc.stdout.close()
        err_file.close()


def url_port(url: str) -> int:
    """The port of ``scheme://host:port[/path]``."""
    return int(url.split("://", 1)[1].split("/", 1)[0].rsplit(":", 1)[1])


__all__ = ["RunningBroker", "RawClient", "PahoClient", "make_config", "wait_for", "cli_broker", "url_port", "Publish", "TIMEOUT"]
