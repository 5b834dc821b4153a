"""Tests for fanout.dispatcher.machine: the triggers, the races, per-node grouping and a stateful model check."""
from __future__ import annotations

import bisect
import random
from dataclasses import dataclass, field

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule

from fanout.dispatcher.machine import VinDispatcher
from fanout.dispatcher.state import Delete, Row, Send
from fanout.dispatcher.rows import TickRows


@dataclass
class MemoryRows:
    """In-memory ``PendingRows``: keys sorted per VIN (test double of the shard store)."""

    keys: dict[str, list[bytes]] = field(default_factory=dict)
    rows: dict[bytes, Row] = field(default_factory=dict)
    ts: int = 0

    def add(self, vin: str, request_id: str, data_id: str = "d") -> Row:
        self.ts += 1
        key = vin.encode() + b"\x00" + self.ts.to_bytes(8, "big") + request_id.encode()
        row = Row(key=key, vin=vin, ts_ms=self.ts, request_id=request_id, data_id=data_id)
        bisect.insort(self.keys.setdefault(vin, []), key)
        self.rows[key] = row
        return row

    def delete(self, vin: str, key: bytes) -> None:
        if self.rows.pop(key, None) is not None:
            self.keys[vin].remove(key)

    def next_row(self, vin: str, after: bytes | None = None) -> Row | None:
        keys = self.keys.get(vin, [])
        i = 0 if after is None else bisect.bisect_right(keys, after)
        return self.rows[keys[i]] if i < len(keys) else None

    def pending(self, vin: str) -> list[bytes]:
        return list(self.keys.get(vin, []))


def sends(actions: list) -> list[Send]:
    return [a for a in actions if isinstance(a, Send)]


def online(d: VinDispatcher, vin: str = "V1", node: str = "A", gen: int = 1) -> None:
    d.on_connect(vin, node, gen, session_present=False)
    d.on_subscribe(vin, gen, True)


@pytest.fixture
def rows() -> MemoryRows:
    return MemoryRows()


@pytest.fixture
def d(rows: MemoryRows) -> VinDispatcher:
    return VinDispatcher(rows)


def test_realtime_dispatch(d: VinDispatcher, rows: MemoryRows) -> None:
    online(d)
    r = rows.add("V1", "r1")
    (send,) = d.on_batch(["V1", "OFFLINE"])
    assert send == Send(vin="V1", node="A", generation=1, row=r)
    plan = d.drain_actions(now_ms=1_000)
    assert plan.sends == {"A": [send]} and plan.deletes == []
    assert d.vehicle("V1").inflight.sent_ms == 1_000
    assert d.stats(now_ms=1_500).oldest_inflight_age_ms == 500


def test_connect_and_subscribe_never_send_late_subscribe_then_heartbeat(d: VinDispatcher, rows: MemoryRows) -> None:
    assert d.on_connect("V1", "A", 1, session_present=False) == []
    rows.add("V1", "r1")
    assert d.on_batch(["V1"]) == []  # not subscribed yet
    assert d.on_subscribe("V1", 1, True) == []
    assert d.on_heartbeat("V1", 2) == []  # unknown generation
    assert [s.row.request_id for s in sends(d.on_heartbeat("V1", 1))] == ["r1"]


def test_persistent_reconnect_gets_nothing_until_heartbeat(d: VinDispatcher, rows: MemoryRows) -> None:
    online(d)
    d.on_disconnect("V1", 1)
    rows.add("V1", "r1")
    assert d.on_connect("V1", "B", 2, session_present=True, subscribed=True) == []
    assert d.vehicle("V1").subscribed
    (send,) = sends(d.on_heartbeat("V1", 2))
    assert (send.node, send.generation) == ("B", 2)


