"""Fuzz the MQTT codec: random and mutated inputs, random splits, only ProtocolError is allowed.

Strategy: work is cut into blocks of ``--block`` inputs; block ``b`` draws from
``random.Random(f"{seed}:{b}")`` so any block can be replayed alone, whatever the worker count. Each
input is either pure random bytes, or a stream of valid packets (all types, random fields) that is
then mutated: bit flips, byte overwrites, truncation, remaining-length (varint) corruption, splices
of two streams, insertions and deletions. The input is fed to a fresh :class:`PacketReader` in random
chunks, and also given to :func:`decode`. Oracles:

- any exception other than a ``ProtocolError`` subclass (or ``NeedData`` from ``decode``) is a bug;
- an unmutated stream must decode to exactly the packets it was built from;
- every decoded packet must survive ``decode(encode(p)) == p``.

On a failure the script prints the reproducer (seed, block, index, input hex, chunk sizes, traceback),
exits 1, and ``--replay HEX --chunks 3,5,...`` re-runs that single input. Output: a progress line
every ~100k inputs on stderr, then one JSON summary on stdout.

Usage: python -m scripts.fuzz_codec --iterations 1000000 --seed 1 --workers 2
"""
from __future__ import annotations

import argparse
import json
import multiprocessing
import random
import sys
import time
import traceback
from collections import Counter
from typing import Any

from fanout.mqtt.codec import PacketReader, decode, encode
from fanout.mqtt.errors import NeedData, ProtocolError
from fanout.mqtt.packets import (
    DISCONNECT, PINGREQ, PINGRESP, Connack, Connect, Packet, Puback, Pubcomp, Publish, Pubrec,
    Pubrel, Suback, Subscribe, Unsuback, Unsubscribe, Will,
)

MAX_PACKET_SIZE = 4096
_ALPHABET = "ab/$+#\u00e9\U0001F600 x"


def _text(rng: random.Random, wild: bool = True) -> str:
    chars = _ALPHABET if wild else "ab/$\u00e9\U0001F600 x"
    return "".join(rng.choice(chars) for _ in range(rng.randint(0, 8)))


def _topic(rng: random.Random) -> str:
    return _text(rng, wild=False) or "t"


def _blob(rng: random.Random) -> bytes:
    n = rng.choice((0, 1, 5, 40, 130, 300)) if rng.random() < 0.9 else rng.randint(0, 20000)
    return rng.randbytes(n)


def _pid(rng: random.Random) -> int:
    return rng.choice((1, 0xFFFF, rng.randint(1, 0xFFFF)))


def random_packet(rng: random.Random) -> Packet:
    """Build a random valid packet of any of the 14 types."""
    kind = rng.randrange(14)
    if kind == 0:
        qos = rng.randint(0, 2)
        return Publish(_topic(rng), _blob(rng), qos, rng.random() < 0.5,
                       rng.random() < 0.5 if qos else False, _pid(rng) if qos else None)
    if kind == 1:
        username = _text(rng) if rng.random() < 0.5 else None
        password = _blob(rng)[:100] if username is not None and rng.random() < 0.5 else None
        will = (Will(_topic(rng), _blob(rng)[:100], rng.randint(0, 2), rng.random() < 0.5)
                if rng.random() < 0.5 else None)
        return Connect(_text(rng), rng.random() < 0.5, rng.randint(0, 0xFFFF), username, password,
                       will)
    if kind == 2:
        code = rng.randint(0, 5)
        return Connack(code == 0 and rng.random() < 0.5, code)
    if kind in (3, 4, 5, 6, 7):
        return (Puback, Pubrec, Pubrel, Pubcomp, Unsuback)[kind - 3](_pid(rng))
    if kind == 8:
        return Subscribe(_pid(rng), tuple((_text(rng), rng.randint(0, 2))
                                          for _ in range(rng.randint(1, 4))))
    if kind == 9:
        return Suback(_pid(rng), tuple(rng.choice((0, 1, 2, 0x80)) for _ in range(rng.randint(1, 4))))
    if kind == 10:
        return Unsubscribe(_pid(rng), tuple(_text(rng) for _ in range(rng.randint(1, 4))))
    return (PINGREQ, PINGRESP, DISCONNECT)[kind - 11]


def _stream(rng: random.Random) -> tuple[bytes, list[Packet]]:
    packets = [random_packet(rng) for _ in range(rng.choice((1, 1, 2, 3, 6)))]
    return b"".join(encode(p) for p in packets), packets


def _mutate(rng: random.Random, data: bytes) -> bytes:
    buf = bytearray(data)
    for _ in range(rng.randint(1, 3)):
        op = rng.randrange(7)
        if not buf:
            buf.extend(rng.randbytes(rng.randint(1, 8)))
            continue
        i = rng.randrange(len(buf))
        if op == 0:  # bit flip
            buf[i] ^= 1 << rng.randrange(8)
        elif op == 1:  # byte overwrite, biased to interesting values
            buf[i] = rng.choice((0, 0x7F, 0x80, 0xFF, rng.randrange(256)))
        elif op == 2:  # truncation
            del buf[i:]
        elif op == 3:  # remaining-length corruption: random varint bytes after the first byte
            n = rng.randint(1, 5)
            buf[1:1 + rng.randint(0, 4)] = bytes(rng.choice((0x80, 0xFF, rng.randrange(256)))
                                                  for _ in range(n))
        elif op == 4:  # splice with another stream
            other = _stream(rng)[0]
            j = rng.randrange(len(other) + 1)
            buf[i:] = other[j:]
        elif op == 5:  # insertion
            buf[i:i] = rng.randbytes(rng.randint(1, 4))
        else:  # deletion
            del buf[i:i + rng.randint(1, 4)]
    return bytes(buf)


