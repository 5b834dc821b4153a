"""Two connection nodes over the same dispatcher cores (no Ray): a vehicle that moves between nodes.

The suspicion checked here: after a cross-node takeover, the persistent session left behind on the first
node still holds the fanout message it had; the row is delivered and acknowledged on the second node;
when the vehicle later comes back to the first node, that session resends the message (with DUP=0 when
it was still queued) although the row was acknowledged. It was real: the node that loses a vehicle to
another node now drops the fanout messages of that vehicle's session left behind (their rows belong to
the new connection's dispatch; anything still pending is sent there again).
"""
from __future__ import annotations

from pathlib import Path

import pytest

from benchmarks.local_link import LocalShardLink
from fanout.config import load_config, mqtt_settings
from fanout.dispatcher.core import DispatcherCore
from fanout.mqtt.auth import AccessControl
from fanout.mqtt.broker import Broker
from fanout.mqtt.codec import PacketReader
from fanout.mqtt.packets import Connack, Connect, Pingreq, Pingresp, Puback, Publish, Suback, Subscribe
from fanout.node.core import NodeCore
from storage import ShardStore

from .test_node_core import Client, dispatcher_round, hand_output, trigger


class Node:
    """One connection node (broker + node core) of a :class:`TwoNodes` cluster; quacks like the
    single-node ``Cluster`` for :class:`Client`."""

    def __init__(self, cluster: "TwoNodes", node_id: str, cfg, hold_connacks: bool = False) -> None:
        self.cluster = cluster
        self.node_id = node_id
        self.edge = NodeCore(cfg, node_id, cluster.link, hold_connacks=hold_connacks)
        self.broker = Broker(mqtt_settings(cfg), AccessControl(mqtt_settings(cfg), listener_is_loopback=True), self.edge,
                             now_ms=cluster.now)
        self.edge.attach(self.broker)

    @property
    def now(self) -> int:
        return self.cluster.now

    def flush(self) -> None:
        hand_output(self.broker)

    def platform(self, cid: str = "platform-1") -> Client:
        return Client(self, cid, user="platform", password=b"platform")  # type: ignore[arg-type]


class TwoNodes:
    def __init__(self, tmp_path: Path, *, max_inflight: int = 32, hold_connacks: bool = False) -> None:
        cfg = load_config(None, env={}).replace("mqtt", sys_interval="0s", max_inflight=max_inflight)
        self.now = 1_000_000
        self.stores = [ShardStore(tmp_path / f"shard-{k}", k, sync=False) for k in range(2)]
        self.cores = [DispatcherCore(s, k, 2, started_ms=0) for k, s in enumerate(self.stores)]
        self.link = LocalShardLink(self.cores)
        self.nodes = {n: Node(self, n, cfg, hold_connacks) for n in ("A", "B")}

    def close(self) -> None:
        for s in self.stores:
            s.close()

    async def pump(self, rounds: int = 20) -> None:
        for _ in range(rounds):
            moved = False
            for node in self.nodes.values():
                node.flush()
                if node.edge.has_tickets():
                    await node.edge.process_ingest()
                    moved = True
                if self.ship(node):
                    moved = True
            if self.hand_out_dispatcher_output():
                moved = True
            for node in self.nodes.values():
                node.flush()
            if not moved:
                return

    def ship(self, node: Node) -> bool:
        """Apply ``node``'s queued events (one events call per shard, as the actor makes them)."""
        taken = node.edge.take_events()
        for shard, events in taken.items():
            self.cores[shard].apply_events(node.node_id, events)
            node.edge.events_done(shard)
        node.flush()
        return bool(taken)

    def hand_out_dispatcher_output(self) -> bool:
        """One round of the dispatchers' output (sends, kicks, deletes) to the nodes; whether any moved."""
        moved = dispatcher_round(self.cores, self.now, lambda node_id: self.nodes[node_id].edge)
        for node in self.nodes.values():
            node.flush()
        return moved

    def pending(self) -> int:
        return sum(s.pending_count() for s in self.stores)


@pytest.fixture
def two(tmp_path):
    c = TwoNodes(tmp_path)
    yield c
    c.close()


async def publish(c: TwoNodes, ids, request_id: str, pid: int) -> None:
    p = c.nodes["A"].platform(f"platform-{pid}")
    p.send(Publish("$SDV-FANOUT/data/d1", b"BLOB", 1, False, False, pid),
           Publish("$SDV-FANOUT/trigger", trigger(ids, request_id, "d1"), 1, False, False, pid + 1))
    await c.pump()
    assert p.acks() == [pid, pid + 1]
    p.drop()


def online(node: Node, vin: str) -> Client:
    car = Client(node, vin, clean=False)  # type: ignore[arg-type]
    car.subscribe(f"agent/{vin}/proxy/request/+")
    return car