def test_resumed_inflight_not_sent_twice_on_heartbeat(d: VinDispatcher, rows: MemoryRows) -> None:
    r1, r2 = rows.add("V1", "r1"), rows.add("V1", "r2")
    online(d)
    d.on_heartbeat("V1", 1)
    d.on_disconnect("V1", 1)  # r1 stays unacked in the persistent session
    d.on_connect("V1", "A", 2, session_present=True, inflight_row_key=r1.key, subscribed=True)
    assert d.vehicle("V1").resumed_inflight
    assert d.on_heartbeat("V1", 2) == [] and d.on_batch(["V1"]) == []
    assert d.on_puback("V1", 2, r1.key) == [Delete("V1", r1.key), Send("V1", "A", 2, r2)]
    assert not d.vehicle("V1").resumed_inflight


def test_clean_session_ignores_inflight_key(d: VinDispatcher, rows: MemoryRows) -> None:
    r1 = rows.add("V1", "r1")
    d.on_connect("V1", "A", 1, session_present=False, inflight_row_key=r1.key, subscribed=True)
    assert d.vehicle("V1").inflight is None and not d.vehicle("V1").subscribed


def test_rows_oldest_first_one_at_a_time(d: VinDispatcher, rows: MemoryRows) -> None:
    online(d)
    r1, r2 = rows.add("V1", "r1"), rows.add("V1", "r2")
    assert sends(d.on_batch(["V1"])) == [Send("V1", "A", 1, r1)]
    r3 = rows.add("V1", "r3")
    assert d.on_batch(["V1"]) == []  # a batch for a VIN with one in flight waits for the PUBACK
    assert d.on_heartbeat("V1", 1) == [] and d.maybe_send("V1") == []
    delivered = []
    for expected in (r1, r2, r3):
        delivered.append(expected.request_id)
        actions = d.on_puback("V1", 1, expected.key)
        assert actions[0] == Delete("V1", expected.key)
        assert len(sends(actions)) <= 1
    assert delivered == ["r1", "r2", "r3"]
    assert d.vehicle("V1").inflight is None and d.stats().delivered == 3


def test_puback_for_untracked_row_still_deletes(d: VinDispatcher, rows: MemoryRows) -> None:
    assert d.on_puback("NEVER-SEEN", 7, b"k") == [Delete("NEVER-SEEN", b"k")]
    r0, r1 = rows.add("V1", "r0"), rows.add("V1", "r1")
    online(d)
    d.on_heartbeat("V1", 1)  # r0 in flight
    assert d.on_puback("V1", 1, r1.key) == [Delete("V1", r1.key)]  # untracked: r0 stays in flight
    assert d.vehicle("V1").inflight.key == r0.key


def test_untracked_puback_on_idle_connection_sends_next(d: VinDispatcher, rows: MemoryRows) -> None:
    r0, r1 = rows.add("V1", "r0"), rows.add("V1", "r1")
    online(d)  # dispatcher restarted: r0 was sent by its predecessor
    assert d.on_puback("V1", 1, r0.key) == [Delete("V1", r0.key), Send("V1", "A", 1, r1)]


def test_stale_generation_events_ignored(d: VinDispatcher, rows: MemoryRows) -> None:
    online(d, node="A", gen=1)
    d.on_connect("V1", "B", 2, session_present=False)  # takeover on node B, disconnect of 1 not seen yet
    d.on_subscribe("V1", 2, True)
    assert d.on_disconnect("V1", 1) == []  # late disconnect of the old connection
    assert d.on_connect("V1", "A", 1, session_present=False) == []  # late duplicate connect
    assert d.on_subscribe("V1", 1, False) == [] and d.on_heartbeat("V1", 1) == []
    vs = d.vehicle("V1")
    assert (vs.node, vs.generation, vs.subscribed) == ("B", 2, True)
    rows.add("V1", "r1")
    assert [s.node for s in sends(d.on_heartbeat("V1", 2))] == ["B"]
    assert d.stats().stale_events == 4 and d.stats().connected == 1


def test_takeover_without_disconnect_clears_old_inflight(d: VinDispatcher, rows: MemoryRows) -> None:
    r1 = rows.add("V1", "r1")
    online(d, node="A", gen=1)
    d.on_heartbeat("V1", 1)
    d.drain_actions(now_ms=0)  # r1 delivered on connection 1, which a takeover on node B closes
    online(d, node="B", gen=2)  # clean session: r1 is gone with connection 1's session
    assert d.stats().inflight == 0
    assert sends(d.on_heartbeat("V1", 2)) == [Send("V1", "B", 2, r1, dup=True)]  # it went out once already


