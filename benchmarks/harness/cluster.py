"""The embedded fanout cluster as a benchmark subject: ``fanout up`` in a subprocess and its processes.

Strategy:

- :class:`EmbeddedCluster` runs ``fanout up --config <tmp>/fanout.toml --host 127.0.0.1 --port 0
  --data-dir <tmp>/data`` as a :class:`~.processes.Child` (a local Ray instance of its own, the Controller,
  the default shard count of Dispatchers and one ConnectionNode) and reads its one ready line ``fanout ready mqtt://H:P``.
  The data directory is on the same disk as every other benchmark file (``storage.sync`` stays on: every
  PUBACK to the platform follows an fsync). Leaving the ``with`` block sends SIGTERM (``fanout up`` drains
  the node, closes the stores and shuts Ray down) and, after ``stop_timeout``, SIGKILLs every process of
  the tree that is still alive, by pid: the ``fanout up`` process, its Ray head processes and the actor
  workers (which Ray puts in process groups of their own).
- Processes: the descendants of the ``fanout up`` process, by role from their command line
  (``ray::ConnectionNode``, ``ray::Dispatcher``, ``ray::Controller``, ``raylet``, ``gcs_server``,
  the rest as ``ray_other``). CPU time is read from ``/proc/<pid>/stat`` of each (utime + stime, all
  threads); :meth:`EmbeddedCluster.cpu_by_role` gives it per role so a reader sees which process
  spends it. RSS per connection is the ConnectionNode's (it holds every connection).
"""
from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Callable

import psutil

from .peers import fanout_executable
from .processes import HOST, Child, StartError, proc_cpu_seconds, proc_rss_bytes, stopped_on_error
from .versions import dist_version

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


class ClusterStartError(StartError):
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


def cpu_delta(before: dict[str, float], after: dict[str, float]) -> dict[str, float]:
    """Per-role CPU seconds spent between two :meth:`EmbeddedCluster.cpu_by_role` readings."""
    return {k: round(after.get(k, 0.0) - before.get(k, 0.0), 3) for k in after}


class EmbeddedCluster:
    """``fanout up`` on 127.0.0.1 (port 0, temporary data dir) for the duration of a ``with`` block.

    Attributes (after ``__enter__``): ``host``, ``port``, ``pid`` (the ``fanout up`` process),
    ``startup_s``, ``data_dir``.

    Args:
        extra_config: TOML appended to :data:`BENCH_CONFIG` (sections must not repeat).
        listeners_per_node: ``mqtt.listeners_per_node`` (listener processes sharing the port).
        start_timeout: seconds to wait for the ready line (Ray start-up takes 10-60 s on a busy machine).
        stop_timeout: seconds to wait after SIGTERM before SIGKILL.
        log_level: ``FANOUT_LOG_LEVEL`` of the cluster's processes (default :data:`LOG_LEVEL`).
    """

    system = "fanout"

    def __init__(self, *, extra_config: str = "", listeners_per_node: int = 1, start_timeout: float = 240.0,
                 stop_timeout: float = 60.0, log_level: str = LOG_LEVEL) -> None:
        self.host = HOST
        self.port = 0
        self.extra_config = extra_config
        self.listeners_per_node = listeners_per_node
        self.start_timeout = start_timeout
        self.stop_timeout = stop_timeout
        self.log_level = log_level
        self.startup_s: float | None = None
        self.data_dir: Path | None = None
        self._child: Child | None = None
        self._pids: dict[int, str] = {}
        self._ctimes: dict[int, float] = {}

    # -- lifecycle ---------------------------------------------------------------------------------

    @property
    def pid(self) -> int:
        if self._child is None:
            raise RuntimeError("cluster not started")
        return self._child.pid

    def __enter__(self) -> "EmbeddedCluster":
        self._child = Child("fanout up", ClusterStartError, tmp_prefix="bench-cluster-",
                            tmp_parent=os.environ.get("FANOUT_BENCH_TMP"))
        with stopped_on_error(self):
            self._start(self._child)
        return self

    def _start(self, child: Child) -> None:
        conf = child.tmp / "fanout.toml"
        base = BENCH_CONFIG.replace("[mqtt]\n", f"[mqtt]\nlisteners_per_node = {self.listeners_per_node}\n", 1)
        conf.write_text(base + self.extra_config)
        self.data_dir = child.tmp / "data"
        argv = [fanout_executable(), "up", "--config", str(conf), "--host", HOST, "--port", "0",
                "--data-dir", str(self.data_dir)]
        # The actors read their log level from the environment (Ray workers inherit it), not from [log].
        env = dict(os.environ, FANOUT_LOG_JSON="0", FANOUT_LOG_LEVEL=self.log_level, PYTHONUNBUFFERED="1",
                   RAY_USAGE_STATS_ENABLED="0")
        t0 = time.monotonic()
        child.spawn(argv, log_name="fanout-up.log", env=env)
        self.port = child.read_ready_line(READY_PREFIX, self.start_timeout)
        self.startup_s = time.monotonic() - t0
        deadline = time.monotonic() + 30
        while True:  # the actor processes show their titles a moment after start-up
            self.refresh_pids()
            roles = set(self._pids.values())
            nodes = sum(r == "node" for r in self._pids.values())
            if ({"node", "dispatcher"} <= roles and nodes >= self.listeners_per_node) or time.monotonic() > deadline:
                break
            time.sleep(0.2)

    def __exit__(self, *exc: object) -> None:
        child, self._child = self._child, None
        if child is None:
            return
        try:
            if child.proc is not None:
                self.refresh_pids(child.proc.pid)
            tree = dict(self._pids)
            child.stop(self.stop_timeout)
            for pid in tree:  # whatever outlived fanout up: our own descendants only, by pid
                try:
                    p = psutil.Process(pid)
                    if p.create_time() == self._ctimes.get(pid):  # not a reused pid
                        p.kill()
                except (psutil.NoSuchProcess, psutil.AccessDenied):
                    pass
        finally:
            child.cleanup()

    def log_lines(self) -> list[str]:
        """What ``fanout up`` and its Ray workers wrote to stderr so far."""
        return self._child.log_lines() if self._child is not None else []

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

    def _sum_by_role(self, read: Callable[[int], float], zero: float) -> dict[str, float]:
        out = dict.fromkeys(ROLES, zero)
        for pid, role in list(self._pids.items()):
            try:
                out[role] += read(pid)
            except (FileNotFoundError, ProcessLookupError):
                continue  # exited meanwhile
        return out

    def cpu_by_role(self) -> dict[str, float]:
        """CPU seconds (user + system) so far of every process of the cluster, summed per role."""
        return self._sum_by_role(proc_cpu_seconds, 0.0)

    def cpu_seconds(self) -> float:
        """CPU seconds of the whole cluster (every process of the tree)."""
        return sum(self.cpu_by_role().values())

    def rss_by_role(self) -> dict[str, int]:
        """RSS of every process of the cluster, summed per role."""
        return self._sum_by_role(proc_rss_bytes, 0)  # type: ignore[return-value]

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

    def version(self) -> str | None:
        return dist_version("sdv-fanout")
