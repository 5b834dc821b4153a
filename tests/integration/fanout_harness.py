"""Helpers for the fanout end-to-end tests (``test_fanout_*.py``): cluster fixture pieces and MQTT clients.

- :func:`fanout_config` / :func:`running_cluster`: the whole fanout cluster (controller, dispatchers,
  one connection node per Ray node) on the already initialised Ray, MQTT on 127.0.0.1 port 0, a tmp
  data dir; always stopped (actors killed) when the block exits, Ray itself is left running.
- :class:`Vehicle`: a paho-mqtt 2.x client (its own network thread) recording every PUBLISH; with
  ``manual_ack`` the test decides when PUBACK is sent.
- :class:`RawClient`: a blocking socket speaking MQTT through the project's codec, for what paho hides:
  withholding PUBACKs, seeing DUP flags, dying without DISCONNECT, observing a server-side close.
- :func:`wait_until`: bounded polling with a failure message that says what was awaited.
- :func:`init_session_ray`: the test session's local Ray (the ``ray_local`` fixture, and the multi-node tests
  when they give it back).
"""
from __future__ import annotations

import contextlib
import json
import queue
import socket
import threading
import time
import uuid
from pathlib import Path
from typing import Any, Callable, Iterator

import paho.mqtt.client as mqtt

from fanout.config import load_config
from fanout.mqtt.codec import PacketReader, encode
from fanout.mqtt.packets import Connack, Connect, Disconnect, Puback, Publish, Suback, Subscribe

PLATFORM_LOGIN = ("platform", "platform")  # the dev platform login on a loopback listener without users


def init_session_ray() -> None:
    """Start the test session's local Ray: 2 CPUs, 100 MiB object store, the ``fanout_node`` resource, and Ray's
    own observability off as ``fanout up`` starts it (actors.ray_observability)."""
    import ray

    from actors.ray_observability import quiet_system_config

    ray.init(address="local", num_cpus=2, include_dashboard=False, object_store_memory=100 * 1024 * 1024,
             resources={"fanout_node": 1}, log_to_driver=False, configure_logging=False,
             _system_config=quiet_system_config())