def test_disconnect_of_unseen_newer_generation_fences_its_late_connect(d: VinDispatcher) -> None:
    online(d, gen=1)
    d.on_disconnect("V1", 3)
    assert d.on_connect("V1", "A", 3, session_present=False) == []
    assert d.vehicle("V1") is None and d.stats().connected == 0  # offline, nothing pending: dropped (Rule 6)


def test_disconnect_clears_inflight_and_row_is_resent_after_reconnect_heartbeat(
    d: VinDispatcher, rows: MemoryRows
) -> None:
    r1 = rows.add("V1", "r1")
    online(d)
    d.on_heartbeat("V1", 1)
    d.on_disconnect("V1", 1)
    assert d.vehicle("V1") is None and d.stats().inflight == 0  # the send was never drained: nothing pending
    online(d, node="B", gen=2)
    assert sends(d.on_heartbeat("V1", 2)) == [Send("V1", "B", 2, r1)]


def test_stale_puback_leaves_newer_connections_copy_in_flight(d: VinDispatcher, rows: MemoryRows) -> None:
    r1, _ = rows.add("V1", "r1"), rows.add("V1", "r2")
    online(d)
    d.on_heartbeat("V1", 1)
    d.on_disconnect("V1", 1)  # the vehicle's PUBACK of r1 on connection 1 is still on its way
    online(d, gen=2)
    d.on_heartbeat("V1", 2)  # r1 sent again on connection 2
    assert d.on_puback("V1", 1, r1.key) == [Delete("V1", r1.key)]
    assert d.vehicle("V1").inflight.key == r1.key  # connection 2 still owes its own PUBACK
    assert d.on_heartbeat("V1", 2) == []


def test_puback_after_disconnect_of_same_generation(d: VinDispatcher, rows: MemoryRows) -> None:
    r1, r2 = rows.add("V1", "r1"), rows.add("V1", "r2")
    online(d)
    d.on_heartbeat("V1", 1)
    d.on_disconnect("V1", 1)
    assert d.on_puback("V1", 1, r1.key) == [Delete("V1", r1.key)]  # deletes, sends nothing
    online(d, gen=2)
    # The delete has not been applied to the store yet: the dispatcher must skip r1 (Rule 4).
    assert sends(d.on_heartbeat("V1", 2)) == [Send("V1", "A", 2, r2)]


def test_deletes_skipped_until_confirmed(d: VinDispatcher, rows: MemoryRows) -> None:
    r1, r2 = rows.add("V1", "r1"), rows.add("V1", "r2")
    online(d)
    d.on_heartbeat("V1", 1)
    assert sends(d.on_puback("V1", 1, r1.key)) == [Send("V1", "A", 1, r2)]
    plan = d.drain_actions(now_ms=0)
    assert d.stats().pending_deletes == 1
    for delete in plan.deletes:
        rows.delete(delete.vin, delete.key)
    d.on_deleted(plan.deletes)
    assert d.stats().pending_deletes == 0 and d.vehicle("V1").deleting is None


def test_send_dropped_at_drain_when_vehicle_moved_on(d: VinDispatcher, rows: MemoryRows) -> None:
    r1 = rows.add("V1", "r1")
    online(d)
    d.on_heartbeat("V1", 1)
    d.on_disconnect("V1", 1)
    online(d, node="B", gen=2)
    d.on_heartbeat("V1", 2)
    plan = d.drain_actions(now_ms=0)
    assert plan.sends == {"B": [Send("V1", "B", 2, r1)]}


