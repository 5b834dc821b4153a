"""Consumer groups end to end without Ray or sockets: the node core's broker with MQTT 5 and 3.1.1 members, the
dispatcher cores over real LMDB shards holding a durable topic's log, commits written with the store's
WriteBatch verbs (the harness plays both actors, as tests/unit/test_node_core.py does)."""
from __future__ import annotations

import pytest

from fanout.mqtt.packets import Puback
from fanout.mqtt.packets5 import Puback5, Subscribe5, Subscription
from fanout.mqtt.properties import Properties
from storage import WriteBatch
from storage.topics import TopicSpec

from .test_node_core import Client, Cluster
from .test_node_mqtt5 import Client5

TOPIC = "responses"
FILTER = "ecp/+/response"
SHARDS = 2


def new_cluster(path) -> Cluster:
    c = Cluster(path, shards=SHARDS)
    c.edge.groups.set_filters({FILTER})
    for store in c.stores:
        if TOPIC not in store.topic_specs():
            store.apply(WriteBatch().create_topic(TopicSpec.build(TOPIC, FILTER), 1))
    return c


@pytest.fixture
def c(tmp_path):
    cluster = new_cluster(tmp_path)
    yield cluster
    cluster.close()


def append(c: Cluster, partition: int, n: int, first: int = 0) -> None:
    entries = [(f"ecp/V{partition}/response", f"V{partition}", 1, f"{partition}:{first + i}".encode(), None)
               for i in range(n)]
    c.stores[partition % SHARDS].apply(WriteBatch().topic_append(TOPIC, partition, 1000, entries))


def pump(c: Cluster, rounds: int = 10) -> None:
    """Events to the dispatchers, their group sends to the node, their commits to the stores, until quiet."""
    for _ in range(rounds):
        moved = False
        c.flush()
        for shard, events in c.edge.take_events().items():
            c.cores[shard].apply_events(c.node_id, events)
            moved = True
        for core in c.cores:
            core.drain(c.now)
            for node in core.nodes_with_output():
                batch = core.take_node_batch(node)
                c.edge.apply_deliveries(*batch[:4])
                if len(batch) > 4:
                    c.edge.deliver_groups(batch[4])
                moved = True
            taken = core.topic_groups.commit_batch(c.now)
            if taken is not None:
                core.store.apply(taken[0])
                moved = True
        c.flush()
        if not moved:
            return


def member5(c: Cluster, cid: str, start: str | None = None) -> Client5:
    m = Client5(c, cid)
    props = Properties(user_properties=(("start", start),)) if start else Properties()
    m.send(Subscribe5(1, (Subscription(f"$share/g/{FILTER}", 1),), props))
    m.inbox.clear()
    return m


def member3(c: Cluster, cid: str) -> Client:
    m = Client(c, cid)
    m.subscribe(f"$share/g/{FILTER}")
    return m


def received(m: Client) -> list[tuple[int, int, int]]:
    """(partition, offset, packet id) of the PUBLISHes waiting in ``m``'s inbox (taken out)."""
    out = []
    for p in (m.publishes5() if isinstance(m, Client5) else m.publishes()):
        part, off = p.payload.decode().split(":")
        out.append((int(part), int(off), p.packet_id))
    return out


def committed(c: Cluster, partition: int) -> int | None:
    return c.stores[partition % SHARDS].topic_committed(TOPIC, "g", partition)


def test_members_share_partitions_in_order_and_pubacks_commit(c):
    append(c, 0, 3)
    append(c, 1, 3)
    a = member5(c, "a", start="earliest")
    b = member3(c, "b")
    pump(c)
    got_a, got_b = received(a), received(b)
    # sorted members [a, b]: a serves partition 0, b partition 1; each in offset order
    assert [(p, o) for p, o, _ in got_a] == [(0, 0), (0, 1), (0, 2)]
    assert [(p, o) for p, o, _ in got_b] == [(1, 0), (1, 1), (1, 2)]
    for _p, _o, pid in got_a:
        a.send(Puback5(pid))
    for _p, _o, pid in got_b:
        b.send(Puback(pid))
    pump(c)
    assert (committed(c, 0), committed(c, 1)) == (2, 2)


def test_new_group_starts_at_latest(c):
    append(c, 0, 2)
    a = member5(c, "a")
    pump(c)
    assert received(a) == []
    assert committed(c, 0) == 1  # the starting position is committed at once
    append(c, 0, 1, first=2)
    pump(c)
    assert [(p, o) for p, o, _ in received(a)] == [(0, 2)]


def test_unacked_messages_of_a_departed_member_go_to_the_other(c):
    append(c, 0, 4)
    a = member5(c, "a", start="earliest")
    pump(c)
    got = received(a)
    assert [o for _p, o, _ in got] == [0, 1, 2, 3]
    a.send(Puback5(got[0][2]))  # only offset 0 acknowledged
    pump(c)
    b = member3(c, "b")
    pump(c)
    a.drop()
    pump(c)
    partitions_b = [(p, o) for p, o, _ in received(b)]
    assert partitions_b == [(0, 1), (0, 2), (0, 3)]  # from committed + 1, in order
    assert committed(c, 0) == 0


def test_position_survives_a_restart(tmp_path):
    c = new_cluster(tmp_path)
    append(c, 1, 5)
    a = member3(c, "a")
    pump(c)  # latest: nothing yet, position 4 committed
    append(c, 1, 2, first=5)
    pump(c)
    got = received(a)
    assert [(p, o) for p, o, _ in got] == [(1, 5), (1, 6)]
    a.send(Puback(got[0][2]))
    pump(c)
    c.close()
    c = new_cluster(tmp_path)
    try:
        b = member5(c, "b", start="earliest")  # the group has commits: start does not apply
        pump(c)
        assert [(p, o) for p, o, _ in received(b)] == [(1, 6)]
    finally:
        c.close()


def test_explicit_commit_moves_a_served_group(c):
    from fanout.request_control import encode_topic_ack
    append(c, 0, 5)
    a = member5(c, "a", start="earliest")
    pump(c)
    assert len(received(a)) == 5
    core = c.cores[0]
    op = encode_topic_ack(TOPIC, "g", 0, 3)
    batch, answer = core.topic_groups.explicit_commit(op, c.now)
    assert answer is None
    core.store.apply(batch)
    assert core.topic_groups.explicit_committed(op) == {"committed": 3}
    assert c.cores[1].topic_groups.explicit_commit(op, c.now) == (None, None)  # not its partition
    assert core.topic_groups.explicit_commit(encode_topic_ack("nope", "g", 0, 1), c.now)[1]["error"]


def test_group_and_member_bounds_are_counted(c):
    from fanout.topics.groups_records import GroupJoin
    g = c.cores[0].topic_groups
    g.max_groups, g.max_members = 1, 2
    for cid, group in (("a", "one"), ("b", "one"), ("c", "one"), ("d", "two")):
        g.on_event("n0", GroupJoin.build(cid, 1, group, FILTER, 8, "latest"))
    assert list(g.groups) == [(TOPIC, "one")]
    assert sorted(g.groups[(TOPIC, "one")].members) == ["a", "b"]
    assert g.stats()["group_refused"] == 2
    g.on_event("n0", GroupJoin.build("e", 1, "x", "no/such/+", 8, "latest"))  # not a durable filter: nothing
    assert list(g.groups) == [(TOPIC, "one")]
