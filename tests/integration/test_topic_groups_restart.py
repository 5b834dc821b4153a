"""A consumer group's position across a whole-cluster restart (its own cluster: the module cluster of
test_topic_groups.py holds the node resource while it runs)."""
from __future__ import annotations

import dataclasses

import pytest

from .fanout_harness import fanout_config, running_cluster, wait_until
from .test_topic_groups import RESPONSES, Member, publish, settle, vins_of_partition

pytestmark = pytest.mark.timeout(300)


def test_group_position_survives_a_cluster_restart(ray_local, tmp_path):
    cfg = dataclasses.replace(fanout_config(tmp_path), topics=(RESPONSES,))
    vin = vins_of_partition(0, 1, "RS")[0]
    with running_cluster(cfg) as cluster:
        m = Member(cluster.port, "restart", v5=True, start="earliest", client_id="restart-a")
        try:
            settle()
            publish(cluster.port, vin, [b"r1", b"r2"])
            wait_until(lambda: len(m.got) == 2, 30, "both delivered")
            settle(0.5)  # committed
        finally:
            m.close()
        publish(cluster.port, vin, [b"r3"])
    with running_cluster(cfg) as cluster:
        m = Member(cluster.port, "restart", v5=True, start="earliest", client_id="restart-b")
        try:
            wait_until(lambda: [p for _t, p in m.got] == [b"r3"], 30, "only what was not acknowledged")
        finally:
            m.close()