def test_grouping_per_node(d: VinDispatcher, rows: MemoryRows) -> None:
    vins = [f"V{i}" for i in range(10)]
    for i, vin in enumerate(vins):
        online(d, vin=vin, node="AB"[i % 2])
        rows.add(vin, "r1")
    d.on_batch(vins)
    plan = d.drain_actions(now_ms=0)
    assert sorted(plan.sends) == ["A", "B"] and sum(map(len, plan.sends.values())) == 10 and plan.deletes == []
    assert [s.vin for s in plan.sends["A"]] == vins[0::2]
    first = d.vehicle("V0").inflight.key
    d.on_puback("V0", 1, first)
    assert d.drain_actions(now_ms=1).deletes == [Delete("V0", first)]
    assert not d.drain_actions(now_ms=2)


def test_node_down_disconnects_its_vehicles(d: VinDispatcher, rows: MemoryRows) -> None:
    online(d, vin="V1", node="A")
    online(d, vin="V2", node="B")
    rows.add("V1", "r1")
    d.on_batch(["V1"])
    d.on_node_down("A")
    assert d.vehicle("V1") is None and d.vehicle("V2").node == "B"
    assert d.drain_actions(now_ms=0).sends == {}
    assert (d.stats().connected, d.stats().inflight) == (1, 0)


def test_discard_row_sends_next(d: VinDispatcher, rows: MemoryRows) -> None:
    r1, r2 = rows.add("V1", "r1"), rows.add("V1", "r2")
    online(d)
    d.on_heartbeat("V1", 1)
    assert d.discard_row("V1", r1.key) == [Delete("V1", r1.key, discarded=True), Send("V1", "A", 1, r2)]
    assert d.stats().delivered == 0


def test_machine_over_the_shard_store_rows(tmp_path) -> None:
    shard = pytest.importorskip("storage.shard")
    batch = pytest.importorskip("storage.batch")
    store = shard.ShardStore(tmp_path / "s0", 0, sync=False)
    try:
        store.apply(batch.WriteBatch().enqueue("V1", 5, "r1", "d1").enqueue("V1", 7, "r2", "d1"))
        d = VinDispatcher(TickRows(store))
        online(d)
        (first,) = sends(d.on_heartbeat("V1", 1))
        assert (first.row.request_id, first.row.ts_ms) == ("r1", 5)
        # The ack's delete is not applied to the store yet: the next row still comes out right.
        assert [s.row.request_id for s in sends(d.on_puback("V1", 1, first.row.key))] == ["r2"]
    finally:
        store.close()


# ---- stateful model: nodes, sessions, vehicles, lagging deletes, delayed acks, stale events -------------
VINS = ("V1", "V2")  # two VINs: independent per VIN, but counters and grouping are shared
NODES = ("A", "B")


