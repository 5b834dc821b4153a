"""Harness for the hostile-client tests: a real ``fanout broker`` process, raw clients, its RSS.

- ``fanout_broker(mqtt={...}, users={...})`` starts ``fanout broker --port 0`` (loopback) with a config file
  holding those ``[mqtt]`` keys (small budgets) and users; the process is stopped at the end of the test.
- :class:`Peer` is a blocking socket client speaking MQTT through the project codec; attackers use it or
  plain sockets for what no client library does (never read, stop in the middle of a packet).
- :class:`GoodTraffic` is a well-behaved QoS 1 publisher and subscriber on the same broker, publishing one
  message every 20 ms while an attack runs; :meth:`GoodTraffic.check` asserts every message arrived.
- :class:`RssPeak` samples the broker process's RSS (psutil) every 20 ms and keeps the peak over a
  baseline taken when it starts.
- :func:`watched` puts the two around an attack.
"""
from __future__ import annotations

import contextlib
import socket
import threading
import time
from pathlib import Path
from typing import Any, Callable, Iterator

import psutil
import pytest

from fanout.mqtt.auth import hash_password
from fanout.mqtt.codec import PacketReader, encode
from fanout.mqtt.packets import Connack, Connect, Packet, Puback, Publish, Suback, Subscribe
from tests.integration.conftest import HOST, PahoClient, cli_broker, paho_client, url_port  # noqa: F401  (fixture re-export)
from tests.security.pki import pki  # noqa: F401  (fixture re-export)

MiB = 1 << 20
TIMEOUT = 10.0
# What RSS may grow by besides the configured budget under test: interpreter and allocator (glibc keeps
# some freed memory) and the packets being processed (a 1 MB PUBLISH is its read buffer, one copy and its
# payload). The code before these bounds grew by 30 to 90 MiB in the same tests.
SLACK_MIB = 10


class BrokerProcess:
    """A running ``fanout broker``: its port and its RSS."""

    def __init__(self, pid: int, port: int) -> None:
        self.port = port
        self.ps = psutil.Process(pid)

    def rss(self) -> int:
        return int(self.ps.memory_info().rss)


def _toml_value(v: Any) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, int):
        return str(v)
    return f'"{v}"'


@pytest.fixture
def fanout_broker(tmp_path: Path) -> Iterator[Callable[..., BrokerProcess]]:
    stack = contextlib.ExitStack()

    def start(mqtt: dict[str, Any] | None = None, users: dict[str, tuple[str, str, int]] | None = None) -> BrokerProcess:
        """``users``: name -> (password, role, PBKDF2 iterations)."""
        lines = ["[mqtt]"] + [f"{k} = {_toml_value(v)}" for k, v in (mqtt or {}).items()]
        for name, (password, role, iterations) in (users or {}).items():
            lines += [f"[users.{name}]", f'password_hash = "{hash_password(password, iterations=iterations)}"',
                      f'role = "{role}"']
        path = tmp_path / f"fanout-{len(stack._exit_callbacks)}.toml"
        path.write_text("\n".join(lines) + "\n")
        proc, url = stack.enter_context(cli_broker("--config", str(path)))
        return BrokerProcess(proc.pid, url_port(url))

    with stack:
        yield start


class Peer:
    """A blocking MQTT client over one socket (the project codec)."""

    def __init__(self, port: int, rcvbuf: int | None = None) -> None:
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        if rcvbuf is not None:  # before connect: the window the kernel advertises follows it
            self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
        self.sock.settimeout(TIMEOUT)
        self.sock.connect((HOST, port))
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.reader = PacketReader()
        self.pending: list[Packet] = []

    def send(self, *packets: Packet) -> None:
        self.sock.sendall(b"".join(encode(p) for p in packets))

    def recv(self, timeout: float = TIMEOUT) -> Packet:
        """The next packet; ``socket.timeout`` when none came, ``ConnectionError`` when the broker closed."""
        deadline = time.monotonic() + timeout
        while not self.pending:
            left = deadline - time.monotonic()
            if left <= 0:
                raise socket.timeout("no packet")
            self.sock.settimeout(left)
            data = self.sock.recv(1 << 16)
            if not data:
                raise ConnectionError("closed by the broker")
            self.pending.extend(self.reader.feed(data))
        return self.pending.pop(0)

    def connect(self, client_id: str, clean: bool = True, **kw: Any) -> Connack:
        self.send(Connect(client_id, clean, 60, **kw))
        ack = self.recv()
        assert isinstance(ack, Connack), ack
        return ack

    def subscribe(self, *filters: tuple[str, int], packet_id: int = 1) -> tuple[int, ...]:
        self.send(Subscribe(packet_id, tuple(filters)))
        ack = self.recv()
        assert isinstance(ack, Suback), ack
        return ack.return_codes

    def publish(self, topic: str, payload: bytes, packet_id: int, retain: bool = False) -> None:
        """QoS 1, waiting for the PUBACK."""
        self.send(Publish(topic, payload, 1, retain, False, packet_id))
        while True:
            p = self.recv()
            if p == Puback(packet_id):
                return

    def take_publishes(self, quiet_s: float = 1.0) -> list[Publish]:
        """Every PUBLISH that arrives until none came for ``quiet_s`` (QoS 1 ones acknowledged)."""
        got = []
        while True:
            try:
                p = self.recv(timeout=quiet_s)
            except socket.timeout:
                return got
            if isinstance(p, Publish):
                got.append(p)
                if p.qos == 1:
                    self.send(Puback(p.packet_id))

    def closed_by_broker(self, timeout: float = TIMEOUT) -> bool:
        """Read (and discard) until the broker closes the connection (True) or ``timeout`` passes (False)."""
        deadline = time.monotonic() + timeout
        while (left := deadline - time.monotonic()) > 0:
            self.sock.settimeout(left)
            try:
                if not self.sock.recv(1 << 20):
                    return True
            except socket.timeout:
                return False
            except OSError:  # reset
                return True
        return False

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self.sock.close()


