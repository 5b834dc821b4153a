"""Kill -9 the Ray node holding a shard's primary while publishes to a durable topic go on.

Invariant: every publish that was PUBACKed is in the topic's log after the failover (at least once: a publish
resent after a connection closed without PUBACK may be there twice), a vehicle's messages keep their order in
its partition, and a consumer group's commits made before the kill survive it (the group resumes after them).
"""
from __future__ import annotations

import dataclasses
import threading
import time

import ray

from cluster.cli.consume import ControllerSource
from fanout.mqtt.packets import Puback, Publish
from fanout.topics.consume import consume
from storage.topics import TopicSpec, partition_for

from .harness import fanout_on, fault_config, handles, kill_node, port_of, replication, three_node_ray, wait_until
from tests.integration.fanout_harness import RawClient

RESPONSES = TopicSpec.build("responses", "ecp/+/response")


class Sender:
    """A vehicle publishing its responses QoS 1 one at a time, resending (DUP) after a connection closed
    without PUBACK, as a real client does; ``acked`` lists the payloads whose PUBACK arrived."""

    def __init__(self, port: int, vin: str) -> None:
        self.port, self.vin = port, vin
        self.acked: list[bytes] = []
        self.resends = 0
        self._client: RawClient | None = None
        self._pid = 0

    def send(self, payload: bytes, deadline_s: float = 90.0) -> None:
        deadline = time.monotonic() + deadline_s
        dup = False
        self._pid = self._pid % 60000 + 1
        while time.monotonic() < deadline:
            try:
                if self._client is None or self._client.closed:
                    self._client = RawClient(self.port, self.vin)
                self._client.send(Publish(f"ecp/{self.vin}/response", payload, 1, False, dup, self._pid))
                p = self._client.recv(timeout=20)
            except (OSError, AssertionError):
                p = None
            if isinstance(p, Puback) and p.packet_id == self._pid:
                self.acked.append(payload)
                return
            self.resends += 1
            dup = True
            if self._client is not None:
                self._client.kill()
            time.sleep(0.2)
        raise AssertionError(f"{self.vin}: no PUBACK within {deadline_s:.0f}s")

    def close(self) -> None:
        if self._client is not None and not self._client.closed:
            self._client.disconnect()


def _read(fanout, group, **kw):
    got = []
    consume(ControllerSource(fanout.controller), "responses", group, emit=lambda p, e: got.append((p, e)), **kw)
    return got


def test_topic_logs_and_group_offsets_survive_a_primary_kill(tmp_path):
    cfg = dataclasses.replace(fault_config(tmp_path), topics=(RESPONSES,))
    with three_node_ray() as cluster, fanout_on(cfg) as fanout:
        h = handles(fanout)
        head = cluster.head_node.node_id
        victim = next(k for k, n in enumerate(h["primary_ray_nodes"]) if n != head)
        vins = [v for v in (f"VINFAULT{i:09d}" for i in range(200))
                if partition_for(RESPONSES, f"ecp/{v}/response", v, 2) % 2 == victim][:3]
        port = port_of(fanout, head)
        senders = [Sender(port, v) for v in vins]
        stop = threading.Event()
        failures: list[BaseException] = []

        def run(s: Sender) -> None:
            try:
                i = 0
                while not stop.is_set():
                    s.send(f"{s.vin}:{i}".encode())
                    i += 1
            except BaseException as exc:
                failures.append(exc)

        threads = [threading.Thread(target=run, args=(s,), daemon=True) for s in senders]
        try:
            for t in threads:
                t.start()
            wait_until(lambda: all(len(s.acked) >= 20 for s in senders), 60, "20 acked publishes per vehicle")
            before = _read(fanout, "survivor", start="earliest", ack=True)  # committed on the victim's shard
            assert {e[3] for _p, e in before} == set(vins)
            committed = {p: max(e[0] for q, e in before if q == p) for p, _e in before}
            kill_node(cluster, fanout, h["primary_ray_nodes"][victim])
            wait_until(lambda: replication(fanout)[victim]["epoch"] >= 2, 60, "the shard failed over")
            acked_at_failover = {s.vin: len(s.acked) for s in senders}
            wait_until(lambda: all(len(s.acked) >= acked_at_failover[s.vin] + 10 for s in senders), 120,
                       "10 more acked publishes per vehicle on the new primary")
            stop.set()
            for t in threads:
                t.join(120)
            assert not failures, failures
            # the group resumes after what it committed before the kill
            after = _read(fanout, "survivor", start="earliest")
            for p, off in committed.items():
                offsets = [e[0] for q, e in after if q == p]
                assert offsets and min(offsets) == off + 1, (p, off, offsets[:3])
            # every acknowledged publish is in the log, each vehicle's in its publish order (a resend may repeat one)
            everything = _read(fanout, "audit", start="earliest")
            for s in senders:
                logged = [e[5] for _p, e in everything if e[3] == s.vin]
                deduped = [x for i, x in enumerate(logged) if i == 0 or x != logged[i - 1]]
                assert deduped[:len(s.acked)] == s.acked, (s.vin, s.resends)
            shown = ray.get(fanout.controller.show_topic.remote("responses"), timeout=30)
            assert [g["group"] for g in shown["groups"]] == ["survivor"]
        finally:
            stop.set()
            for s in senders:
                s.close()
