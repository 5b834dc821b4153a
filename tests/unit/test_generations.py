"""Connection generations without a wall clock: incarnation + counter, compared within an incarnation by
counter and across incarnations by arrival (the dispatcher side)."""
from __future__ import annotations

import pytest

from fanout.dispatcher.core import DispatcherCore
from fanout.generations import COUNTER_BITS, GenerationClock, incarnation_of, newer
from fanout.records import ConnectEvent, DisconnectEvent, HeartbeatEvent, SubscribedEvent
from storage import ShardStore, WriteBatch


def gen(incarnation: int, counter: int) -> int:
    return incarnation << COUNTER_BITS | counter


def test_a_clock_counts_within_its_incarnation():
    c = GenerationClock(incarnation=9)
    gens = [c.next() for _ in range(3)]
    assert gens == [gen(9, 1), gen(9, 2), gen(9, 3)]
    assert {incarnation_of(g) for g in gens} == {9}
    assert newer(gens[2], gens[1]) and not newer(gens[1], gens[2]) and not newer(gens[1], gens[1])


def test_clocks_draw_random_incarnations_and_a_full_counter_draws_a_new_one():
    assert len({GenerationClock().incarnation for _ in range(50)}) > 45
    c = GenerationClock(incarnation=9)
    c._counter = (1 << COUNTER_BITS) - 2
    last = c.next()
    assert incarnation_of(last) == 9
    rolled = c.next()
    assert incarnation_of(rolled) != 9 and rolled & ((1 << COUNTER_BITS) - 1) == 1
    assert newer(rolled, last)  # another incarnation: newer by arrival
    assert rolled < 1 << 63


@pytest.fixture
def core(tmp_path):
    store = ShardStore(tmp_path / "shard-0", 0, sync=False)
    store.apply(WriteBatch().put_blob("d1", b"B", 1).enqueue_many(["V1"], 2, "r1", "d1"))
    yield DispatcherCore(store, 0, 1, started_ms=0)
    store.close()


def test_a_node_restarted_with_lower_generations_is_not_fenced(core):
    """The wall-clock generations of a node restarted with its clock stepped back were smaller than the
    ones the dispatcher had seen from it: its vehicles were fenced as stale and never served."""
    before, after = gen(7, 2000), gen(3, 5)  # the restarted node's numbers are lower
    core.apply_events("n0", [ConnectEvent.build("V1", before, False, False, None), DisconnectEvent.build("V1", before)])
    core.apply_events("n0", [ConnectEvent.build("V1", after, False, False, None),
                             SubscribedEvent.build("V1", after, True, None), HeartbeatEvent.build("V1", after)])
    core.drain(10)
    assert [s[:2] for s in core.take_node_batch("n0")[0]] == [("V1", after)]


def test_within_a_node_an_older_connect_is_stale_and_an_unseen_newer_disconnect_fences_it(core):
    core.apply_events("n0", [ConnectEvent.build("V1", gen(7, 5), False, False, None)])
    core.apply_events("n0", [ConnectEvent.build("V1", gen(7, 4), False, False, None)])
    assert core.vd.vehicle("V1").generation == gen(7, 5)
    core.apply_events("n0", [DisconnectEvent.build("V1", gen(7, 9))])  # its connect was lost
    core.apply_events("n0", [ConnectEvent.build("V1", gen(7, 9), False, False, None)])
    assert core.vd.vehicle("V1") is None or core.vd.vehicle("V1").node is None


def test_across_nodes_the_connect_reported_last_takes_over_and_the_other_is_kicked(core):
    a, b = gen(100, 1), gen(5, 1)  # numerically b < a: across nodes the numbers carry no order
    core.apply_events("A", [ConnectEvent.build("V1", a, False, False, None)])
    core.apply_events("B", [ConnectEvent.build("V1", b, False, False, None)])
    assert core.vd.vehicle("V1").node == "B"
    assert core.take_node_batch("A") == ([], {}, [("V1", a)], None)
    core.apply_events("A", [DisconnectEvent.build("V1", a)])  # the kicked connection's disconnect is stale
    assert core.vd.vehicle("V1").node == "B"
