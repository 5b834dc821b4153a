"""The consumer-group core (fanout.topics.groups): rules 1-5 of its docstring, by example and under random
interleavings of joins, leaves, appends, sends, acknowledgements and failed sends (hypothesis)."""
from __future__ import annotations

import pytest
from hypothesis import HealthCheck, example, given, settings, strategies as st

from fanout.topics.groups import GroupCore, parse_start, start_offset


def _core(parts=(0, 1), high=0, start="earliest", max_inflight=8) -> GroupCore:
    g = GroupCore("t", "g", max_inflight)
    for p in parts:
        g.open_partition(p, None, 0, high, start)
    return g


def test_parse_start():
    assert parse_start(None) == "latest"
    assert parse_start("Earliest") == "earliest"
    assert parse_start("12") == 12
    assert parse_start(3) == 3
    for bad in ("soon", "-1", -2, "1.5"):
        with pytest.raises(ValueError):
            parse_start(bad)
    assert start_offset("earliest", 4, 9) == 4
    assert start_offset("latest", 4, 9) == 9
    assert start_offset(2, 4, 9) == 4 and start_offset(7, 4, 9) == 7 and start_offset(70, 4, 9) == 9


def test_new_group_starts_at_latest_and_commits_its_start():
    g = GroupCore("t", "g", 8)
    g.open_partition(0, None, 0, 5)  # latest
    g.join("a", "n1", 1, 10)
    assert g.plan() == []
    assert g.take_commits() == [(0, 4)]  # the starting position survives a restart
    g.appended(0, 7)
    sends = g.plan()
    assert [(s.member.client_id, s.partition, s.first, s.last) for s in sends] == [("a", 0, 5, 6)]


def test_stored_commit_wins_over_start():
    g = GroupCore("t", "g", 8)
    g.open_partition(0, 2, 0, 9, "earliest")
    g.join("a", "n1", 1, 10)
    assert [(s.first, s.last) for s in g.plan()] == [(3, 8)]
    assert g.take_commits() == []


def test_members_share_partitions_and_windows_bound_sends():
    g = _core(parts=(0, 1, 2, 3), high=10, max_inflight=4)
    g.join("a", "n1", 1, 3)
    g.join("b", "n2", 1, 100)
    sends = g.plan()
    by_member: dict[str, list] = {}
    for s in sends:
        by_member.setdefault(s.member.client_id, []).append((s.partition, s.first, s.last))
    assert {p: ps.owner for p, ps in g.parts.items()} == {0: "a", 1: "b", 2: "a", 3: "b"}
    assert {p for p, _f, _l in by_member["b"]} == {1, 3}
    assert sum(l - f + 1 for _p, f, l in by_member["a"]) == 3  # a's window
    assert all(l - f + 1 <= 4 for _p, f, l in by_member["b"])  # the partition bound


def test_departed_member_messages_go_to_the_other_member():
    g = _core(parts=(0,), high=5)
    g.join("a", "n1", 1, 10)
    assert [(s.member.client_id, s.first, s.last) for s in g.plan()] == [("a", 0, 4)]
    assert g.ack("a", 1, 0, 0) and g.ack("a", 1, 0, 1)
    g.join("b", "n2", 1, 10)  # rebalance: partition 0 belongs to a (sorted [a, b], 0 % 2) anyway
    assert g.leave("a", "n1", 1)
    sends = g.plan()
    assert [(s.member.client_id, s.first, s.last) for s in sends] == [("b", 2, 4)]
    assert g.take_commits() == [(0, 1)]


