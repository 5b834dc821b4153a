"""The embedded fanout cluster as a benchmark subject: ``fanout up`` in a subprocess, its processes, profiles.

Strategy:

- :class:`EmbeddedCluster` runs ``fanout up --config <tmp>/fanout.toml --host 127.0.0.1 --port 0
  --data-dir <tmp>/data`` (a local Ray instance of its own, the Controller, one Dispatcher per CPU and
  one ConnectionNode) and reads its one ready line ``fanout ready mqtt://H:P``. The data directory is
  on the same disk as every other benchmark file (``storage.sync`` stays on: every PUBACK to the
  platform follows an fsync). Leaving the ``with`` block sends SIGTERM (``fanout up`` drains the node,
  closes the stores and shuts Ray down) and, after ``stop_timeout``, SIGKILLs every process of the
  tree that is still alive, by pid: the ``fanout up`` process, its Ray head processes and the actor
  workers (which Ray puts in process groups of their own). ``fanout up`` gets ``PR_SET_PDEATHSIG`` so
  a killed benchmark does not leave it running.
- Processes: the descendants of the ``fanout up`` process, by role from their command line
  (``ray::ConnectionNode``, ``ray::Dispatcher``, ``ray::Controller``, ``raylet``, ``gcs_server``,
  the rest as ``ray_other``). CPU time is read from ``/proc/<pid>/stat`` of each (utime + stime, all
  threads); :meth:`EmbeddedCluster.cpu_by_role` gives it per role so a reader sees which process
  spends it. RSS per connection is the ConnectionNode's (it holds every connection).
- :func:`start_profiles` / :func:`finish_profiles`: ``py-spy record --gil --format raw`` (collapsed
  stacks; only samples of the thread holding the GIL, i.e. Python execution, not waits or C code that
  released it) on several pids at once for a fixed duration, summarised as the top functions by self
  and by inclusive share of the samples: where each actor spends its Python CPU.
"""
from __future__ import annotations

import collections
import os
import re
import selectors
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import IO, Any

import psutil

from ..common import HOST, _die_with_parent, proc_cpu_seconds, proc_rss_bytes

ROLES: tuple[str, ...] = ("node", "dispatcher", "controller", "raylet", "gcs", "driver", "ray_other")
READY_PREFIX = "fanout ready mqtt://"
LOG_LEVEL = "warning"  # as the peers: Mosquitto logs errors and warnings only

# The benchmark cluster's config: defaults except what a benchmark needs.
BENCH_CONFIG = """\
[mqtt]
max_connections = 1000000   # (a 1,000,000-VIN trigger, ~15 MB, fits mqtt.max_platform_packet_size, 64MiB)

[log]
level = "warning"  # (the actors take FANOUT_LOG_LEVEL, set below)
"""


class ClusterStartError(RuntimeError):
    """``fanout up`` did not print its ready line; the message carries the tail of its log."""


def _role(cmdline: list[str]) -> str:
    head = cmdline[0] if cmdline else ""
    if head.startswith("ray::ConnectionNode"):
        return "node"
    if head.startswith("ray::Dispatcher"):
        return "dispatcher"
    if head.startswith("ray::Controller"):
        return "controller"
    joined = " ".join(cmdline[:2])
    if "raylet" in joined and "dashboard" not in joined:
        return "raylet"
    if "gcs_server" in joined:
        return "gcs"
    return "ray_other"


def filesystem_of(path: str | Path) -> str:
    """The filesystem type of ``path`` (e.g. ``ext4``, ``tmpfs``), from ``/proc/mounts``."""
    best, kind = "", "unknown"
    target = str(Path(path).resolve())
    for part in psutil.disk_partitions(all=True):
        mp = part.mountpoint
        if (target == mp or target.startswith(mp.rstrip("/") + "/")) and len(mp) > len(best):
            best, kind = mp, part.fstype
    return kind


