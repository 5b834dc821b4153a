"""The node side of durable appends alone, for A/B runs on a loaded machine: the broker core and NodeCore with the
durable topic ``responses`` (``ecp/+/response``), fed what topics_bench's publishers send (4 connections, QoS 1,
1 KB, round robin over 1,000 ``ecp/<VIN>/response`` topics, ``window`` publishes per connection per read),
each shard's batch handed to a link that packs it as the actor's ``topic_append`` call does and succeeds, the
PUBACKs flushed. Prints process-CPU µs per appended message; no sockets, no Ray, no store.

    python -m benchmarks.append_side_bench LABEL MESSAGES [WINDOW] [--profile]

Deterministic under load: instructions per message from two runs under callgrind,
``(Ir(2N) - Ir(N)) / N`` (the set-up cancels out)::

    valgrind --tool=callgrind --callgrind-out-file=/dev/null python -m benchmarks.append_side_bench x 8192
    valgrind --tool=callgrind --callgrind-out-file=/dev/null python -m benchmarks.append_side_bench x 16384
"""
from __future__ import annotations

import asyncio
import dataclasses
import sys
import time

from benchmarks.hotpath_bench import _Peer, start_measuring, stop_measuring
from fanout import log as fanout_log
from fanout.config import load_config, mqtt_settings
from fanout.mqtt.auth import AccessControl
from fanout.mqtt.broker import Broker
from fanout.mqtt.codec import encode
from fanout.mqtt.packets import Connect, Publish
from fanout.node.core import NodeCore
from fanout.records import pack_batch
from storage.topics import TopicSpec

PUBLISHERS = 4
TOPICS = [f"ecp/BENCH{i:012d}/response" for i in range(1000)]


class _AppendLink:
    """What the node's dispatcher link costs for an append: ``pack_batch`` of the items (the call itself and the
    dispatcher are not measured here)."""

    shards = 2

    async def topic_append(self, shard: int, items: list[tuple]) -> int:
        pack_batch(items)
        return len(items)


async def run(messages: int, window: int = 64, profile: bool = False) -> float:
    """CPU µs per appended message (every one acknowledged, else RuntimeError)."""
    cfg = load_config(None, env={}).replace("mqtt", sys_interval="0s")
    cfg = dataclasses.replace(cfg, topics=(TopicSpec.build("responses", "ecp/+/response"),))
    edge = NodeCore(cfg, "n0", _AppendLink())
    settings = mqtt_settings(cfg)
    broker = Broker(settings, AccessControl(settings, listener_is_loopback=True), edge, now_ms=1)
    edge.attach(broker)
    publishers = []
    for i in range(PUBLISHERS):
        conn = broker.connection_made(1, ("127.0.0.1", 40000 + i))
        conn.transport = _Peer()  # hotpath_bench's fake vehicle transport
        broker.data_received(conn, encode(Connect(f"pub{i}", True, 60, None, None, None)), 1)
        publishers.append(conn)
    broker.flush()
    edge.take_events()
    payload = b"x" * 1024
    next_id = [1] * PUBLISHERS

    def read_buffer(k: int) -> bytes:
        out = []
        for _ in range(window):
            pid = next_id[k]
            out.append(encode(Publish(TOPICS[(pid * 7 + k) % len(TOPICS)], payload, 1, False, False, pid)))
            next_id[k] = pid % 65535 + 1
        return b"".join(out)

    rounds = messages // (PUBLISHERS * window)
    reads = [[read_buffer(k) for k in range(PUBLISHERS)] for _ in range(min(rounds, 50))]
    prof = start_measuring(profile)
    acks = 0
    started = time.process_time()
    for r in range(rounds):
        for k, conn in enumerate(publishers):
            broker.data_received(conn, reads[r % len(reads)][k], 1)
        broker.flush()
        while edge.appends.has_work():
            for batch in edge.appends.take():
                await edge.append(batch)
        for _conn, data in broker.flush():
            acks += len(data) // 4  # PUBACKs are 4 bytes
        edge.take_events()
    took = time.process_time() - started
    stop_measuring(prof, 30)
    sent = rounds * PUBLISHERS * window
    if acks != sent:
        raise RuntimeError(f"{acks} PUBACKs for {sent} publishes")
    return took / sent * 1e6


def main() -> None:
    args = [a for a in sys.argv[1:] if a != "--profile"]
    label, messages = args[0], int(args[1])
    window = int(args[2]) if len(args) > 2 else 64
    fanout_log.configure(level="warning", cache=True)  # as the benchmark cluster's actors run
    print(label, messages, window, "node", round(asyncio.run(run(messages, window, "--profile" in sys.argv)), 2))


if __name__ == "__main__":
    main()