def test_handover_waits_for_in_flight_acks():
    g = _core(parts=(1,), high=4)
    g.join("b", "n1", 1, 10)
    assert [(s.member.client_id, s.first) for s in g.plan()] == [("b", 0)]
    g.join("a", "n2", 1, 10)  # sorted [a, b]: partition 1 now wants b... 1 % 2 = 1 -> b: stays
    g.join("c", "n2", 1, 10)  # [a, b, c]: 1 -> b still
    g.leave("c")
    g.join("0", "n3", 1, 10)  # ["0", a, b]: 1 -> a, but b holds 4 messages in flight
    g.appended(1, 6)
    assert g.plan() == []  # Rule 2: no new sends while the handover waits
    for o in range(4):
        assert g.ack("b", 1, 1, o)
    assert g.parts[1].owner == "a"
    assert [(s.member.client_id, s.first, s.last) for s in g.plan()] == [("a", 4, 5)]


def test_stale_ack_after_reconnect_is_ignored():
    g = _core(parts=(0,), high=3)
    g.join("a", "n1", 1, 10)
    g.plan()
    g.join("a", "n1", 2, 10)  # reconnected: the old generation left, everything goes again
    assert not g.ack("a", 1, 0, 0)
    assert [(s.first, s.last) for s in g.plan()] == [(0, 2)]
    assert g.ack("a", 2, 0, 0)


def test_out_of_order_acks_wait_for_the_gap():
    g = _core(parts=(0,), high=4)
    g.join("a", "n1", 1, 10)
    g.plan()
    assert g.ack("a", 1, 0, 2) and g.ack("a", 1, 0, 1)
    assert g.take_commits() == []
    assert g.ack("a", 1, 0, 0)
    assert g.take_commits() == [(0, 2)]
    assert g.take_commits() == []


def test_failed_send_rewinds_and_evict_removes_member():
    g = _core(parts=(0,), high=3)
    g.join("a", "n1", 1, 10)
    g.join("b", "n1", 1, 10)
    g.plan()
    g.failed("a", 1, 0, 1)
    assert [(s.member.client_id, s.first) for s in g.plan()] == [("a", 0)]
    g.failed("a", 1, 0, 0, evict=True)
    assert "a" not in g.members
    assert [(s.member.client_id, s.first, s.last) for s in g.plan()] == [("b", 0, 2)]


def test_pruned_offsets_are_skipped():
    g = _core(parts=(0,), high=10)
    g.skipped(0, 5)
    g.join("a", "n1", 1, 10)
    assert [(s.first, s.last) for s in g.plan()] == [(6, 9)]
    assert g.take_commits() == [(0, 5)]


# -- random interleavings -----------------------------------------------------------------------------------

MEMBERS = ("a", "b", "c")
PARTS = (0, 1, 2)

op = st.one_of(
    st.tuples(st.just("join"), st.sampled_from(MEMBERS), st.integers(1, 4)),
    st.tuples(st.just("leave"), st.sampled_from(MEMBERS), st.just(0)),
    st.tuples(st.just("append"), st.sampled_from(PARTS), st.integers(1, 5)),
    st.tuples(st.just("plan"), st.just(""), st.just(0)),
    st.tuples(st.just("plan_short"), st.just(""), st.integers(1, 2)),  # the log read returned only n entries
    st.tuples(st.just("ack"), st.sampled_from(MEMBERS), st.integers(1, 6)),
    st.tuples(st.just("fail"), st.sampled_from(MEMBERS), st.just(0)),
    st.tuples(st.just("ack_one"), st.sampled_from(MEMBERS), st.integers(0, 5)),  # an acknowledgement out of order
    st.tuples(st.just("commit"), st.just(""), st.just(0)),
)