class EmbeddedCluster:
    """``fanout up`` on 127.0.0.1 (port 0, temporary data dir) for the duration of a ``with`` block.

    Attributes (after ``__enter__``): ``host``, ``port``, ``pid`` (the ``fanout up`` process),
    ``startup_s``, ``data_dir``.

    Args:
        extra_config: TOML appended to :data:`BENCH_CONFIG` (sections must not repeat).
        start_timeout: seconds to wait for the ready line (Ray start-up takes 10-60 s on a busy machine).
        stop_timeout: seconds to wait after SIGTERM before SIGKILL.
    """

    system = "fanout"

    def __init__(self, *, extra_config: str = "", listeners_per_node: int = 1, start_timeout: float = 240.0,
                 stop_timeout: float = 60.0) -> None:
        self.host = HOST
        self.port = 0
        self.extra_config = extra_config
        self.listeners_per_node = listeners_per_node
        self.start_timeout = start_timeout
        self.stop_timeout = stop_timeout
        self.startup_s: float | None = None
        self.data_dir: Path | None = None
        self._proc: subprocess.Popen[str] | None = None
        self._tmp: tempfile.TemporaryDirectory[str] | None = None
        self._log: IO[str] | None = None
        self._pids: dict[int, str] = {}
        self._ctimes: dict[int, float] = {}

    # -- lifecycle ---------------------------------------------------------------------------------

    @property
    def pid(self) -> int:
        if self._proc is None:
            raise RuntimeError("cluster not started")
        return self._proc.pid

    def __enter__(self) -> "EmbeddedCluster":
        self._tmp = tempfile.TemporaryDirectory(prefix="bench-cluster-", dir=os.environ.get("FANOUT_BENCH_TMP"))
        try:
            self._start(Path(self._tmp.name))
        except BaseException:
            self.__exit__(None, None, None)
            raise
        return self

    def _start(self, tmp: Path) -> None:
        conf = tmp / "fanout.toml"
        base = BENCH_CONFIG.replace("[mqtt]\n", f"[mqtt]\nlisteners_per_node = {self.listeners_per_node}\n", 1)
        conf.write_text(base + self.extra_config)
        self.data_dir = tmp / "data"
        fanout = Path(sys.executable).with_name("fanout")
        argv = [str(fanout) if fanout.exists() else "fanout", "up", "--config", str(conf), "--host", HOST,
                "--port", "0", "--data-dir", str(self.data_dir)]
        self._log = open(tmp / "fanout-up.log", "w+")
        # The actors read their log level from the environment (Ray workers inherit it), not from [log].
        env = dict(os.environ, FANOUT_LOG_JSON="0", FANOUT_LOG_LEVEL=LOG_LEVEL, PYTHONUNBUFFERED="1",
                   RAY_USAGE_STATS_ENABLED="0")
        t0 = time.monotonic()
        self._proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=self._log, stdin=subprocess.DEVNULL,
                                      text=True, env=env, cwd=tmp, preexec_fn=_die_with_parent)
        self.port = self._read_ready_line()
        self.startup_s = time.monotonic() - t0
        deadline = time.monotonic() + 30
        while True:  # the actor processes show their titles a moment after start-up
            self.refresh_pids()
            roles = set(self._pids.values())
            nodes = sum(r == "node" for r in self._pids.values())
            if ({"node", "dispatcher"} <= roles and nodes >= self.listeners_per_node) or time.monotonic() > deadline:
                break
            time.sleep(0.2)

    def _failure(self, why: str) -> ClusterStartError:
        tail = ""
        if self._log is not None:
            self._log.flush()
            self._log.seek(0)
            tail = "".join(self._log.readlines()[-15:])
        return ClusterStartError(f"fanout up: {why}\n{tail}".rstrip())

    def _read_ready_line(self) -> int:
        assert self._proc is not None and self._proc.stdout is not None
        deadline = time.monotonic() + self.start_timeout
        sel = selectors.DefaultSelector()
        sel.register(self._proc.stdout, selectors.EVENT_READ)
        try:
            while True:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise self._failure(f"no ready line within {self.start_timeout:.0f} s")
                if not sel.select(min(left, 0.5)):
                    if self._proc.poll() is not None:
                        raise self._failure(f"exited with {self._proc.returncode} before ready")
                    continue
                line = self._proc.stdout.readline()
                if not line:
                    raise self._failure(f"closed stdout (exit {self._proc.wait(10)}) before ready")
                if line.startswith(READY_PREFIX):
                    return int(line.strip().rsplit(":", 1)[1])
        finally:
            sel.close()

    def __exit__(self, *exc: object) -> None:
        proc, self._proc = self._proc, None
        try:
            if proc is not None:
                self.refresh_pids(proc.pid)
                tree = dict(self._pids)
                if proc.poll() is None:
                    proc.send_signal(signal.SIGTERM)
                    try:
                        proc.wait(self.stop_timeout)
                    except subprocess.TimeoutExpired:
                        proc.kill()
                        proc.wait(10)
                for pid in tree:  # whatever outlived fanout up: our own descendants only, by pid
                    try:
                        p = psutil.Process(pid)
                        if p.create_time() == self._ctimes.get(pid):  # not a reused pid
                            p.kill()
                    except (psutil.NoSuchProcess, psutil.AccessDenied):
                        pass
                if proc.stdout is not None:
                    proc.stdout.close()
        finally:
            if self._log is not None:
                self._log.close()
                self._log = None
            if self._tmp is not None:
                self._tmp.cleanup()
                self._tmp = None

    # -- processes -----------------------------------------------------------------------------------

    def refresh_pids(self, root: int | None = None) -> dict[int, str]:
        """Re-read the process tree under ``fanout up``; returns ``{pid: role}`` (kept for CPU sums)."""
        root = self.pid if root is None else root
        try:
            top = psutil.Process(root)
            found = {root: "driver"}
            self._ctimes[root] = top.create_time()
            for child in top.children(recursive=True):
                try:
                    found[child.pid] = _role(child.cmdline())
                    self._ctimes[child.pid] = child.create_time()
                except (psutil.NoSuchProcess, psutil.AccessDenied):
                    continue
        except psutil.NoSuchProcess:
            return dict(self._pids)
        self._pids.update(found)
        return dict(found)

    def pids(self, role: str) -> list[int]:
        """Live pids of one role (``node``, ``dispatcher``, ...)."""
        return [pid for pid, r in self._pids.items() if r == role and psutil.pid_exists(pid)]

    @property
    def node_pid(self) -> int:
        pids = self.pids("node")
        if not pids:
            raise RuntimeError("no ConnectionNode process found under fanout up")
        return pids[0]

    def cpu_by_role(self) -> dict[str, float]:
        """CPU seconds (user + system) so far of every process of the cluster, summed per role."""
        out = dict.fromkeys(ROLES, 0.0)
        for pid, role in list(self._pids.items()):
            try:
                out[role] += proc_cpu_seconds(pid)
            except (FileNotFoundError, ProcessLookupError):
                continue
        return out

    def cpu_seconds(self) -> float:
        """CPU seconds of the whole cluster (every process of the tree)."""
        return sum(self.cpu_by_role().values())

    def rss_bytes(self) -> int:
        """RSS of the ConnectionNode processes (where the connections live; several with
        ``mqtt.listeners_per_node`` > 1)."""
        total = 0
        for pid in self.pids("node"):
            try:
                total += proc_rss_bytes(pid)
            except (FileNotFoundError, ProcessLookupError):
                continue
        return total

    def rss_by_role(self) -> dict[str, int]:
        out = dict.fromkeys(ROLES, 0)
        for pid, role in list(self._pids.items()):
            try:
                out[role] += proc_rss_bytes(pid)
            except (FileNotFoundError, ProcessLookupError):
                continue
        return out

    def version(self) -> str | None:
        from ..common import _dist_version

        return _dist_version("sdv-fanout")


def cpu_delta(before: dict[str, float], after: dict[str, float]) -> dict[str, float]:
    """Per-role CPU seconds spent between two :meth:`EmbeddedCluster.cpu_by_role` readings."""
    return {k: round(after.get(k, 0.0) - before.get(k, 0.0), 3) for k in after}


# ---------------------------------------------------------------------------------------------------
# py-spy


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
                                                preexec_fn=_die_with_parent), path))
    return started


_FRAME = re.compile(r"^(?P<func>[^ ]+) \((?P<file>[^:]+):\d+\)$")


def _frame_name(frame: str) -> str:
    m = _FRAME.match(frame.strip())
    if not m:
        return frame.strip()[:120]
    path = m.group("file")
    for marker in ("site-packages/", "/work/main/", "lib/python3"):
        if marker in path:
            path = path.split(marker, 1)[1]
            break
    return f"{m.group('func')} ({path})"


def summarize_profile(path: Path, top: int = 15) -> dict[str, Any]:
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


__all__ = ["EmbeddedCluster", "ClusterStartError", "ROLES", "cpu_delta", "filesystem_of", "py_spy",
           "start_profiles", "finish_profiles", "summarize_profile"]
