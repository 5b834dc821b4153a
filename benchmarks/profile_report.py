"""Where each microsecond goes: the ``server_bench --profile DIR`` stacks as CPU µs per event, per process.

``python -m benchmarks.profile_report DIR [--phase fanout|connection_storm] [--top 12]`` reads
``DIR/<phase>/<process>.txt`` (py-spy raw collapsed stacks, every Python thread) and ``meta.json`` (each
process's CPU seconds over the profile window and the deliveries or connects made in it) and prints, per
process, its CPU µs per event split into buckets by the innermost frame's file (socket I/O, MQTT codec,
MQTT session bookkeeping, node core, dispatch, LMDB, replication, Ray transport and serialization, ...),
then the top functions by self time. py-spy counts a runnable thread as busy even while it waits for a
CPU (2 cores, shared with the fleet), so samples give shares, not seconds: the CPU of the process's
Python threads (``/proc/<pid>/task`` names ``ray::...``: the actor's event loop, its thread pool) is split
by those shares, and the CPU of Ray's C++ threads (``worker.io``, gRPC pollers, ...; no Python frames,
invisible to py-spy) is shown as its own bucket.
docs/profile.md is written from this output.
"""
from __future__ import annotations

import argparse
import collections
import json
import re
from pathlib import Path
from typing import Sequence

_FRAME = re.compile(r"^(?P<func>.+) \((?P<file>[^:()]+)(?::\d+)?\)$")

# (bucket, substrings of the file path or function), first match of the innermost classifiable frame wins.
BUCKETS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("direct channels (frames, pickling of the calls)", ("fanout/channel/", "actors/channels.py")),
    ("socket I/O (write/read syscalls, event loop)", ("fanout/mqtt/aio.py", "asyncio/selector_events.py",
                                                      "uvloop", "socket.py", "asyncio/base_events.py",
                                                      "asyncio/events.py")),
    ("MQTT codec", ("fanout/mqtt/codec.py", "fanout/mqtt/decoder", "fanout/mqtt/encoder", "fanout/mqtt/packets",
                    "fanout/mqtt/fanout5.py", "fanout/mqtt/properties.py", "fanout/mqtt/property_block.py")),
    ("MQTT session bookkeeping (broker, session, subscriptions, ACL)", ("fanout/mqtt/",)),
    ("node core (events, delivery routing)", ("fanout/node/", "actors/connection_node.py")),
    ("replication (ship, replica apply)", ("storage/replica", "actors/store_replica.py", "actors/primary_link.py",
                                           "storage/replication")),
    ("LMDB (store reads and writes)", ("storage/", "lmdb")),
    ("dispatch state machine", ("fanout/dispatcher/", "actors/dispatcher.py", "fanout/trigger.py")),
    ("Ray transport and serialization", ("ray/", "msgpack", "pickle", "fanout/records.py", "cloudpickle",
                                         "concurrent/futures", "asyncio/tasks.py", "asyncio/futures.py",
                                         "contextlib.py", "threading.py", "inspect.py", "weakref", "_weakrefset")),
    ("logging", ("structlog", "fanout/log.py", "logging/")),
)
NATIVE = "no Python frame (native: uvloop poll, C extensions)"
UNSAMPLED = "Ray C++ threads (worker.io, gRPC pollers; not sampled)"


def parse_frame(frame: str) -> tuple[str, str]:
    """``(function, file)`` of one py-spy frame ``func (file:line)``."""
    m = _FRAME.match(frame.strip())
    return (m.group("func"), m.group("file")) if m else (frame.strip(), "")


def bucket_of(frames: Sequence[str]) -> str:
    """The bucket of one stack (outermost first): the innermost frame that names a known file decides;
    ``Thread.run`` alone (a thread in C with no Python frame of its own) is native."""
    for frame in reversed(frames):
        func, path = parse_frame(frame)
        if path.endswith("threading.py") and func in ("Thread.run", "run"):
            return NATIVE
        for name, marks in BUCKETS:
            if any(m in path for m in marks):
                return name
    return "other Python"


def read_stacks(path: Path) -> list[tuple[list[str], int]]:
    out = []
    for line in path.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        if stack and count.isdigit():
            frames = [f for f in stack.split(";") if f and not f.startswith(("process ", "thread "))]
            if frames:
                out.append((frames, int(count)))
    return out


def report(folder: Path, top: int = 12) -> str:
    """Markdown tables for one phase folder."""
    meta = json.loads((folder / "meta.json").read_text())
    count, rate = meta["count"], meta["rate_hz"]
    lines = [f"{folder.name}: {count} events in {meta['wall_s']} s, py-spy at {rate} Hz, load {meta['load']}", ""]
    total_us = 0.0
    for label in meta["pids"]:
        stacks = read_stacks(folder / f"{label}.txt")
        cpu_s = meta["cpu_s"][label]
        buckets: collections.Counter[str] = collections.Counter()
        selfs: collections.Counter[str] = collections.Counter()
        for frames, n in stacks:
            buckets[bucket_of(frames)] += n
            func, path = parse_frame(frames[-1])
            selfs[f"{func} ({path.split('site-packages/')[-1].split('/perf/')[-1]})"] += n
        samples = sum(buckets.values()) or 1
        threads = meta.get("thread_cpu_s", {}).get(label, {})
        py_s = sum(c for t, c in threads.items() if t.split(" ", 1)[1].startswith("ray::")) if threads else cpu_s
        per = 1e6 / count if count else 0.0
        proc_us = cpu_s * per
        total_us += proc_us
        lines.append(f"### {label}: {proc_us:.1f} µs CPU per event ({cpu_s:.2f} s CPU, {py_s:.2f} s of it in "
                     f"Python threads, {samples} samples)")
        lines.append("")
        lines.append("| bucket | µs per event | share |")
        lines.append("|---|---|---|")
        rows = [(b, n / samples * py_s * per) for b, n in buckets.most_common()]
        rows.append((UNSAMPLED, max(0.0, cpu_s - py_s) * per))
        for b, us in sorted(rows, key=lambda r: -r[1]):
            lines.append(f"| {b} | {us:.1f} | {100 * us / proc_us if proc_us else 0:.0f} % |")
        lines.append("")
        lines.append("top functions (self, µs per event): " + "; ".join(
            f"{k} {n / samples * py_s * per:.1f}" for k, n in selfs.most_common(top)))
        lines.append("")
    lines.insert(1, f"profiled processes together: {total_us:.1f} µs CPU per event")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("dir")
    parser.add_argument("--phase", nargs="+", default=["fanout", "connection_storm"])
    parser.add_argument("--top", type=int, default=12)
    args = parser.parse_args(argv)
    for phase in args.phase:
        folder = Path(args.dir) / phase
        if (folder / "meta.json").exists():
            print(report(folder, args.top))  # noqa: T201 - a command-line report
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