async def test_a_session_left_behind_does_not_resend_a_row_acknowledged_on_the_other_node(two):
    a = online(two.nodes["A"], "V1")
    await two.pump()
    await publish(two, ["V1"], "r1", 1)
    assert [p.dup for p in a.publishes()] == [False]  # in flight on A, not acknowledged
    b = online(two.nodes["B"], "V1")  # the vehicle moves to B while A's socket still looks open
    await two.pump()
    assert a.closed  # kicked: taken over on another node
    b.send(Publish("ecp/V1/online", b"", 0, False, False, None))
    await two.pump()
    (again,) = b.publishes()
    assert again.topic == "agent/V1/proxy/request/r1" and again.dup  # handed out before: DUP=1
    b.send(Puback(again.packet_id))
    await two.pump()
    assert two.pending() == 0
    b.drop()
    await two.pump()
    back = Client(two.nodes["A"], "V1", clean=False)  # type: ignore[arg-type]
    await two.pump()
    assert back.session_present and back.publishes() == []  # the acknowledged row does not come again


async def test_a_queued_fanout_message_left_behind_is_not_sent_later_with_dup_0(tmp_path):
    two = TwoNodes(tmp_path, max_inflight=1)
    try:
        a = online(two.nodes["A"], "V1")
        other = two.nodes["A"].platform("pub")
        other.send(Publish("agent/V1/proxy/request/manual", b"M", 1, False, False, 5))
        await two.pump()
        assert [p.topic for p in a.publishes()] == ["agent/V1/proxy/request/manual"]  # fills the window
        await publish(two, ["V1"], "r1", 1)
        assert a.publishes() == []  # r1 queued in A's session behind the unacked message
        a.drop()  # the vehicle leaves A (no kick: A's connection is already gone)
        await two.pump()
        b = online(two.nodes["B"], "V1")
        b.send(Publish("ecp/V1/online", b"", 0, False, False, None))
        await two.pump()
        (r1,) = b.publishes()
        b.send(Puback(r1.packet_id))
        await two.pump()
        assert two.pending() == 0
        b.drop()
        await two.pump()
        back = Client(two.nodes["A"], "V1", clean=False)  # type: ignore[arg-type]
        await two.pump()
        (manual,) = back.publishes()
        assert (manual.topic, manual.dup) == ("agent/V1/proxy/request/manual", True)  # A's own message: resent
        back.send(Puback(manual.packet_id))  # the window opens: what else does A's session hold?
        await two.pump()
        assert back.publishes() == []  # not r1 (with DUP=0: it had never left A's queue)
    finally:
        two.close()


class Connecting(Client):
    """A vehicle whose CONNACK may be held: the constructor sends the CONNECT (and what the client
    pipelines after it) without waiting for the CONNACK."""

    def __init__(self, node: Node, client_id: str, *pipelined) -> None:  # noqa: D107
        self.cluster = node  # type: ignore[assignment]
        self.conn = node.broker.connection_made(node.now, ("127.0.0.1", 50000))
        self.conn.transport = self
        self.reader = PacketReader()
        self.inbox = []
        self.closed = False
        self.send(Connect(client_id, True, 60, None, None, None), *pipelined)

    def connack(self) -> Connack | None:
        acks = [p for p in self.inbox if isinstance(p, Connack)]
        return acks[0] if acks else None


def test_a_connack_waits_for_the_registration_and_nothing_overtakes_it(tmp_path):
    two = TwoNodes(tmp_path, hold_connacks=True)
    try:
        a = Connecting(two.nodes["A"], "V1", Subscribe(1, (("agent/V1/proxy/request/+", 1),)), Pingreq())
        assert a.inbox == [] and not a.closed  # held: no CONNACK, and the pipelined packets wait too
        two.ship(two.nodes["A"])
        assert [type(p) for p in a.inbox] == [Connack, Suback, Pingresp]
        assert a.connack().return_code == 0
        platform = two.nodes["A"].platform()  # not a vehicle: nothing to register, no hold
        assert not platform.closed
    finally:
        two.close()


def test_the_newest_connection_wins_whatever_order_the_nodes_report_in(tmp_path):
    """Regression (CI flake of test_takeover_across_listeners_closes_the_old_connection): the vehicle
    connects on A, then (after A's CONNACK) on B; A's report reached the shard after B's, so the
    shard, ordering by arrival, kicked the newest connection and kept the old one. The client makes
    its next CONNECT only after a CONNACK, so with the CONNACK held until the registration is
    applied, the newest report always arrives last."""
    two = TwoNodes(tmp_path, hold_connacks=True)
    a_node, b_node = two.nodes["A"], two.nodes["B"]
    try:
        old = Connecting(a_node, "V1")
        if old.connack() is None:  # the client waits for its CONNACK before connecting again
            two.ship(a_node)
        assert old.connack() is not None
        new = Connecting(b_node, "V1")
        # the adversarial order: B's report first, then whatever A has left
        two.ship(b_node)
        two.ship(a_node)
        two.hand_out_dispatcher_output()
        assert new.connack() is not None and not new.closed
        assert old.closed, "the older connection of the client id must be kicked"
    finally:
        two.close()
