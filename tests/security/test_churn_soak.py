"""Soak: 100,000 client ids churned through a node leave its memory (and its dispatchers') where it was.

Was: 60,000 distinct client ids that connect, subscribe and leave kept +16 MiB in the dispatchers for good
(per-VIN state never pruned, ~240 B per id). tests/unit/test_state_churn.py asserts the per-id tables come
back to zero; this asserts the memory itself does.

What runs: the node (broker core + NodeCore) and two DispatcherCores over LMDB shards in this process, the
way the hot-path benchmark runs them, each client id going through the broker's full path (CONNECT bytes,
SUBSCRIBE, a heartbeat for a third of them, the connection lost), the events shipped to the dispatchers
every 1,000 ids. In production the two sides are separate processes; here one counter sees both.

What is measured, and why: ``sys.getallocatedblocks()``, the number of live objects' memory blocks of the
interpreter's small-object allocator, where every per-id record lives (dict entries, tuples, strings,
slotted objects), after ``gc.collect()``. It is exact and costs nothing while the churn runs, so 100,000 ids
fit in the test's time. RSS is not asserted: the allocator keeps freed arenas and pages at its discretion
(measured here: +6 MiB of RSS for a 1-block-per-id leak over 100,000 ids, within what a bound on RSS would
have to allow for allocator noise). tracemalloc is not used either: it made the churn 6x slower, and a
window traced after the warm-up sees new entries of bounded structures but not the old ones they replace.

Bounded structures that legitimately hold per-id entries are filled before the baseline or kept small:
the dispatchers' generation fences (16,384 per shard, filled by the warm-up) and the ACL's decision caches
(configured to 256 entries here; their default bound is 65,536 entries, which a churn of 100,000 ids with
heartbeats fills to about a third and would read as growth).
"""
from __future__ import annotations

import gc
import logging
import sys
import time

import psutil
import pytest
import structlog

from fanout.config import mqtt_settings
from fanout.dispatcher.machine import FENCE_SIZE
from fanout.mqtt.auth import AccessControl
from fanout.mqtt.broker import Broker
from tests.unit.test_node_core import Cluster
from tests.unit.test_state_churn import broker_churn, per_id_state

pytestmark = pytest.mark.timeout(300)

WARMUP = 45_000  # fills the fences: 4 of 5 ids are VINs, spread over 2 shards (> 2 x 16,384)
CHURN = 100_000
# Blocks the churn may leave behind: what the bounded caches hold at the end (the ACL's 256-entry caches,
# ~3 blocks an entry) and allocator bookkeeping. A leak of one object per 50 ids is 2,000 blocks.
MAX_BLOCKS = 2_000


@pytest.fixture
def quiet_logs():
    """Connection logs at warning: 145,000 connects logged at info cost more than the churn."""
    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.WARNING))
    yield
    structlog.reset_defaults()


def _node_with_small_caches(tmp_path) -> Cluster:
    c = Cluster(tmp_path)
    settings = mqtt_settings(c.cfg)
    acl = AccessControl(settings, listener_is_loopback=True, decision_cache_size=256)
    c.broker = Broker(settings, acl, c.edge, now_ms=c.now)
    c.edge.attach(c.broker)
    return c


def _blocks() -> int:
    gc.collect()
    return sys.getallocatedblocks()


async def test_100k_client_ids_return_node_and_dispatcher_memory_to_baseline(tmp_path, quiet_logs):
    c = _node_with_small_caches(tmp_path)
    rss = psutil.Process()
    try:
        await broker_churn(c, 0, WARMUP)
        assert all(core.stats()["fenced"] == FENCE_SIZE for core in c.cores)
        counts = per_id_state(c)
        assert set(counts.values()) == {0}
        base, base_rss = _blocks(), rss.memory_info().rss
        started = time.perf_counter()
        marks = []
        for first in range(WARMUP, WARMUP + CHURN, CHURN // 4):
            await broker_churn(c, first, first + CHURN // 4)
            marks.append(_blocks() - base)
        took = time.perf_counter() - started
        grown = marks[-1]
        print(f"\n{CHURN} client ids in {took:.1f} s: allocated blocks {grown:+d} over the baseline "
              f"(after each quarter: {marks}), RSS {(rss.memory_info().rss - base_rss) / 2**20:+.1f} MiB")
        assert per_id_state(c) == counts
        assert c.broker.sessions == {}
        assert grown < MAX_BLOCKS, f"{grown} blocks more after {CHURN} client ids (each quarter: {marks})"
    finally:
        c.close()
