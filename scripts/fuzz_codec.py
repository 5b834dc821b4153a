"""Fuzz the MQTT codec (3.1.1 and 5.0): random and mutated inputs, random splits, only ProtocolError.

Strategy: work is cut into blocks of ``--block`` inputs; block ``b`` draws from
``random.Random(f"{seed}:{b}")`` so any block can be replayed alone, whatever the worker count. Each
input picks a protocol level for the reader: 4 (MQTT 3.1.1), 5 (MQTT 5), or negotiate (``None``: a
server before the CONNECT; the stream then starts with a CONNECT of either level). The input is either
pure random bytes, or a stream of valid packets of that level (all types, random fields, MQTT 5 packets
with random properties of every kind allowed in them) that is then mutated: bit flips, byte
overwrites, truncation, remaining-length (varint) corruption, splices of two streams, insertions and
deletions. The input is fed to a fresh :class:`PacketReader` in random chunks, and also given to
:func:`decode`. Oracles:

- any exception other than a ``ProtocolError`` subclass (or ``NeedData`` from ``decode``) is a bug,
  and so is a ``reason_code`` other than 0x81, 0x82, 0x84, 0x94, 0x95 (what a codec error may answer);
- an unmutated stream must decode to exactly the packets it was built from;
- every decoded packet must survive ``decode(encode(p)) == p`` at its own protocol level.

On a failure the script prints the reproducer (seed, block, index, level, input hex, chunk sizes,
traceback), exits 1, and ``--replay HEX --chunks 3,5,... --level 5`` re-runs that single input.
Output: a progress line every ~100k inputs on stderr, then one JSON summary on stdout.

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
from fanout.mqtt.packets5 import (  # noqa: E402
    Auth5, Connack5, Connect5, Disconnect5, Puback5, Pubcomp5, Publish5, Pubrec5, Pubrel5, Suback5,
    Subscribe5, Subscription, Unsuback5, Unsubscribe5, Will5,
)
from fanout.mqtt.properties import (  # noqa: E402
    PROPERTY_SPECS, DataType, Properties, PropertyHolder, ValueRule,
)
from fanout.mqtt.reason_codes import (  # noqa: E402
    AUTH_REASON_CODES, CONNACK_REASON_CODES, DISCONNECT_REASON_CODES, PUBACK_REASON_CODES,
    PUBCOMP_REASON_CODES, PUBREC_REASON_CODES, PUBREL_REASON_CODES, SUBACK_REASON_CODES,
    UNSUBACK_REASON_CODES,
)

MAX_PACKET_SIZE = 4096
LEVELS = (4, 5, None)
# What a codec error may answer in CONNACK/DISCONNECT: malformed, protocol error, unsupported protocol
# version, topic alias invalid, packet too large.
CODEC_REASON_CODES = frozenset((0x81, 0x82, 0x84, 0x94, 0x95))
V5_TYPES = frozenset((Connect5, Connack5, Publish5, Puback5, Pubrec5, Pubrel5, Pubcomp5, Subscribe5,
                      Suback5, Unsubscribe5, Unsuback5, Disconnect5, Auth5))
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


def _value(rng: random.Random, spec: Any, holder: PropertyHolder) -> Any:
    dt = spec.data_type
    if dt is DataType.BYTE:
        return rng.randint(0, 1)
    if dt in (DataType.TWO_BYTE_INTEGER, DataType.FOUR_BYTE_INTEGER):
        top = 0xFFFF if dt is DataType.TWO_BYTE_INTEGER else 0xFFFF_FFFF
        low = 1 if spec.rule is ValueRule.NOT_ZERO else 0
        return rng.choice((low, top, rng.randint(low, top)))
    if dt is DataType.VARIABLE_BYTE_INTEGER:
        count = rng.randint(1, 3) if holder in spec.repeat_in else 1
        return tuple(rng.choice((1, 127, 128, 16384, 268_435_455, rng.randint(1, 268_435_455)))
                     for _ in range(count))
    if dt is DataType.UTF8_STRING:
        return _topic(rng) if spec.rule is ValueRule.TOPIC_NAME else _text(rng)
    if dt is DataType.BINARY_DATA:
        return _blob(rng)[:50]
    return tuple((_text(rng), _text(rng)) for _ in range(rng.randint(1, 3)))


def random_properties(rng: random.Random, holder: PropertyHolder) -> Properties:
    """Random valid properties for ``holder``: none half of the time, else a random subset."""
    if rng.random() < 0.5:
        return Properties()
    specs = [s for s in PROPERTY_SPECS if holder in s.holders]
    values = {s.name: _value(rng, s, holder) for s in rng.sample(specs, rng.randint(1, len(specs)))}
    if "authentication_data" in values:
        values.setdefault("authentication_method", _text(rng))
    return Properties(**values)


def random_packet5(rng: random.Random) -> Any:
    """Build a random valid MQTT 5 packet of any of the 15 types."""
    kind = rng.randrange(15)
    h = PropertyHolder
    if kind == 0:
        qos = rng.randint(0, 2)
        props = random_properties(rng, h.PUBLISH)
        topic = "" if props.topic_alias is not None and rng.random() < 0.5 else _topic(rng)
        return Publish5(topic, _blob(rng), qos, rng.random() < 0.5,
                        rng.random() < 0.5 if qos else False, _pid(rng) if qos else None, props)
    if kind == 1:
        will = (Will5(_topic(rng), _blob(rng)[:100], rng.randint(0, 2), rng.random() < 0.5,
                      random_properties(rng, h.WILL)) if rng.random() < 0.5 else None)
        return Connect5(_text(rng), rng.random() < 0.5, rng.randint(0, 0xFFFF),
                        _text(rng) if rng.random() < 0.5 else None,
                        _blob(rng)[:100] if rng.random() < 0.5 else None, will,
                        random_properties(rng, h.CONNECT))
    if kind == 2:
        code = rng.choice(sorted(CONNACK_REASON_CODES))
        return Connack5(code == 0 and rng.random() < 0.5, code, random_properties(rng, h.CONNACK))
    if kind in (3, 4, 5, 6):
        cls, codes, holder = ((Puback5, PUBACK_REASON_CODES, h.PUBACK),
                              (Pubrec5, PUBREC_REASON_CODES, h.PUBREC),
                              (Pubrel5, PUBREL_REASON_CODES, h.PUBREL),
                              (Pubcomp5, PUBCOMP_REASON_CODES, h.PUBCOMP))[kind - 3]
        if rng.random() < 0.5:
            return cls(_pid(rng))  # the short form
        return cls(_pid(rng), rng.choice(sorted(codes)), random_properties(rng, holder))
    if kind == 7:
        subs = []
        for _ in range(rng.randint(1, 4)):
            shared = rng.random() < 0.2
            subs.append(Subscription(("$share/g/" if shared else "") + _text(rng), rng.randint(0, 2),
                                     not shared and rng.random() < 0.5, rng.random() < 0.5,
                                     rng.randint(0, 2)))
        return Subscribe5(_pid(rng), tuple(subs), random_properties(rng, h.SUBSCRIBE))
    if kind in (8, 10):
        cls, codes, holder = ((Suback5, SUBACK_REASON_CODES, h.SUBACK) if kind == 8
                              else (Unsuback5, UNSUBACK_REASON_CODES, h.UNSUBACK))
        return cls(_pid(rng), tuple(rng.choice(sorted(codes)) for _ in range(rng.randint(1, 4))),
                   random_properties(rng, holder))
    if kind == 9:
        return Unsubscribe5(_pid(rng), tuple(_text(rng) for _ in range(rng.randint(1, 4))),
                            random_properties(rng, h.UNSUBSCRIBE))
    if kind in (11, 12):
        return (PINGREQ, PINGRESP)[kind - 11]
    if kind == 13:
        if rng.random() < 0.3:
            return Disconnect5()
        return Disconnect5(rng.choice(sorted(DISCONNECT_REASON_CODES)),
                           random_properties(rng, h.DISCONNECT))
    if rng.random() < 0.3:
        return Auth5()
    props = random_properties(rng, h.AUTH)
    if props.authentication_method is None:  # required but in the short form (3.15.2.2.2)
        props = props.replace(authentication_method=_text(rng))
    return Auth5(rng.choice(sorted(AUTH_REASON_CODES)), props)


def _stream(rng: random.Random, level: int | None = 4) -> tuple[bytes, list[Any]]:
    make = random_packet5 if level == 5 else random_packet
    packets = [make(rng) for _ in range(rng.choice((1, 1, 2, 3, 6)))]
    if level is None:
        # A negotiating reader: a CONNECT of either level, then packets of that level.
        first = rng.choice((random_packet, random_packet5))
        connect = first(rng)
        while type(connect) not in (Connect, Connect5):
            connect = first(rng)
        make = random_packet5 if type(connect) is Connect5 else random_packet
        packets = [connect] + [make(rng) for _ in range(rng.choice((0, 1, 2, 5)))]
    return b"".join(encode(p) for p in packets), packets


def _mutate(rng: random.Random, data: bytes, level: int | None) -> bytes:
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
            other = _stream(rng, level)[0]
            j = rng.randrange(len(other) + 1)
            buf[i:] = other[j:]
        elif op == 5:  # insertion
            buf[i:i] = rng.randbytes(rng.randint(1, 4))
        else:  # deletion
            del buf[i:i + rng.randint(1, 4)]
    return bytes(buf)


def make_input(rng: random.Random) -> tuple[bytes, list[Any] | None, int | None]:
    """Return (input bytes, expected packets or None when not a valid stream, reader's level)."""
    level = rng.choice(LEVELS)
    r = rng.random()
    if r < 0.3:
        return rng.randbytes(rng.choice((1, 2, 4, 8, 16, 64, rng.randint(0, 300)))), None, level
    data, packets = _stream(rng, level)
    if r < 0.4:
        return data, packets, level
    return _mutate(rng, data, level), None, level


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


def _level_name(level: int | None) -> str:
    return "negotiate" if level is None else str(level)


def _check_reason_code(exc: ProtocolError) -> None:
    assert exc.reason_code in CODEC_REASON_CODES, f"reason code {exc.reason_code:#x} for {exc!r}"


def run_one(data: bytes, chunks: list[int], expected: list[Any] | None, counts: Counter,
            level: int | None = 4) -> None:
    """Feed one input to a reader of ``level``; raise AssertionError or the exception on a bug."""
    name = _level_name(level)
    max_size = MAX_PACKET_SIZE if expected is None else 268_435_455
    reader = PacketReader(max_packet_size=max_size, protocol_level=level)
    got: list[Any] = []
    pos = 0
    try:
        for size in chunks:
            got.extend(reader.feed(data[pos:pos + size]))
            pos += size
        counts[f"{name}.need_data_leftover" if reader.buffered else f"{name}.clean_end"] += 1
    except ProtocolError as exc:
        _check_reason_code(exc)
        got.extend(exc.packets)
        counts[f"{name}.error.{type(exc).__name__}"] += 1
    counts[f"{name}.packets_decoded"] += len(got)
    if expected is not None:
        counts[f"{name}.valid_streams_checked"] += 1
        assert got == expected, f"valid stream decoded to {got!r}, expected {expected!r}"
    for pkt in got:
        own_level = 5 if type(pkt) in V5_TYPES else 4
        assert decode(encode(pkt), protocol_level=own_level)[0] == pkt, \
            f"re-encode round trip failed for {pkt!r}"
    try:
        decode(data, max_size, protocol_level=level)
        counts[f"{name}.decode.packet"] += 1
    except NeedData:
        counts[f"{name}.decode.NeedData"] += 1
    except ProtocolError as exc:
        _check_reason_code(exc)
        counts[f"{name}.decode.{type(exc).__name__}"] += 1


def run_block(args: tuple[int, int, int]) -> dict[str, Any]:
    """Run one block of inputs; return counts, or a failure report."""
    seed, block, size = args
    rng = random.Random(f"{seed}:{block}")
    counts: Counter = Counter()
    for index in range(size):
        data, expected, level = make_input(rng)
        chunks = random_chunks(rng, len(data))
        try:
            run_one(data, chunks, expected, counts, level)
        except Exception:  # noqa: BLE001 - anything here is the bug being hunted
            return {"failure": {"seed": seed, "block": block, "index": index, "input_hex": data.hex(),
                                "chunks": chunks, "level": _level_name(level),
                                "valid_stream": expected is not None,
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
    parser.add_argument("--level", default="4", choices=("4", "5", "negotiate"),
                        help="reader protocol level for --replay")
    args = parser.parse_args(argv)

    if args.replay is not None:
        data = bytes.fromhex(args.replay)
        chunks = [int(c) for c in args.chunks.split(",") if c] or [len(data)]
        counts: Counter = Counter()
        level = None if args.level == "negotiate" else int(args.level)
        run_one(data, chunks, None, counts, level)  # raises with a traceback on the bug
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
                      f"--chunks {','.join(map(str, failure['chunks']))} --level {failure['level']}",
                      file=sys.stderr)
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
