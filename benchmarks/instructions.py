"""Instructions per event of a side bench, counted by callgrind: the A/B figure that does not move with the load.

On a shared 2-CPU machine a side bench's CPU times move ±15 % between runs of the same code, more than most
single steps change them. callgrind counts the instructions the process executes, exactly (with
``PYTHONHASHSEED=0``, the same ones every run), whatever else the machine does. Two runs of different sizes
cancel the set-up (imports, LMDB files, the broker): ``(Ir(large) - Ir(small)) / (events(large) - events(small))``.

    python -m benchmarks.instructions SUBJECT [--label L] [--json]

SUBJECT: ``connect`` (connect_side_bench: CONNECT, SUBSCRIBE and online of 1,000 / 3,000 vehicles),
``heartbeat`` (heartbeat_side_bench: 10,000 vehicles, 2 / 4 rounds of heartbeats that find nothing),
``append`` (append_side_bench: 8,192 / 16,384 durable 1 KB publishes) or ``delivery`` (hotpath_bench: 2,000
vehicles, 4 / 12 requests, node and dispatcher cores). Needs valgrind (``make valgrind``); each subject takes
1-4 minutes under it. Prints one line, or a JSON object with ``--json``.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
from dataclasses import dataclass
from typing import Any, Callable

from fanout import native

_COLLECTED = re.compile(r"^==\d+== Collected : (\d+)\s*$", re.MULTILINE)


@dataclass(frozen=True, slots=True)
class Subject:
    """A side bench and the two sizes it is run at."""

    module: str
    argv: Callable[[int], list[str]]  # size -> the bench's arguments
    events: Callable[[int], int]  # size -> events the run makes
    sizes: tuple[int, int]  # small, large
    unit: str


SUBJECTS: dict[str, Subject] = {
    "connect": Subject("benchmarks.connect_side_bench", lambda n: ["ab", str(n), "100"], lambda n: n,
                       (1000, 3000), "connect"),
    "heartbeat": Subject("benchmarks.heartbeat_side_bench", lambda r: ["ab", "10000", str(r)], lambda r: 10_000 * r,
                         (2, 4), "heartbeat"),
    "append": Subject("benchmarks.append_side_bench", lambda n: ["ab", str(n)], lambda n: n, (8192, 16384),
                      "appended message"),
    "delivery": Subject("benchmarks.hotpath_bench", lambda r: ["--vehicles", "2000", "--requests", str(r)],
                        lambda r: 2000 * r, (4, 12), "delivery"),
}


class InstructionCountError(RuntimeError):
    """valgrind is missing, or a run under it failed or printed no count."""


def collected(output: str) -> int:
    """The instruction count callgrind prints at exit (``==PID== Collected : N``).

    Raises:
        InstructionCountError: no such line (the run failed before callgrind's summary).
    """
    found = _COLLECTED.findall(output)
    if not found:
        raise InstructionCountError("callgrind printed no 'Collected' line: " + output.strip()[-500:])
    return int(found[-1])


def per_event(small: tuple[int, int], large: tuple[int, int]) -> float:
    """Instructions per event from two ``(instructions, events)`` runs: the set-up they share cancels out."""
    (ir_small, ev_small), (ir_large, ev_large) = small, large
    if ev_large <= ev_small:
        raise ValueError(f"the large run must make more events ({ev_large} <= {ev_small})")
    return (ir_large - ir_small) / (ev_large - ev_small)


def count(subject: Subject, size: int, python: str = sys.executable) -> int:
    """Instructions of one run of ``subject`` at ``size`` under callgrind."""
    valgrind = shutil.which("valgrind")
    if valgrind is None:
        raise InstructionCountError("valgrind not found: install it with `make valgrind` (Debian package valgrind)")
    cmd = [valgrind, "--tool=callgrind", "--callgrind-out-file=/dev/null", python, "-m", subject.module,
           *subject.argv(size)]
    env = {**os.environ, "PYTHONHASHSEED": "0"}  # the same dict orders, so the same instructions, every run
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, check=False)
    if proc.returncode != 0:
        raise InstructionCountError(f"{' '.join(cmd[3:])} exited {proc.returncode}: {proc.stderr.strip()[-500:]}")
    return collected(proc.stderr)


def measure(name: str, python: str = sys.executable) -> dict[str, Any]:
    """Both runs of subject ``name`` and the instructions per event."""
    subject = SUBJECTS[name]
    runs = [(count(subject, size, python), subject.events(size)) for size in subject.sizes]
    return {"subject": name, "unit": subject.unit, "module": subject.module, "sizes": list(subject.sizes),
            "instructions": [ir for ir, _ in runs], "events": [ev for _, ev in runs],
            "instructions_per_event": round(per_event(runs[0], runs[1])),
            "native": native.STATUS}  # the runs inherit this process's environment and tree


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("subject", choices=sorted(SUBJECTS))
    parser.add_argument("--label", default="", help="a name for this run in the printed line (e.g. before, after)")
    parser.add_argument("--json", action="store_true", help="print a JSON object")
    args = parser.parse_args(argv)
    try:
        result = measure(args.subject)
    except InstructionCountError as exc:
        print(f"instructions: {exc}", file=sys.stderr)
        return 2
    result["label"] = args.label
    if args.json:
        print(json.dumps(result))
    else:
        print(f"{args.label or args.subject}: {result['instructions_per_event']:,} instructions per {result['unit']} "
              f"({args.subject}; {result['instructions'][0]:,} / {result['instructions'][1]:,} instructions for "
              f"{result['events'][0]:,} / {result['events'][1]:,} events; fanout {result['native']})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