class FanoutModel(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.rows = MemoryRows()
        self.d = VinDispatcher(self.rows)
        self.now = 0
        self.gen = dict.fromkeys(VINS, 0)
        self.conn: dict[str, tuple[str, int] | None] = dict.fromkeys(VINS)
        self.persistent = dict.fromkeys(VINS, False)  # a session survives the last connection
        self.subscribed = dict.fromkeys(VINS, False)
        self.unacked: dict[str, bytes | None] = dict.fromkeys(VINS)  # session's unacked fanout message
        self.past: dict[str, list[tuple[str, int]]] = {v: [] for v in VINS}
        self.acked: dict[str, list[bytes]] = {v: [] for v in VINS}
        self.inbox: list[Send] = []  # drained, not yet executed by the nodes
        self.unapplied: list[Delete] = []  # drained, not yet applied to the store
        self.delayed_acks: list[tuple[str, int, bytes]] = []
        self.received: dict[str, list[bytes]] = {v: [] for v in VINS}

    @rule(vins=st.sets(st.sampled_from(VINS), min_size=1))
    def batch(self, vins: set[str]) -> None:
        for vin in sorted(vins):
            self.rows.add(vin, f"r{self.rows.ts + 1}")
        # as the dispatcher core does (DispatcherCore.dispatch_new): only the VINs ready now, so a VIN that
        # is not (offline, unsubscribed, a row in flight) keeps its Rule 7 mark until its readiness changes
        ready = self.d.ready_vins(sorted(vins))
        self.d.on_batch(ready)
        for vin in ready:  # Rule 1, realtime: a ready vehicle's new row is on its way at once
            assert self.d.vehicle(vin).inflight is not None, vin

    @rule(vin=st.sampled_from(VINS), node=st.sampled_from(NODES), clean=st.booleans(), old_first=st.booleans())
    def connect(self, vin: str, node: str, clean: bool, old_first: bool) -> None:
        old = self.conn[vin]
        if old is not None and old_first:
            self.d.on_disconnect(vin, old[1])  # takeover: old connection's close reported first
        present = not clean and self.persistent[vin]
        if not present:
            self.subscribed[vin], self.unacked[vin] = False, None
        self.gen[vin] += 1
        self.conn[vin], self.persistent[vin] = (node, self.gen[vin]), not clean
        self.d.on_connect(
            vin, node, self.gen[vin], present, self.unacked[vin] if present else None,
            subscribed=self.subscribed[vin],
        )
        if old is not None:
            self.past[vin].append(old)
            if not old_first:
                self.d.on_disconnect(vin, old[1])  # ... or after the new connect (stale by then)

    @rule(vin=st.sampled_from(VINS))
    def disconnect(self, vin: str) -> None:
        if (c := self.conn[vin]) is None:
            return
        self.conn[vin] = None
        self.past[vin].append(c)
        if not self.persistent[vin]:
            self.subscribed[vin], self.unacked[vin] = False, None
        self.d.on_disconnect(vin, c[1])

    @rule(vin=st.sampled_from(VINS), on=st.booleans())
    def subscribe(self, vin: str, on: bool) -> None:
        if (c := self.conn[vin]) is not None:
            self.subscribed[vin] = on
            self.d.on_subscribe(vin, c[1], on)

    @rule(vin=st.sampled_from(VINS))
    def heartbeat(self, vin: str) -> None:
        if (c := self.conn[vin]) is not None:
            self.d.on_heartbeat(vin, c[1])

    @rule(vin=st.sampled_from(VINS), delay=st.booleans())
    def vehicle_acks(self, vin: str, delay: bool) -> None:
        c, key = self.conn[vin], self.unacked[vin]
        if c is None or key is None:
            return
        self.unacked[vin] = None
        self.acked[vin].append(key)
        if delay:
            self.delayed_acks.append((vin, c[1], key))  # reaches the dispatcher later (other batch)
        else:
            self.d.on_puback(vin, c[1], key)

    @rule()
    def flush_acks(self) -> None:
        for vin, gen, key in self.delayed_acks:
            self.d.on_puback(vin, gen, key)
        self.delayed_acks = []

    @rule(vin=st.sampled_from(VINS), kind=st.sampled_from(["connect", "disconnect", "sub", "hb", "ack"]))
    def stale_event(self, vin: str, kind: str) -> None:
        if not self.past[vin]:
            return
        node, gen = self.past[vin][-1]
        if kind == "connect":
            assert self.d.on_connect(vin, node, gen, session_present=False) == []
        elif kind == "disconnect":
            assert self.d.on_disconnect(vin, gen) == []
        elif kind == "sub":
            assert self.d.on_subscribe(vin, gen, False) == []
        elif kind == "hb":
            assert self.d.on_heartbeat(vin, gen) == []
        elif self.acked[vin]:  # a duplicate ack of something the vehicle really acked
            assert not sends(self.d.on_puback(vin, gen, self.acked[vin][-1]))

    @rule()
    def drain(self) -> None:
        self.now += 10
        plan = self.d.drain_actions(self.now)
        self.unapplied.extend(plan.deletes)
        for node, batch in plan.sends.items():
            for send in batch:
                assert send.node == node
                # Oldest first: no older row is skipped unless it is being deleted. The row itself may be
                # being deleted: a stale PUBACK (acked on an older connection) that arrived after the send
                # was decided; the duplicate is at-least-once delivery, acked again by the vehicle.
                gone = {x.key for x in self.unapplied if x.vin == send.vin}
                pending = self.rows.pending(send.vin)
                assert send.row.key in pending
                assert all(k in gone for k in pending if k < send.row.key)
                self.inbox.append(send)

    @rule()
    def apply_deletes(self) -> None:
        for delete in self.unapplied:
            self.rows.delete(delete.vin, delete.key)
        self.d.on_deleted(self.unapplied)
        self.unapplied = []

    @rule()
    def nodes_deliver(self) -> None:
        for send in self.inbox:
            if self.conn[send.vin] == (send.node, send.generation):
                # THE invariant: never a second fanout message while one is unacked by the vehicle.
                assert self.unacked[send.vin] is None, (send, self.unacked[send.vin])
                self.unacked[send.vin] = send.row.key
                self.received[send.vin].append(send.row.key)
        self.inbox = []

    @rule()
    def tick(self) -> None:
        """A whole actor tick at once (drain, store write, node delivery): reaches deep states sooner."""
        self.drain()
        self.apply_deletes()
        self.nodes_deliver()

    @invariant()
    def dispatcher_view_matches(self) -> None:
        stats = self.d.stats()
        states = [self.d.vehicle(v) for v in VINS]
        assert stats.connected == sum(1 for vs in states if vs is not None and vs.node is not None)
        assert stats.inflight == sum(1 for vs in states if vs is not None and vs.inflight is not None)
        assert stats.pending_deletes == sum(len(vs.deleting or ()) for vs in states if vs is not None)
        for vin, vs in zip(VINS, states):
            if self.conn[vin] is not None:
                assert (vs.node, vs.generation) == self.conn[vin]
                assert vs.subscribed == self.subscribed[vin]
            elif vs is not None:
                assert vs.node is None and vs.inflight is None

    def teardown(self) -> None:
        """Liveness: once vehicles stay connected, subscribed and acking, every row arrives once, in order."""
        self.flush_acks()
        for vin in VINS:
            if self.conn[vin] is None:
                self.connect(vin, "A", clean=False, old_first=True)
            if not self.subscribed[vin]:  # one already subscribed gets no new event: its heartbeat must do
                self.subscribe(vin, True)
        self.tick()  # sends decided before now (possibly duplicates of rows acked late) reach the vehicle
        expected = {v: self.rows.pending(v) for v in VINS}
        held = dict(self.unacked)  # a copy the vehicle holds (delivered or resumed) is acked, not resent
        marks = {v: len(self.received[v]) for v in VINS}
        for vin in VINS:
            self.heartbeat(vin)
        for _ in range(4 * len(self.rows.rows) + 10):
            self.drain()
            self.apply_deletes()
            self.nodes_deliver()
            for vin in VINS:
                self.vehicle_acks(vin, delay=False)
            stats = self.d.stats()
            if not (self.inbox or any(self.unacked.values()) or stats.inflight or stats.pending_deletes):
                break
        for vin in VINS:
            assert self.rows.pending(vin) == [], vin
            got = self.received[vin][marks[vin]:]
            assert got == [k for k in expected[vin] if k != held[vin]], vin


TestFanoutModel = FanoutModel.TestCase
TestFanoutModel.settings = settings(
    max_examples=150, stateful_step_count=40, deadline=None, suppress_health_check=[HealthCheck.too_slow]
)


def test_random_walks_of_the_model() -> None:
    """Plain seeded random walks over the same model: no shrinking, but 100x more (and longer) runs."""
    rng = random.Random(20_260_501)
    steps = [
        lambda m: m.batch({rng.choice(VINS)}),
        lambda m: m.connect(rng.choice(VINS), rng.choice(NODES), rng.random() < 0.3, rng.random() < 0.5),
        lambda m: m.disconnect(rng.choice(VINS)),
        lambda m: m.subscribe(rng.choice(VINS), rng.random() < 0.8),
        lambda m: m.heartbeat(rng.choice(VINS)),
        lambda m: m.vehicle_acks(rng.choice(VINS), rng.random() < 0.3),
        lambda m: m.flush_acks(),
        lambda m: m.stale_event(rng.choice(VINS), rng.choice(["connect", "disconnect", "sub", "hb", "ack"])),
        lambda m: m.drain(),
        lambda m: m.apply_deletes(),
        lambda m: m.nodes_deliver(),
        lambda m: m.tick(),
    ]
    for _ in range(1_500):
        model = FanoutModel()
        for _ in range(rng.randint(5, 80)):
            rng.choice(steps)(model)
            model.dispatcher_view_matches()
        model.teardown()


def test_subscription_that_reaches_the_dispatcher_after_a_newer_batch_is_sent_realtime(d: VinDispatcher, rows: MemoryRows) -> None:
    """Events and ingest are separate calls: the batch (ts 5 ms) the platform published after the SUBACK
    (at 4,000 µs) can arrive first. The vehicle subscribed before the publish, so it is owed the row now."""
    d.on_connect("V1", "A", 1_000, session_present=False)
    rows.ts = 4
    r = rows.add("V1", "r1")  # ts_ms 5
    assert d.on_batch(["V1"]) == []  # the subscription is not known yet
    assert sends(d.on_subscribe("V1", 1_000, True, at_us=4_000)) == [Send(vin="V1", node="A", generation=1_000, row=r)]


def test_subscription_older_than_nothing_pending_stays_a_late_subscribe(d: VinDispatcher, rows: MemoryRows) -> None:
    d.on_connect("V1", "A", 1_000, session_present=False)
    rows.ts = 4
    rows.add("V1", "r1")  # ts_ms 5: written before the subscription at 6,000 µs
    assert d.on_subscribe("V1", 1_000, True, at_us=6_000) == []
    assert [s.row.request_id for s in sends(d.on_heartbeat("V1", 1_000))] == ["r1"]


def test_dup_only_when_the_row_may_have_reached_the_vehicle(rows: MemoryRows) -> None:
    """DUP=1 for the resend of the row sent last (vehicle dropped before PUBACK), and for the first send to
    a VIN of a row older than the dispatcher's start (restart or failover: it may have been in flight);
    DUP=0 for rows this dispatcher never sent that came after its start."""
    old = rows.add("V1", "old")  # ts 1: queued before the dispatcher started at ts 2
    d = VinDispatcher(rows, started_ms=2)
    online(d)
    (first,) = sends(d.on_heartbeat("V1", 1))
    assert (first.row, first.dup) == (old, True)
    new = rows.add("V1", "new")  # ts 3
    d.on_puback("V1", 1, old.key)
    rows.delete("V1", old.key)
    plan = d.drain_actions(now_ms=0)  # both leave: "old" (DUP) and, after its PUBACK, "new"
    (second,) = [s for node_sends in plan.sends.values() for s in node_sends if s.row == new]
    assert not second.dup
    d.on_disconnect("V1", 1)  # dropped before acknowledging "new"
    online(d, gen=2)
    (again,) = sends(d.on_heartbeat("V1", 2))
    assert (again.row, again.dup) == (new, True)


# ---- Rule 6: state lives while something is pending ---------------------------------------------------

def test_a_vin_that_leaves_with_nothing_pending_leaves_only_its_fence(d: VinDispatcher) -> None:
    online(d, gen=5)
    d.on_heartbeat("V1", 5)  # nothing queued: nothing sent
    d.on_disconnect("V1", 5)
    assert d.vehicle("V1") is None and (d.stats().vehicles, d.stats().fenced) == (0, 1)
    assert d.on_connect("V1", "A", 5, session_present=False) == []  # the closed connection, reported late
    assert d.vehicle("V1") is None and d.stats().stale_events == 1
    d.on_disconnect("V1", 4)  # an older one: stale, creates nothing
    assert d.on_disconnect("V9", 3) == [] and d.vehicle("V9") is None  # unknown VIN: remembered only
    online(d, gen=6)
    assert d.vehicle("V1").node == "A" and d.stats().fenced == 1  # V9's fence


def test_states_kept_while_a_delete_or_an_unacknowledged_send_is_pending(d: VinDispatcher, rows: MemoryRows) -> None:
    r1 = rows.add("V1", "r1")
    online(d)
    d.on_heartbeat("V1", 1)
    d.drain_actions(now_ms=1)  # handed to node A
    d.on_puback("V1", 1, r1.key)
    d.on_disconnect("V1", 1)
    assert d.vehicle("V1").deleting == {r1.key}  # its delete is not durable yet
    deletes = d.drain_actions(now_ms=2).deletes
    rows.delete("V1", r1.key)
    d.on_deleted(deletes)
    assert d.vehicle("V1") is None
    r2 = rows.add("V1", "r2")
    online(d, gen=2)
    d.on_heartbeat("V1", 2)
    d.drain_actions(now_ms=3)
    d.on_disconnect("V1", 2)  # before its PUBACK
    assert d.vehicle("V1").attempted == r2.key
    online(d, gen=3)
    assert sends(d.on_heartbeat("V1", 3)) == [Send("V1", "A", 3, r2, dup=True)]


def test_the_fence_is_bounded(d: VinDispatcher, monkeypatch) -> None:
    import fanout.dispatcher.machine as machine

    monkeypatch.setattr(machine, "FENCE_SIZE", 3)
    for i in range(10):
        online(d, vin=f"V{i}", gen=i + 1)
        d.on_disconnect(f"V{i}", i + 1)
    assert d.stats().fenced == 3 and d.stats().vehicles == 0


def test_after_an_ack_the_next_row_older_than_the_start_is_not_dup(rows: MemoryRows) -> None:
    """One in flight per VIN: only the oldest row can have been out under a predecessor, so once this
    dispatcher has sent (and had acknowledged) a row, the next old row goes out with DUP=0."""
    old1, old2 = rows.add("V1", "old1"), rows.add("V1", "old2")
    d = VinDispatcher(rows, started_ms=10)
    online(d)
    (first,) = sends(d.on_heartbeat("V1", 1))
    assert (first.row, first.dup) == (old1, True)
    d.drain_actions(now_ms=0)
    (second,) = sends(d.on_puback("V1", 1, old1.key))
    assert (second.row, second.dup) == (old2, False)


def test_a_vehicle_whose_last_read_found_nothing_skips_the_store_on_heartbeats_until_it_can_have_a_row(rows: MemoryRows) -> None:
    """Rule 7: the heartbeats of a vehicle with nothing pending do not read the store; every path by which
    a row can become its to send (a batch, or a readiness change while a batch passed it by) reads again."""
    reads = []

    class Counting(MemoryRows):
        def next_row(self, vin, after=None):
            reads.append(vin)
            return super().next_row(vin, after)

    rows = Counting()
    d = VinDispatcher(rows)
    online(d)
    assert d.on_heartbeat("V1", 1) == [] and len(reads) == 1  # read: nothing
    for _ in range(3):
        assert d.on_heartbeat("V1", 1) == []
    assert len(reads) == 1 and d.vehicle("V1").read_nothing
    rows.add("V1", "r1")
    assert sends(d.on_batch(d.ready_vins(["V1"])))  # a batch reads again, at once
    d.on_puback("V1", 1, d.vehicle("V1").inflight.key)
    assert d.vehicle("V1").read_nothing  # the read after the ack found nothing

    # while unsubscribed a batch passes it by; subscribing again makes the heartbeat read
    d.on_subscribe("V1", 1, False)
    rows.add("V1", "r2")
    assert d.ready_vins(["V1"]) == []
    d.on_subscribe("V1", 1, True)
    assert sends(d.on_heartbeat("V1", 1))

    # offline during a batch: the new connection's heartbeat reads (its state may even have been kept)
    d.on_puback("V1", 1, d.vehicle("V1").inflight.key)
    assert d.vehicle("V1").read_nothing
    d.on_disconnect("V1", 1)
    rows.add("V1", "r3")
    d.on_connect("V1", "A", 2, session_present=True, subscribed=True)
    assert sends(d.on_heartbeat("V1", 2))

    # a send the node could not make: the row stays, the next heartbeat reads it again
    key = d.vehicle("V1").inflight.key
    d.on_send_failed("V1", 2, key)
    assert [s.row.key for s in sends(d.on_heartbeat("V1", 2))] == [key]