class Model:
    """Members receive their sends in order (one connection each) and acknowledge in that order (MQTT 4.6)."""

    def __init__(self, g: GroupCore) -> None:
        self.g = g
        self.gen = {m: 0 for m in MEMBERS}
        self.pipe: dict[str, list[tuple[int, int]]] = {m: [] for m in MEMBERS}  # (partition, offset) unacked
        self.acked: dict[int, set[int]] = {p: set() for p in PARTS}
        self.received: dict[int, set[int]] = {p: set() for p in PARTS}
        self.last_sent: dict[int, int] = {}
        self.written: dict[int, int] = {}

    def plan(self, short: int = 0) -> None:
        g = self.g
        before = {p: g.parts[p].committed for p in PARTS}
        for s in g.plan():
            p = s.partition
            assert s.first <= s.last
            if short and s.last - s.first + 1 > short:
                g.shorten(p, s.first + short)
                s = type(s)(s.member, p, s.first, s.first + short - 1)
            # Offset order: a send continues the previous one of its partition or restarts at the commit point.
            assert s.first == self.last_sent.get(p, -2) + 1 or s.first == before[p] + 1, (s, self.last_sent, before)
            # One owner per partition: nobody else holds messages of it that the core still counts.
            self.last_sent[p] = s.last
            m = s.member.client_id
            assert g.members[m] is s.member
            for o in range(s.first, s.last + 1):
                self.pipe[m].append((p, o))
                self.received[p].add(o)

    def ack(self, m: str, n: int) -> None:
        take, self.pipe[m] = self.pipe[m][:n], self.pipe[m][n:]
        for p, o in take:
            self.acked[p].add(o)
            self.g.ack(m, self.gen[m], p, o)

    def check(self) -> None:
        g = self.g
        for p in PARTS:
            ps = g.parts[p]
            # Rule 3: committed never passes an unacknowledged offset.
            assert all(o in self.acked[p] for o in range(0, ps.committed + 1)), (p, ps.committed)
            assert ps.committed < ps.next <= ps.high
            assert ps.inflight >= 0
            if ps.inflight:
                assert ps.owner in g.members
        for m in g.members.values():
            assert 0 <= m.inflight <= m.window
            assert m.inflight == sum(ps.inflight for ps in g.parts.values() if ps.owner == m.client_id)

    def commits(self) -> None:
        for p, c in self.g.take_commits():
            assert c > self.written.get(p, -2)
            self.written[p] = c


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(op, max_size=60))
@example([("join", "a", 4), ("append", 0, 3), ("plan", "", 0), ("ack_one", "a", 1), ("ack", "a", 9)])
@example([("join", "b", 2), ("append", 1, 4), ("plan", "", 0), ("join", "a", 1), ("leave", "b", 0), ("plan", "", 0)])
def test_any_interleaving_delivers_every_offset_in_order(ops):
    g = GroupCore("t", "g", max_inflight=3)
    for p in PARTS:
        g.open_partition(p, None, 0, 0, "earliest")
    model = Model(g)
    high = dict.fromkeys(PARTS, 0)
    for kind, who, n in ops:
        if kind == "join":
            model.gen[who] += 1
            model.pipe[who] = []  # a new connection: what the old one had in flight is gone
            g.join(who, "n", model.gen[who], n)
        elif kind == "leave":
            model.pipe[who] = []
            g.leave(who)
        elif kind == "append":
            high[who] += n
            g.appended(who, high[who])
        elif kind == "plan":
            model.plan()
        elif kind == "plan_short":
            model.plan(n)
        elif kind == "ack":
            model.ack(who, n)
        elif kind == "ack_one" and len(model.pipe[who]) > n:
            p, o = model.pipe[who].pop(n)
            model.acked[p].add(o)
            g.ack(who, model.gen[who], p, o)
        elif kind == "fail" and model.pipe[who]:
            p, o = model.pipe[who].pop(0)
            g.failed(who, model.gen[who], p, o)
        elif kind == "commit":
            model.commits()
        model.check()
    # Quiesce with one member that acknowledges everything: every offset is delivered and committed.
    model.gen["a"] += 1
    model.pipe["a"] = []
    for m in list(g.members):
        g.leave(m)
    g.join("a", "n", model.gen["a"], 2)
    for _ in range(10 * (sum(high.values()) + 1)):
        model.plan()
        model.ack("a", 100)
        model.check()
    model.commits()
    for p in PARTS:
        assert model.received[p] >= set(range(high[p]))
        assert g.parts[p].committed == high[p] - 1
        assert g.parts[p].next == high[p]