def wait_until(pred: Callable[[], Any], timeout: float = 10.0, what: str = "condition", interval: float = 0.02) -> Any:
    """Poll ``pred`` until it returns a truthy value; fail with ``what`` after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        value = pred()
        if value:
            return value
        if time.monotonic() >= deadline:
            raise AssertionError(f"timed out after {timeout:.1f}s waiting for {what} (last value: {value!r})")
        time.sleep(interval)


def connections_by_node(cluster: Any) -> dict[str, int]:
    """Connections each connection node (listener process) of ``cluster`` holds, from ``fanout status``."""
    return {n["node_id"]: n.get("connections", 0) for n in cluster.status()["nodes"]}


def spread_over_listeners(cluster: Any, clients: list[Any], add: Callable[[], None], at_least: int,
                          at_most: int = 32) -> dict[str, int]:
    """Connect clients until ``at_least`` are counted and every listener holds one; return the count per listener.

    With ``mqtt.listeners_per_node > 1`` the kernel hashes each connection's 4-tuple over the listeners sharing
    the port (SO_REUSEPORT), so N clients all land on one of two listeners once in 2**(N-1) runs: a test that
    needs clients on both adds more, up to ``at_most`` (odds 2**-31 at 32), and still asserts that both have one.
    ``add()`` makes one client, appends it to ``clients`` (which the caller closes) and connects it.
    """
    by_node: dict[str, int] = {}
    while len(clients) < at_least or (len(clients) < at_most and not all(n > 0 for n in by_node.values())):
        add()
        if len(clients) >= at_least:
            by_node = wait_until(lambda: (c := connections_by_node(cluster)) and sum(c.values()) >= len(clients)
                                 and c, 15, "clients counted by the listeners")
    return by_node


def fanout_config(tmp_path: Path, **fanout: Any) -> Any:
    """Test config: port 0 on loopback, tmp data dir, 2 dispatchers unless ``fanout`` says otherwise, fast $SYS, no
    HTTP listener."""
    cfg = load_config(None, env={})
    cfg = cfg.replace("mqtt", host="127.0.0.1", port=0, sys_interval="1s")
    cfg = cfg.replace("http", port=0)  # tests run side by side: none may take the default 8080
    cfg = cfg.replace("storage", data_dir=str(tmp_path / "data"))
    cfg = cfg.replace("fanout", **{"dispatchers": 2, **fanout})
    return cfg


@contextlib.contextmanager
def running_cluster(cfg: Any) -> Iterator[Any]:
    """Start the fanout cluster on the current Ray; stop it (kill every actor) on exit."""
    from cluster.runtime import start_fanout

    cluster = start_fanout(cfg, name=f"fanout-controller-test-{uuid.uuid4().hex[:8]}", log_to_driver=False)
    try:
        yield cluster
    finally:
        cluster.stop(shutdown_ray=False)


class Vehicle:
    """A paho MQTT 3.1.1 client recording the PUBLISH packets it receives.

    Args:
        port: broker port on 127.0.0.1.
        client_id: the VIN.
        clean: clean session flag.
        manual_ack: PUBACK only when :meth:`ack` is called.
        subscribe: filter subscribed on connect (``agent/<VIN>/proxy/request/+`` by default; None = none).
        username/password: credentials (anonymous by default).
    """

    def __init__(self, port: int, client_id: str, *, clean: bool = True, manual_ack: bool = False,
                 subscribe: str | None = "default", username: str | None = None, password: str | None = None) -> None:
        self.client_id = client_id
        self.messages: "queue.Queue[mqtt.MQTTMessage]" = queue.Queue()
        self.received: list[tuple[str, bytes]] = []
        self.connected = threading.Event()
        self.subscribed = threading.Event()
        self.disconnected = threading.Event()
        self.session_present: bool | None = None
        self.client = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2, client_id=client_id, protocol=mqtt.MQTTv311,
                                  clean_session=clean, manual_ack=manual_ack)
        if username is not None:
            self.client.username_pw_set(username, password)
        self._filter = f"agent/{client_id}/proxy/request/+" if subscribe == "default" else subscribe
        self.client.on_connect = self._on_connect
        self.client.on_message = self._on_message
        self.client.on_subscribe = lambda *a: self.subscribed.set()
        self.client.on_disconnect = lambda *a: self.disconnected.set()
        self.client.connect("127.0.0.1", port, keepalive=30)
        self.client.loop_start()
        if not self.connected.wait(10):
            raise AssertionError(f"{client_id}: no CONNACK within 10 s")
        if self._filter is not None and not self.subscribed.wait(10):
            raise AssertionError(f"{client_id}: no SUBACK within 10 s")

    def _on_connect(self, client: Any, userdata: Any, flags: Any, reason_code: Any, properties: Any) -> None:
        self.session_present = bool(flags.session_present)
        if self._filter is not None:
            client.subscribe(self._filter, qos=1)
        self.connected.set()

    def _on_message(self, client: Any, userdata: Any, msg: mqtt.MQTTMessage) -> None:
        self.received.append((msg.topic, msg.payload))
        self.messages.put(msg)

    def next_message(self, timeout: float = 10.0) -> mqtt.MQTTMessage:
        try:
            return self.messages.get(timeout=timeout)
        except queue.Empty:
            raise AssertionError(f"{self.client_id}: no message within {timeout:.1f}s "
                                 f"(received so far: {[t for t, _ in self.received]})") from None

    def no_message(self, within: float = 0.5) -> None:
        try:
            msg = self.messages.get(timeout=within)
        except queue.Empty:
            return
        raise AssertionError(f"{self.client_id}: unexpected message on {msg.topic}")

    def ack(self, msg: mqtt.MQTTMessage) -> None:
        self.client.ack(msg.mid, msg.qos)

    def heartbeat(self, kind: str = "heartbeat") -> None:
        self.client.publish(f"ecp/{self.client_id}/{kind}", b"{}", qos=1).wait_for_publish(10)

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self.client.disconnect()
        self.client.loop_stop()


class RawClient:
    """A blocking MQTT 3.1.1 client over one socket, driven packet by packet (no automatic acks)."""

    def __init__(self, port: int, client_id: str, *, clean: bool = True, username: str | None = None,
                 password: str | None = None, keepalive: int = 60) -> None:
        self.client_id = client_id
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=10)
        self.reader = PacketReader()
        self.pending: list[Any] = []
        self.closed = False
        self.send(Connect(client_id, clean, keepalive, username, password.encode() if password else None, None))
        ack = self.expect(Connack)
        assert ack.return_code == 0, f"{client_id}: CONNACK {ack.return_code}"
        self.session_present = ack.session_present

    def send(self, *packets: Any) -> None:
        self.sock.sendall(b"".join(encode(p) for p in packets))

    def recv(self, timeout: float = 10.0) -> Any | None:
        """The next packet, or None when the server closed the connection."""
        deadline = time.monotonic() + timeout
        while not self.pending:
            if self.closed:
                return None
            left = deadline - time.monotonic()
            if left <= 0:
                raise AssertionError(f"{self.client_id}: no packet within {timeout:.1f}s")
            self.sock.settimeout(left)
            try:
                data = self.sock.recv(65536)
            except socket.timeout:
                continue
            except ConnectionResetError:
                data = b""
            if not data:
                self.closed = True
                return None
            self.pending.extend(self.reader.feed(data))
        return self.pending.pop(0)

    def expect(self, kind: type, timeout: float = 10.0) -> Any:
        p = self.recv(timeout)
        assert isinstance(p, kind), f"{self.client_id}: expected {kind.__name__}, got {p!r}"
        return p

    def quiet(self, within: float = 0.5) -> None:
        """Assert that nothing arrives for ``within`` seconds."""
        try:
            p = self.recv(within)
        except AssertionError:
            return
        raise AssertionError(f"{self.client_id}: unexpected packet {p!r}")

    def subscribe(self, topic_filter: str, pid: int = 1) -> None:
        self.send(Subscribe(pid, ((topic_filter, 1),)))
        suback = self.expect(Suback)
        assert suback.return_codes == (1,), suback

    def publish(self, topic: str, payload: bytes, pid: int | None = 1, qos: int = 1) -> None:
        self.send(Publish(topic, payload, qos, False, False, pid if qos else None))

    def kill(self) -> None:
        """Die without DISCONNECT (the socket is reset)."""
        with contextlib.suppress(OSError):
            self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00")
        self.sock.close()
        self.closed = True

    def disconnect(self) -> None:
        with contextlib.suppress(OSError):
            self.send(Disconnect())
        self.sock.close()
        self.closed = True


def platform(port: int, client_id: str = "platform-test") -> RawClient:
    return RawClient(port, client_id, username=PLATFORM_LOGIN[0], password=PLATFORM_LOGIN[1])


def trigger_payload(ids: list[str], request_id: str, data_id: str, **extra: Any) -> bytes:
    """A trigger's JSON; ``extra`` adds optional keys (``ttl``)."""
    return json.dumps({"ids": ids, "request_id": request_id, "data_id": data_id, **extra}).encode()


def publish_batch(port: int, ids: list[str], request_id: str, data_id: str = "d1", blob: bytes = b"BLOB",
                  client_id: str = "platform-test", **extra: Any) -> None:
    """Publish a blob and a trigger as the platform; return once both are PUBACKed (durable). ``extra``: optional
    trigger keys (``ttl``)."""
    p = platform(port, client_id)
    try:
        p.publish(f"$SDV-FANOUT/data/{data_id}", blob, pid=1)
        assert p.expect(Puback).packet_id == 1
        p.publish("$SDV-FANOUT/trigger", trigger_payload(ids, request_id, data_id, **extra), pid=2)
        assert p.expect(Puback, timeout=30).packet_id == 2
    finally:
        p.disconnect()


__all__ = ["wait_until", "init_session_ray", "connections_by_node", "spread_over_listeners", "fanout_config", "running_cluster", "Vehicle",
           "RawClient", "platform", "publish_batch", "trigger_payload", "PLATFORM_LOGIN", "Puback", "Publish"]
