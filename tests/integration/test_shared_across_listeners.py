"""MQTT 5 shared subscriptions across two connection nodes (``mqtt.listeners_per_node = 2``, one port): each
message of a group reaches exactly one member in the whole cluster (fanout.mqtt.shared rules 1-3), with
paho-mqtt speaking MQTT 5.
"""
from __future__ import annotations

import queue
import time
from collections import Counter

import pytest

from .fanout_harness import fanout_config, running_cluster, spread_over_listeners, wait_until
from .test_mqtt5_clients import Paho5, opts

pytestmark = pytest.mark.timeout(240)

GROUP = "$share/work/jobs/#"


@pytest.fixture(scope="module")
def fanout(ray_local, tmp_path_factory):
    cfg = fanout_config(tmp_path_factory.mktemp("shared")).replace("mqtt", listeners_per_node=2)
    with running_cluster(cfg) as cluster:
        yield cluster


def _node_stats(fanout) -> list[dict]:
    return fanout.status()["nodes"]


def test_200_qos1_messages_reach_one_member_of_the_group_exactly_once_across_listeners(fanout):
    members: list[Paho5] = []
    pub = Paho5("share-pub")
    received: dict[str, list[bytes]] = {}

    def add_member() -> None:
        m = Paho5(f"share-m{len(members)}")
        members.append(m)
        received[m.client_id] = []
        m.connect(fanout.port)
        assert m.subscribe((GROUP, opts(1))) == [1]

    def collect() -> None:
        for m in members:
            while True:
                try:
                    received[m.client_id].append(m.messages.get_nowait().payload)
                except queue.Empty:
                    break

    try:
        # Up to 32 members until both listeners have one; the round-robin over members still serves each of them
        # several of the 200 messages.
        by_node = spread_over_listeners(fanout, members, add_member, at_least=8)
        assert len(by_node) == 2 and all(n > 0 for n in by_node.values()), by_node
        pub.connect(fanout.port)

        def every_member_got_a_warm_up() -> bool:  # the publisher's node knows the other node's members
            pub.publish("jobs/warm", b"warm-up", 1)
            collect()
            return all(received.values())

        wait_until(every_member_got_a_warm_up, 30, "group announcements between the listeners", interval=0.05)
        n = 200
        for i in range(n):
            assert pub.publish("jobs/x", b"m-%d" % i, 1) == 0
        expected = Counter(b"m-%d" % i for i in range(n))

        def got() -> Counter:
            collect()
            return Counter(p for ps in received.values() for p in ps if p != b"warm-up")

        wait_until(lambda: got().keys() >= expected.keys(), 30, "every message delivered")
        time.sleep(1.0)  # a duplicate would arrive within this
        assert got() == expected  # each message exactly once in the whole group
        counts = {cid: sum(p != b"warm-up" for p in ps) for cid, ps in received.items()}
        assert all(counts.values()), counts  # members on both nodes served (weighted by member count)
        stats = _node_stats(fanout)
        assert sum(s["shared_placed_away"] for s in stats) > 0 and sum(s["shared_orphaned"] for s in stats) == 0
    finally:
        for c in (*members, pub):
            c.close()
