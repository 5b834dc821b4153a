"""Helpers for the fault tests: a 3-node ``ray.cluster_utils.Cluster``, a retrying platform publisher, kill -9.

Each fault test needs its own Ray cluster (it kills parts of it), so it cannot share the session's
``ray_local`` instance: :func:`three_node_ray` shuts that down first and starts it again afterwards exactly as
``tests/conftest.py`` does (the approach of ``tests/cluster/test_two_nodes.py``). Every process a test starts
is stopped by the context managers here, also when the test fails.

Sizes: the primary-kill test ingests ``FANOUT_FAULT_VINS`` VINs (default 100,000, the issue's full size;
CI on a busy machine may set it lower).
"""
from __future__ import annotations

import contextlib
import os
import signal
import threading
import time
from typing import Any, Iterator

import ray

from actors.ray_observability import quiet_system_config
from tests.integration.fanout_harness import (
    Puback, RawClient, fanout_config, init_session_ray, platform, running_cluster, trigger_payload, wait_until,
)

FAULT_VINS = int(os.environ.get("FANOUT_FAULT_VINS", "100000"))
NODE_ARGS = {"num_cpus": 1, "resources": {"fanout_node": 1}, "object_store_memory": 80 * 1024 * 1024}


@contextlib.contextmanager
def three_node_ray() -> Iterator[Any]:
    """A head and two workers, each with the ``fanout_node`` resource; the driver joins the head."""
    from ray.cluster_utils import Cluster

    had_session_ray = ray.is_initialized()
    if had_session_ray:
        ray.shutdown()
    cluster = Cluster(initialize_head=True,
                      head_node_args={**NODE_ARGS, "include_dashboard": False,
                                      "_system_config": quiet_system_config()})
    try:
        cluster.add_node(**NODE_ARGS)
        cluster.add_node(**NODE_ARGS)
        ray.init(address=cluster.address, log_to_driver=False, configure_logging=False)
        cluster.wait_for_nodes()
        yield cluster
    finally:
        ray.shutdown()
        cluster.shutdown()
        if had_session_ray:
            init_session_ray()  # give the session its Ray back


def fault_config(tmp_path: Any, **fanout: Any) -> Any:
    """Test config: 2 shards, 1 replica each, fast failure detection, no $SYS writes (tables stay comparable)."""
    cfg = fanout_config(tmp_path, **{"replicas": 1, "failover_timeout": "1500ms", "heartbeat_interval": "200ms",
                                     "replica_timeout": "2s", **fanout})
    return cfg.replace("mqtt", sys_interval="0s")


@contextlib.contextmanager
def fanout_on(cfg: Any) -> Iterator[Any]:
    with running_cluster(cfg) as fanout:
        assert len(fanout.nodes) == 3, fanout.nodes
        yield fanout


def handles(fanout: Any) -> dict[str, Any]:
    return ray.get(fanout.controller.handles.remote(), timeout=30)


def replication(fanout: Any) -> list[dict[str, Any]]:
    return ray.get(fanout.controller.replication.remote(), timeout=30)


def actor_pid(handle: Any) -> int:
    return ray.get(handle.__ray_call__.remote(lambda self: os.getpid()), timeout=30)


def kill9(pid: int) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGKILL)


def kill_node(cluster: Any, fanout: Any, ray_node_id: str) -> list[int]:
    """kill -9 every fanout actor process on a Ray node (they would otherwise outlive their raylet for a
    moment and keep serving), then SIGKILL the node's raylet and the rest with ``remove_node``.

    Returns:
        The actor pids killed.
    """
    h = handles(fanout)
    calls = [d.__ray_call__.remote(lambda self: (ray.get_runtime_context().get_node_id(), os.getpid()))
             for d in h["dispatchers"]]
    calls += [r.__ray_call__.remote(lambda self: (ray.get_runtime_context().get_node_id(), os.getpid()))
              for reps in h["replicas"] for r in reps.values()]
    calls += [n.__ray_call__.remote(lambda self: (ray.get_runtime_context().get_node_id(), os.getpid()))
              for n in h["nodes"].values()]
    pids = [pid for node, pid in ray.get(calls, timeout=30) if node == ray_node_id]
    node = next(n for n in cluster.worker_nodes if n.node_id == ray_node_id)
    for pid in pids:
        kill9(pid)
    cluster.remove_node(node, allow_graceful=False)
    return pids


def port_of(fanout: Any, ray_node_id: str | None = None, *, not_on: str | None = None) -> int:
    """Listener port of the connection node on ``ray_node_id`` (or on any other node than ``not_on``)."""
    for n in fanout.nodes:
        if (ray_node_id is None or n["ray_node_id"] == ray_node_id) and n["ray_node_id"] != not_on:
            return int(n["port"])
    raise AssertionError(f"no connection node on {ray_node_id} (not on {not_on})")