def make_input(rng: random.Random) -> tuple[bytes, list[Packet] | None]:
    """Return (input bytes, expected packets or None when the input is not a valid stream)."""
    r = rng.random()
    if r < 0.3:
        return rng.randbytes(rng.choice((1, 2, 4, 8, 16, 64, rng.randint(0, 300)))), None
    data, packets = _stream(rng)
    if r < 0.4:
        return data, packets
    return _mutate(rng, data), None


def random_chunks(rng: random.Random, n: int) -> list[int]:
    """Chunk sizes summing to ``n``: whole, byte at a time, or random cuts."""
    r = rng.random()
    if r < 0.2 or n == 0:
        return [n]
    if r < 0.3:
        return [1] * n
    sizes = []
    while n:
        size = min(n, rng.randint(1, max(1, n // rng.randint(1, 4))))
        sizes.append(size)
        n -= size
    return sizes


def run_one(data: bytes, chunks: list[int], expected: list[Packet] | None, counts: Counter) -> None:
    """Feed one input; raise AssertionError or the unexpected exception on a bug."""
    reader = PacketReader(max_packet_size=MAX_PACKET_SIZE if expected is None else 268_435_455)
    got: list[Packet] = []
    pos = 0
    try:
        for size in chunks:
            got.extend(reader.feed(data[pos:pos + size]))
            pos += size
        counts["need_data_leftover" if reader.buffered else "clean_end"] += 1
    except ProtocolError as exc:
        got.extend(exc.packets)
        counts[f"error.{type(exc).__name__}"] += 1
    counts["packets_decoded"] += len(got)
    if expected is not None:
        counts["valid_streams_checked"] += 1
        assert got == expected, f"valid stream decoded to {got!r}, expected {expected!r}"
    for pkt in got:
        assert decode(encode(pkt))[0] == pkt, f"re-encode round trip failed for {pkt!r}"
    try:
        decode(data, MAX_PACKET_SIZE if expected is None else 268_435_455)
        counts["decode.packet"] += 1
    except NeedData:
        counts["decode.NeedData"] += 1
    except ProtocolError as exc:
        counts[f"decode.{type(exc).__name__}"] += 1


def run_block(args: tuple[int, int, int]) -> dict[str, Any]:
    """Run one block of inputs; return counts, or a failure report."""
    seed, block, size = args
    rng = random.Random(f"{seed}:{block}")
    counts: Counter = Counter()
    for index in range(size):
        data, expected = make_input(rng)
        chunks = random_chunks(rng, len(data))
        try:
            run_one(data, chunks, expected, counts)
        except Exception:  # noqa: BLE001 - anything here is the bug being hunted
            return {"failure": {"seed": seed, "block": block, "index": index, "input_hex": data.hex(),
                                "chunks": chunks, "valid_stream": expected is not None,
                                "traceback": traceback.format_exc()}}
    return {"counts": dict(counts), "n": size}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m scripts.fuzz_codec", description=__doc__.split("\n")[0])
    parser.add_argument("--iterations", type=int, default=100_000)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--workers", type=int, default=1)
    parser.add_argument("--block", type=int, default=5_000, help="inputs per work unit")
    parser.add_argument("--replay", metavar="HEX", help="re-run one input given as hex")
    parser.add_argument("--chunks", default="", help="comma-separated chunk sizes for --replay")
    args = parser.parse_args(argv)

    if args.replay is not None:
        data = bytes.fromhex(args.replay)
        chunks = [int(c) for c in args.chunks.split(",") if c] or [len(data)]
        counts: Counter = Counter()
        run_one(data, chunks, None, counts)  # raises with a traceback on the bug
        print(json.dumps(dict(counts), sort_keys=True))
        return 0

    blocks = [(args.seed, b, min(args.block, args.iterations - b * args.block))
              for b in range((args.iterations + args.block - 1) // args.block)]
    total: Counter = Counter()
    done = 0
    next_report = 100_000
    start = time.perf_counter()
    pool = multiprocessing.Pool(args.workers) if args.workers > 1 else None
    results = pool.imap_unordered(run_block, blocks) if pool else map(run_block, blocks)
    try:
        for result in results:
            if "failure" in result:
                failure = result["failure"]
                print("FAILURE: exception other than ProtocolError (or oracle mismatch)",
                      file=sys.stderr)
                print(failure["traceback"], file=sys.stderr)
                print(json.dumps({k: v for k, v in failure.items() if k != "traceback"}),
                      file=sys.stderr)
                print(f"reproduce: python -m scripts.fuzz_codec --replay {failure['input_hex']} "
                      f"--chunks {','.join(map(str, failure['chunks']))}", file=sys.stderr)
                return 1
            total.update(result["counts"])
            done += result["n"]
            if done >= next_report:
                elapsed = time.perf_counter() - start
                print(f"progress: {done} inputs, {elapsed:.1f} s, {done / elapsed:,.0f} inputs/s",
                      file=sys.stderr, flush=True)
                next_report += 100_000
    finally:
        if pool:
            pool.terminate()
            pool.join()
    seconds = time.perf_counter() - start
    summary = {"iterations": done, "seed": args.seed, "workers": args.workers,
               "seconds": round(seconds, 2), "inputs_per_s": round(done / seconds),
               "outcomes": dict(sorted(total.items()))}
    print(json.dumps(summary, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
