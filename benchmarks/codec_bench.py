"""CPU cost of the sans-I/O codec per PUBLISH: encode and decode, MQTT 3.1.1 and (when present) MQTT 5.

What it measures: µs per operation of the functions the broker calls for every message (the fast
encoders and :class:`PacketReader.feed`): process CPU time, best of ``--repeat`` runs, so that other
load on this shared machine inflates the figure as little as possible. The message is a fanout delivery: QoS 1,
topic ``agent/<VIN>/proxy/request/<request id>``, 100-byte payload; ``feed xN`` feeds N packets in one
chunk (what a busy connection's read returns) and reports the cost per packet.

    python -m benchmarks.codec_bench [--repeat 7] [--number 20000] [--write]
"""
from __future__ import annotations

import argparse
import json
import os
import time
import timeit
from typing import Any, Callable

from fanout.mqtt.codec import PacketReader, decode, encode, encode_publish
from fanout.mqtt.packets import Publish

TOPIC = "agent/WVWZZZ1JZ3W386752/proxy/request/req-0001"
PAYLOAD = bytes(range(100))
BATCH = 50


def _best_us(fn: Callable[[], Any], number: int, repeat: int, per: int = 1) -> float:
    # CPU time of this process, not wall time: other helpers load this machine's two cores.
    times = timeit.repeat(fn, number=number, repeat=repeat, timer=time.process_time)
    return round(min(times) / number / per * 1e6, 3)


def _reader_cases(name: str, packet_bytes: bytes, make_reader: Callable[[], PacketReader],
                  number: int, repeat: int) -> dict[str, float]:
    reader = make_reader()
    feed = reader.feed
    chunk = packet_bytes * BATCH
    assert len(feed(chunk)) == BATCH
    return {
        f"{name} feed x1": _best_us(lambda: feed(packet_bytes), number, repeat),
        f"{name} feed x{BATCH}": _best_us(lambda: feed(chunk), number // BATCH, repeat, BATCH),
    }


def measure_311(number: int, repeat: int) -> dict[str, float]:
    """µs per operation for MQTT 3.1.1."""
    pkt = Publish(TOPIC, PAYLOAD, 1, False, False, 7)
    data = encode(pkt)
    topic_bytes = TOPIC.encode()
    out = {
        "3.1.1 encode_publish": _best_us(
            lambda: encode_publish(TOPIC, PAYLOAD, 1, False, False, 7), number, repeat),
        "3.1.1 encode_publish (topic bytes)": _best_us(
            lambda: encode_publish(topic_bytes, PAYLOAD, 1, False, False, 7), number, repeat),
        "3.1.1 encode(Publish)": _best_us(lambda: encode(pkt), number, repeat),
        "3.1.1 decode": _best_us(lambda: decode(data), number, repeat),
    }
    out.update(_reader_cases("3.1.1", data, PacketReader, number, repeat))
    return out


def measure_5(number: int, repeat: int) -> dict[str, float]:
    """µs per operation for MQTT 5, without and with properties (empty if the codec has no MQTT 5)."""
    try:
        from fanout.mqtt.encoder5 import encode_publish5
        from fanout.mqtt.packets5 import Publish5
        from fanout.mqtt.properties import Properties
        from fanout.mqtt.property_block import encode_properties_body
    except ImportError:
        return {}
    props = Properties(message_expiry_interval=3600, content_type="application/octet-stream",
                       user_properties=(("trace-id", "4bf92f3577b34da6"), ("campaign", "c-17")))
    props_body = encode_properties_body(props)
    bare = Publish5(TOPIC, PAYLOAD, 1, False, False, 7)
    rich = Publish5(TOPIC, PAYLOAD, 1, False, False, 7, props)
    bare_bytes, rich_bytes = encode(bare), encode(rich)
    out = {
        "5 encode_publish5": _best_us(
            lambda: encode_publish5(TOPIC, PAYLOAD, 1, False, False, 7), number, repeat),
        "5 encode_publish5 (props bytes)": _best_us(
            lambda: encode_publish5(TOPIC, PAYLOAD, 1, False, False, 7, props_body), number, repeat),
        "5 encode(Publish5)": _best_us(lambda: encode(bare), number, repeat),
        "5 encode(Publish5 props)": _best_us(lambda: encode(rich), number, repeat),
        "5 decode": _best_us(lambda: decode(bare_bytes, protocol_level=5), number, repeat),
        "5 decode (props)": _best_us(lambda: decode(rich_bytes, protocol_level=5), number, repeat),
    }
    out.update(_reader_cases("5", bare_bytes, lambda: PacketReader(protocol_level=5), number,
                             repeat))
    out.update(_reader_cases("5 props", rich_bytes, lambda: PacketReader(protocol_level=5), number,
                             repeat))
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--repeat", type=int, default=7)
    parser.add_argument("--number", type=int, default=20_000)
    parser.add_argument("--write", action="store_true", help="write benchmarks/results/codec_bench.json")
    args = parser.parse_args(argv)
    result: dict[str, Any] = {"unit": "us per packet", "repeat": args.repeat, "number": args.number,
                              "topic": TOPIC, "payload_bytes": len(PAYLOAD)}
    result["us"] = {**measure_311(args.number, args.repeat), **measure_5(args.number, args.repeat)}
    result["loadavg"] = [round(x, 2) for x in os.getloadavg()]  # other work on the shared machine
    if args.write:
        from benchmarks.common import write_result

        write_result("codec_bench", result)
    print(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