class Publisher:
    """The platform: publishes triggers one at a time, QoS 1, and retries like a real platform client.

    A trigger counts as acknowledged only when its PUBACK arrived. A connection closed without PUBACK
    (the cluster rejected the ticket as unavailable during failover) is reopened and the trigger is resent
    with DUP set; ingest is idempotent, so a resend never queues a row twice.

    Args:
        port: the listener to publish to (a node that survives the test).
        data_id: the blob's id (published first).
    """

    def __init__(self, port: int, data_id: str = "dfault", blob: bytes = b"FAULT-BLOB") -> None:
        self.port = port
        self.data_id = data_id
        self.acked: list[str] = []
        self.resends = 0
        self.errors: list[str] = []
        self._client: RawClient | None = None
        self._pid = 0
        self._send(f"$SDV-FANOUT/data/{data_id}", blob)

    def _connect(self) -> RawClient:
        if self._client is None or self._client.closed:
            self._client = platform(self.port, "platform-fault")
        return self._client

    def _send(self, topic: str, payload: bytes, deadline_s: float = 60.0) -> None:
        from fanout.mqtt.packets import Publish

        deadline = time.monotonic() + deadline_s
        dup = False
        while time.monotonic() < deadline:
            self._pid = self._pid % 60000 + 1
            try:
                c = self._connect()
                c.send(Publish(topic, payload, 1, False, dup, self._pid))
                p = c.recv(timeout=min(30.0, max(1.0, deadline - time.monotonic())))
            except (OSError, AssertionError) as exc:
                self.errors.append(repr(exc)[:200])
                p = None
            if isinstance(p, Puback) and p.packet_id == self._pid:
                return
            self.resends += 1
            dup = True
            if self._client is not None:
                self._client.kill()
            time.sleep(0.2)
        raise AssertionError(f"{topic}: no PUBACK within {deadline_s:.0f}s ({self.resends} resends)")

    def trigger(self, request_id: str, vins: list[str]) -> None:
        self._send("$SDV-FANOUT/trigger", trigger_payload(vins, request_id, self.data_id))
        self.acked.append(request_id)

    def close(self) -> None:
        if self._client is not None and not self._client.closed:
            self._client.disconnect()


class Fleet:
    """Vehicles on one listener that acknowledge everything and record (request_id, dup) per VIN.

    Raw sockets in one reader thread each would be too many threads for hundreds of vehicles; a handful of
    vehicles with paho is what the delivery invariant needs (the store-level check covers every VIN).
    """

    def __init__(self, port: int, vins: list[str], *, auto_ack: bool = True) -> None:
        from tests.integration.fanout_harness import Vehicle

        self.vins = vins
        self.got: dict[str, list[tuple[str, bool]]] = {v: [] for v in vins}
        self.first_seen: dict[tuple[str, str], float] = {}  # (vin, request_id) -> monotonic time of the first copy
        self._lock = threading.Lock()
        self.cars = []
        for v in vins:
            car = Vehicle(port, v, manual_ack=not auto_ack)
            car.client.on_message = self._recorder(car, v)
            self.cars.append(car)
        for car in self.cars:  # connect and subscribe never send (MQTT contract): "online" is the trigger
            car.heartbeat("online")

    def _recorder(self, car: Any, vin: str) -> Any:
        def on_message(client: Any, userdata: Any, msg: Any) -> None:
            rid = msg.topic.rsplit("/", 1)[-1]
            with self._lock:
                self.got[vin].append((rid, bool(msg.dup)))
                self.first_seen.setdefault((vin, rid), time.monotonic())
            car.messages.put(msg)

        return on_message

    def requests(self, vin: str) -> list[str]:
        with self._lock:
            return [r for r, _ in self.got[vin]]

    def has_all(self, request_ids: list[str]) -> bool:
        want = set(request_ids)
        return all(want <= set(self.requests(v)) for v in self.vins)

    def close(self) -> None:
        for car in self.cars:
            car.close()


def request_rows(fanout: Any, request_id: str) -> int:
    """Rows of a request in the store, pending or delivered, over every shard's primary."""
    return int(fanout.inspect("request", request_id)["rows"])


__all__ = ["FAULT_VINS", "three_node_ray", "fault_config", "fanout_on", "handles", "replication", "actor_pid",
           "kill9", "kill_node", "port_of", "Publisher", "Fleet", "request_rows", "wait_until"]
