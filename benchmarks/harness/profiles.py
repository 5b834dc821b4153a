"""py-spy profiles of running processes, summarised as the functions where they spend their Python CPU.

:func:`start_profiles` / :func:`finish_profiles`: ``py-spy record --gil --format raw`` (collapsed stacks;
only samples of the thread holding the GIL, i.e. Python execution, not waits or C code that released it)
on several pids at once for a fixed duration, summarised as the top functions by self and by inclusive
share of the samples: where each actor spends its Python CPU.
"""
from __future__ import annotations

import collections
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

from .processes import die_with_parent
from .versions import REPO


def py_spy() -> str | None:
    """The py-spy executable next to this interpreter, or on PATH."""
    local = Path(sys.executable).with_name("py-spy")
    return str(local) if local.exists() else shutil.which("py-spy")


def start_profiles(pids: dict[str, int], duration_s: float, out_dir: Path, rate: int = 97) -> list[tuple[str, Any, Path]]:
    """Start ``py-spy record --format raw`` on every pid (``{label: pid}``) for ``duration_s`` seconds.

    Returns:
        ``(label, Popen, raw output path)`` per started profiler (none when py-spy is missing).
    """
    exe = py_spy()
    started: list[tuple[str, Any, Path]] = []
    if exe is None:
        return started
    out_dir.mkdir(parents=True, exist_ok=True)
    for label, pid in pids.items():
        path = out_dir / f"{label}.txt"
        argv = [exe, "record", "--pid", str(pid), "--duration", str(max(1, int(round(duration_s)))), "--rate",
                str(rate), "--format", "raw", "--nonblocking", "--gil", "--output", str(path)]
        started.append((label, subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                                                preexec_fn=die_with_parent), path))
    return started


_FRAME = re.compile(r"^(?P<func>[^ ]+) \((?P<file>[^:]+):\d+\)$")


def _frame_name(frame: str) -> str:
    m = _FRAME.match(frame.strip())
    if not m:
        return frame.strip()[:120]
    path = m.group("file")
    for marker in ("site-packages/", f"{REPO}/", "lib/python3"):
        if marker in path:
            path = path.split(marker, 1)[1]
            break
    return f"{m.group('func')} ({path})"


def summarize_profile(path: Path, top: int = int(os.environ.get("FANOUT_PROFILE_TOP", "15"))) -> dict[str, Any]:
    """Top functions of a ``py-spy --format raw`` file (collapsed stacks ``a;b;c count``).

    Returns:
        ``samples``, ``self`` (leaf function -> share of samples) and ``inclusive`` (function anywhere on
        the stack -> share), each the ``top`` largest, shares in percent.
    """
    self_counts: collections.Counter[str] = collections.Counter()
    incl: collections.Counter[str] = collections.Counter()
    total = 0
    try:
        lines = path.read_text().splitlines()
    except OSError:
        return {"samples": 0, "self": {}, "inclusive": {}}
    for line in lines:
        stack, _, count = line.rpartition(" ")
        if not stack or not count.isdigit():
            continue
        n = int(count)
        frames = [_frame_name(f) for f in stack.split(";") if f and not f.startswith("process ")
                  and not f.startswith("thread ")]
        if not frames:
            continue
        total += n
        self_counts[frames[-1]] += n
        for name in set(frames):
            incl[name] += n

    def share(c: collections.Counter[str]) -> dict[str, float]:
        return {k: round(100.0 * v / total, 1) for k, v in c.most_common(top)} if total else {}

    return {"samples": total, "self": share(self_counts), "inclusive": share(incl)}


def finish_profiles(started: list[tuple[str, Any, Path]], timeout_s: float = 60.0) -> dict[str, Any]:
    """Wait for the profilers started by :func:`start_profiles`; summarise each output."""
    out: dict[str, Any] = {}
    for label, proc, path in started:
        try:
            _, err = proc.communicate(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            proc.kill()
            _, err = proc.communicate(timeout=10)
        summary = summarize_profile(path)
        if not summary["samples"] and err:
            summary["error"] = err.strip().splitlines()[-1][:300] if err.strip() else f"exit {proc.returncode}"
        out[label] = summary
    return out