def sys_value(port: int, name: str) -> int:
    """The retained ``$SYS/broker/<name>`` value, read by a new client over the plain listener on ``port``."""
    peer = Peer(port)
    try:
        assert peer.connect(f"sys-{time.monotonic_ns()}").return_code == 0
        peer.subscribe((f"$SYS/broker/{name}", 0))
        p = peer.recv(timeout=5)
        assert isinstance(p, Publish), p
        return int(p.payload)
    finally:
        peer.close()


class GoodTraffic:
    """A QoS 1 subscriber and publisher that behave; run them while an attack runs, then :meth:`check`."""

    def __init__(self, port: int, topic: str = "good/t", interval_s: float = 0.02) -> None:
        self.topic = topic
        self.interval_s = interval_s
        self.sub = Peer(port)
        assert self.sub.connect("good-sub").return_code == 0
        assert self.sub.subscribe((topic, 1)) == (1,)
        self.pub = Peer(port)
        assert self.pub.connect("good-pub").return_code == 0
        self.sent: list[bytes] = []
        self.got: set[bytes] = set()
        self.errors: list[BaseException] = []
        self._stop_pub = threading.Event()
        self._stop_sub = threading.Event()
        self._threads = [threading.Thread(target=self._guard(self._publish), daemon=True),
                         threading.Thread(target=self._guard(self._receive), daemon=True)]

    def _guard(self, fn: Callable[[], None]) -> Callable[[], None]:
        def run() -> None:
            try:
                fn()
            except BaseException as exc:  # reported by check()
                self.errors.append(exc)
        return run

    def start(self) -> "GoodTraffic":
        for t in self._threads:
            t.start()
        return self

    def _publish(self) -> None:
        n = 0
        while not self._stop_pub.is_set():
            payload = b"good-%d" % n
            self.pub.publish(self.topic, payload, n % 0xFFFF + 1)
            self.sent.append(payload)
            n += 1
            time.sleep(self.interval_s)

    def _receive(self) -> None:
        while not self._stop_sub.is_set():
            try:
                p = self.sub.recv(0.2)
            except socket.timeout:
                continue
            if isinstance(p, Publish):
                self.got.add(p.payload)
                if p.qos == 1:
                    self.sub.send(Puback(p.packet_id))

    def check(self, min_messages: int = 10, timeout: float = 20.0) -> None:
        """Stop publishing; assert every QoS 1 message published meanwhile reached the subscriber."""
        self._stop_pub.set()
        self._threads[0].join(TIMEOUT)
        deadline = time.monotonic() + timeout
        while not set(self.sent) <= self.got and time.monotonic() < deadline and not self.errors:
            time.sleep(0.05)
        self._stop_sub.set()
        self._threads[1].join(TIMEOUT)
        self.sub.close()
        self.pub.close()
        assert not self.errors, self.errors
        missing = [m for m in self.sent if m not in self.got]
        assert not missing, f"{len(missing)} of {len(self.sent)} QoS 1 messages lost, first {missing[:3]}"
        assert len(self.sent) >= min_messages, f"only {len(self.sent)} messages published during the attack"


class RssPeak:
    """Peak RSS of the broker over a baseline taken on entry (sampled every 20 ms)."""

    def __init__(self, broker: BrokerProcess) -> None:
        self.broker = broker
        self.base = 0
        self.peak = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)

    def __enter__(self) -> "RssPeak":
        self.base = self.peak = self.broker.rss()
        self._thread.start()
        return self

    def _sample(self) -> None:
        while not self._stop.wait(0.02):
            with contextlib.suppress(psutil.Error):
                self.peak = max(self.peak, self.broker.rss())

    def __exit__(self, *exc: Any) -> None:
        self._stop.set()
        self._thread.join(5)
        with contextlib.suppress(psutil.Error):
            self.peak = max(self.peak, self.broker.rss())

    @property
    def growth_mib(self) -> float:
        return (self.peak - self.base) / MiB

    def now_growth_mib(self) -> float:
        return (self.broker.rss() - self.base) / MiB


@contextlib.contextmanager
def watched(broker: BrokerProcess) -> Iterator[RssPeak]:
    """Run an attack with well-behaved traffic on the same broker and its RSS sampled: yields the
    :class:`RssPeak` (baseline taken after the good clients connected); afterwards asserts that the good
    subscriber got every QoS 1 message published meanwhile."""
    good = GoodTraffic(broker.port)
    with RssPeak(broker) as rss:
        good.start()
        time.sleep(0.5)
        yield rss
    good.check()


def send_in_background(sock: socket.socket, data: bytes) -> threading.Thread:
    """``sendall`` from a daemon thread (it blocks or fails when the broker stops reading or closes)."""
    def run() -> None:
        with contextlib.suppress(OSError):
            sock.sendall(data)
    t = threading.Thread(target=run, daemon=True)
    t.start()
    return t


__all__ = ["BrokerProcess", "Peer", "GoodTraffic", "RssPeak", "watched", "send_in_background", "MiB", "SLACK_MIB"]
