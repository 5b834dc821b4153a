"""Shared benchmark helpers: machine info, versions, JSON results, plots, and peer brokers.

Strategy:

- Every result file is one JSON object written by :func:`write_result` to
  ``benchmarks/results/<name>.json`` (``FANOUT_BENCH_RESULTS`` or an explicit ``out_dir`` overrides the
  folder) with :func:`machine_info` and :func:`versions` included, so a figure never travels without the
  machine and the code that produced it.
- :class:`PeerBroker` starts one broker (``fanout``, ``mosquitto`` or ``amqtt``) as its own process on
  127.0.0.1 and always stops it (SIGTERM, then SIGKILL) when the ``with`` block ends, also on error. The
  child gets ``PR_SET_PDEATHSIG`` so it dies with the benchmark process even if that is killed outright
  (Mosquitto drops root privileges at start, which clears that setting; the ``with`` block still stops it).
  CPU and RSS are read from ``/proc/<pid>`` of the broker process itself (no wrapper process).
- Broker settings are made comparable, not tuned: same outbound inflight window per client where the
  broker has one, queues large enough that no QoS 1 message is dropped, no persistence, TCP_NODELAY
  (asyncio sets it on every socket, Mosquitto needs ``set_tcp_nodelay true``).
- Plots use matplotlib's Agg backend, imported only when a plot is drawn.
"""
from __future__ import annotations

import ctypes
import hashlib
import json
import os
import platform
import resource
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from importlib import metadata
from pathlib import Path
from typing import IO, Any, Sequence

from fanout.mqtt.aio import raise_nofile_limit  # noqa: F401 - re-exported for the benchmarks

REPO = Path(__file__).resolve().parent.parent
RESULTS_DIR = Path(__file__).resolve().parent / "results"
SYSTEMS: tuple[str, ...] = ("fanout", "mosquitto", "amqtt")
HOST = "127.0.0.1"
CLK_TCK = os.sysconf("SC_CLK_TCK")
PAGE_SIZE = os.sysconf("SC_PAGE_SIZE")

# Outbound QoS 1/2 messages in flight per client, for every broker that has such a window (fanout's
# default; Mosquitto's default is 20; amqtt has no window).
INFLIGHT_WINDOW = 32
# Per-client queue bound behind the window: large enough that no QoS 1 message is ever dropped.
QUEUE_BOUND = 10_000_000

_AMQTT_ENTRY = r"""
import asyncio, logging, signal, sys
logging.basicConfig(level=logging.WARNING)
from amqtt.broker import Broker

async def main(port: int) -> None:
    config = {
        "listeners": {"default": {"type": "tcp", "bind": f"127.0.0.1:{port}", "max_connections": -1}},
        "plugins": {"amqtt.plugins.authentication.AnonymousAuthPlugin": {"allow_anonymous": True}},
    }
    broker = Broker(config)
    await broker.start()
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    print(f"amqtt broker ready mqtt://127.0.0.1:{port}", flush=True)
    await stop.wait()
    await broker.shutdown()

asyncio.run(main(int(sys.argv[1])))
"""


# ---------------------------------------------------------------------------------------------------
# machine, versions, results


FD_MARGIN = 1_000  # descriptors a server or fleet process needs besides its connections


def processes_for(connections: int, at_least: int = 1) -> int:
    """Processes needed to hold ``connections`` sockets with the server's margin (:data:`FD_MARGIN`)."""
    from scripts.fleet.options import processes_needed

    return processes_needed(connections, margin=FD_MARGIN, at_least=at_least)


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago (for brokers that need a port up front)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((HOST, 0))
        return s.getsockname()[1]


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def _os_name() -> str:
    try:
        for line in Path("/etc/os-release").read_text().splitlines():
            if line.startswith("PRETTY_NAME="):
                return line.split("=", 1)[1].strip('"')
    except OSError:
        pass
    return platform.system()


def machine_info() -> dict[str, Any]:
    """CPU model, cores, memory, kernel, OS, Python and the open-file limits of this process."""
    import psutil

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    return {
        "cpu_model": _cpu_model(),
        "logical_cpus": os.cpu_count(),
        "physical_cores": psutil.cpu_count(logical=False),
        "memory_bytes": psutil.virtual_memory().total,
        "kernel": platform.release(),
        "os": _os_name(),
        "python": platform.python_version(),
        "python_implementation": platform.python_implementation(),
        "nofile_soft": soft,
        "nofile_hard": hard,
        "hostname": platform.node(),
    }


def _dist_version(name: str) -> str | None:
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return None


def mosquitto_binary() -> str | None:
    """Path of the ``mosquitto`` executable (Debian installs it in /usr/sbin), or None."""
    found = shutil.which("mosquitto")
    if found:
        return found
    return "/usr/sbin/mosquitto" if os.access("/usr/sbin/mosquitto", os.X_OK) else None


def mosquitto_version() -> str | None:
    """First line of ``mosquitto -h`` (e.g. ``mosquitto version 2.0.11``), or None if not installed."""
    binary = mosquitto_binary()
    if binary is None:
        return None
    out = subprocess.run([binary, "-h"], capture_output=True, text=True, timeout=10)
    lines = (out.stdout or out.stderr).strip().splitlines()
    return lines[0].strip() if lines else None


def _git(*args: str) -> str | None:
    try:
        out = subprocess.run(["git", *args], cwd=REPO, capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return out.stdout.strip() if out.returncode == 0 else None


def _mqtt_sources_digest() -> str:
    """SHA-1 over ``fanout/mqtt/*.py`` as they are on disk (the broker may have uncommitted changes)."""
    h = hashlib.sha1()
    for path in sorted((REPO / "fanout" / "mqtt").glob("*.py")):
        h.update(path.name.encode())
        h.update(path.read_bytes())
    return h.hexdigest()[:12]


def versions() -> dict[str, Any]:
    """Versions of this project (plus git commit and a digest of the broker sources) and the peers."""
    status = _git("status", "--porcelain", "--", "fanout")
    return {
        "sdv_fanout": _dist_version("sdv-fanout"),
        "git_commit": _git("rev-parse", "--short=12", "HEAD"),
        "fanout_tree_dirty": bool(status) if status is not None else None,
        "fanout_mqtt_sources_sha1": _mqtt_sources_digest(),
        "mosquitto": mosquitto_version(),
        "amqtt": _dist_version("amqtt"),
        "paho_mqtt": _dist_version("paho-mqtt"),
        "uvloop": _dist_version("uvloop"),
        "psutil": _dist_version("psutil"),
        "matplotlib": _dist_version("matplotlib"),
    }


def results_dir(out_dir: str | Path | None = None) -> Path:
    """The folder results go to: ``out_dir``, else ``$FANOUT_BENCH_RESULTS``, else benchmarks/results."""
    path = Path(out_dir or os.environ.get("FANOUT_BENCH_RESULTS") or RESULTS_DIR)
    path.mkdir(parents=True, exist_ok=True)
    return path


def write_result(name: str, data: dict[str, Any], out_dir: str | Path | None = None) -> Path:
    """Write ``data`` as ``<results>/<name>.json`` (indented, keys in insertion order).

    ``machine`` and ``versions`` are added when missing. Returns the path written.
    """
    data.setdefault("machine", machine_info())
    data.setdefault("versions", versions())
    path = results_dir(out_dir) / f"{name}.json"
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(data, indent=2, default=str) + "\n")
    tmp.replace(path)
    return path


# ---------------------------------------------------------------------------------------------------
# plots


def pyplot() -> Any:
    """matplotlib.pyplot on the Agg backend (no display needed)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def grouped_bars(ax: Any, groups: Sequence[str], series: dict[str, Sequence[float | None]], *,
                 ylabel: str, title: str, target: float | None = None, target_label: str = "target",
                 fmt: str = "{:,.0f}", log: bool = False) -> None:
    """Draw one group of bars per entry of ``groups``, one bar per series (system) in each group.

    Missing values (None) leave a gap labelled ``n/a``. ``target`` draws a dashed horizontal line;
    ``log`` uses a logarithmic y axis (for peers that differ by orders of magnitude).
    """
    n = max(len(series), 1)
    width = 0.8 / n
    colors = {"fanout": "#1f77b4", "mosquitto": "#2ca02c", "amqtt": "#ff7f0e"}
    for i, (label, values) in enumerate(series.items()):
        xs = [g + (i - (n - 1) / 2) * width for g in range(len(groups))]
        heights = [v if v is not None and v > 0 else (float("nan") if log else 0.0) for v in values]
        bars = ax.bar(xs, heights, width, label=label, color=colors.get(label))
        for bar, v in zip(bars, values):
            text = "n/a" if v is None else fmt.format(v)
            y = bar.get_height() if v is not None and v > 0 else (1.0 if log else 0.0)
            ax.annotate(text, (bar.get_x() + bar.get_width() / 2, y), ha="center",
                        va="bottom", fontsize=7, xytext=(0, 2), textcoords="offset points")
    if target is not None:
        ax.axhline(target, color="red", linestyle="--", linewidth=1, label=target_label)
    if log:
        ax.set_yscale("log")
    ax.set_xticks(range(len(groups)))
    ax.set_xticklabels(groups, fontsize=8)
    ax.set_ylabel(ylabel)
    ax.set_title(title, fontsize=10)
    ax.margins(y=0.25 if log else 0.15)
    ax.legend(fontsize=7)


def save_figure(fig: Any, name: str, out_dir: str | Path | None = None) -> Path:
    """Save ``fig`` as ``<results>/<name>.png`` and close it. Returns the path."""
    path = results_dir(out_dir) / f"{name}.png"
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    pyplot().close(fig)
    return path


# ---------------------------------------------------------------------------------------------------
# processes


def proc_cpu_seconds(pid: int) -> float:
    """utime + stime of process ``pid`` (all its threads) in seconds, from ``/proc/<pid>/stat``."""
    stat = Path(f"/proc/{pid}/stat").read_text()
    fields = stat[stat.rindex(")") + 2:].split()
    # fields[0] is field 3 (state); utime and stime are fields 14 and 15.
    return (int(fields[11]) + int(fields[12])) / CLK_TCK


def proc_cpu_seconds_precise(pid: int) -> float | None:
    """CPU time of process ``pid`` summed over its live threads, in seconds with nanosecond resolution.

    From ``/proc/<pid>/task/*/schedstat`` (first field: time on CPU in ns); None when the kernel has no
    schedstat. Unlike :func:`proc_cpu_seconds` (10 ms ticks) it resolves short runs, but it omits
    threads that exited.
    """
    total = 0
    try:
        for task in Path(f"/proc/{pid}/task").iterdir():
            try:
                total += int((task / "schedstat").read_text().split()[0])
            except (FileNotFoundError, ProcessLookupError):
                continue  # thread exited meanwhile
    except FileNotFoundError:
        return None
    return total / 1e9


def proc_rss_bytes(pid: int) -> int:
    """Resident set size of process ``pid`` in bytes, from ``/proc/<pid>/statm``."""
    return int(Path(f"/proc/{pid}/statm").read_text().split()[1]) * PAGE_SIZE


def wait_for_quiet(max_wait_s: float, busy_pct: float = 25.0, sample_s: float = 1.0) -> float:
    """Wait (at most ``max_wait_s``) until the machine's CPU use over ``sample_s`` is below ``busy_pct``.

    Other work on a shared machine (test suites, builds) skews every figure; this lets it pass first.

    Returns:
        The last measured machine-wide CPU use in percent (0 when ``max_wait_s`` <= 0: not sampled).
    """
    import psutil

    if max_wait_s <= 0:
        return 0.0
    deadline = time.monotonic() + max_wait_s
    while True:
        pct = psutil.cpu_percent(interval=sample_s)
        if pct < busy_pct or time.monotonic() >= deadline:
            return pct


def _die_with_parent() -> None:
    """preexec_fn: SIGKILL this child when the benchmark process dies (PR_SET_PDEATHSIG)."""
    try:
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL, 0, 0, 0)
    except OSError:
        pass


class BrokerStartError(RuntimeError):
    """A broker did not become ready; the message carries the tail of its log."""


class PeerBroker:
    """Run one broker on 127.0.0.1 for the duration of a ``with`` block.

    Attributes (after ``__enter__``): ``host``, ``port``, ``pid``, ``version``.

    Args:
        system: ``fanout``, ``mosquitto`` or ``amqtt``.
        start_timeout: seconds to wait for the broker to accept connections.
        stop_timeout: seconds to wait after SIGTERM before SIGKILL.
    """

    def __init__(self, system: str, *, start_timeout: float = 30.0, stop_timeout: float = 10.0) -> None:
        if system not in SYSTEMS:
            raise ValueError(f"unknown broker {system!r}, expected one of {SYSTEMS}")
        self.system = system
        self.host = HOST
        self.port = 0
        self.start_timeout = start_timeout
        self.stop_timeout = stop_timeout
        self._proc: subprocess.Popen[str] | None = None
        self._tmp: tempfile.TemporaryDirectory[str] | None = None
        self._log: IO[str] | None = None

    @property
    def pid(self) -> int:
        if self._proc is None:
            raise RuntimeError("broker not started")
        return self._proc.pid

    def cpu_seconds(self) -> float:
        """Broker process CPU time (user + system) so far."""
        return proc_cpu_seconds(self.pid)

    def cpu_seconds_precise(self) -> float | None:
        """Broker CPU time from schedstat (ns resolution, live threads only), or None."""
        return proc_cpu_seconds_precise(self.pid)

    def rss_bytes(self) -> int:
        """Broker process resident set size now."""
        return proc_rss_bytes(self.pid)

    def __enter__(self) -> "PeerBroker":
        self._tmp = tempfile.TemporaryDirectory(prefix=f"bench-{self.system}-")
        try:
            self._start(Path(self._tmp.name))
        except BaseException:
            self.__exit__(None, None, None)
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        proc, self._proc = self._proc, None
        try:
            if proc is not None and proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
                try:
                    proc.wait(self.stop_timeout)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait(5)
            if proc is not None and proc.stdout is not None:
                proc.stdout.close()
        finally:
            if self._log is not None:
                self._log.close()
                self._log = None
            if self._tmp is not None:
                self._tmp.cleanup()
                self._tmp = None

    # -- start-up ---------------------------------------------------------------------------------

    def _spawn(self, argv: list[str], tmp: Path) -> subprocess.Popen[str]:
        self._log = open(tmp / "broker.log", "w+")
        env = dict(os.environ, FANOUT_LOG_JSON="0", PYTHONUNBUFFERED="1")
        return subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=self._log, stdin=subprocess.DEVNULL,
                                text=True, env=env, cwd=tmp, preexec_fn=_die_with_parent)

    def _start(self, tmp: Path) -> None:
        if self.system == "fanout":
            conf = tmp / "fanout.toml"
            conf.write_text(
                "[mqtt]\n"
                f"max_inflight = {INFLIGHT_WINDOW}\n"
                f"max_offline_messages = {QUEUE_BOUND}\n"
                "max_connections = 1000000\n"
                "dev_platform_login = false\n"
            )
            fanout = Path(sys.executable).with_name("fanout")
            argv = [str(fanout) if fanout.exists() else "fanout", "broker", "--config", str(conf),
                    "--host", HOST, "--port", "0"]
            self._proc = self._spawn(argv, tmp)
            self.port = self._read_ready_line("fanout broker ready mqtt://")
        elif self.system == "mosquitto":
            binary = mosquitto_binary()
            if binary is None:
                raise BrokerStartError("mosquitto is not installed (make mosquitto)")
            self.port = free_port()
            conf = tmp / "mosquitto.conf"
            conf.write_text(
                f"listener {self.port} {HOST}\n"
                "allow_anonymous true\n"
                "persistence false\n"
                f"max_inflight_messages {INFLIGHT_WINDOW}\n"
                f"max_queued_messages {QUEUE_BOUND}\n"
                "set_tcp_nodelay true\n"
                "log_dest stderr\n"
                "log_type error\n"
                "log_type warning\n"
            )
            os.chmod(tmp, 0o755)
            os.chmod(conf, 0o644)
            self._proc = self._spawn([binary, "-c", str(conf)], tmp)
            self._wait_port()
        else:
            self.port = free_port()
            self._proc = self._spawn([sys.executable, "-c", _AMQTT_ENTRY, str(self.port)], tmp)
            self._read_ready_line("amqtt broker ready mqtt://")
            self._wait_port()

    def _failure(self, why: str) -> BrokerStartError:
        tail = ""
        if self._log is not None:
            self._log.flush()
            self._log.seek(0)
            tail = "".join(self._log.readlines()[-15:])
        return BrokerStartError(f"{self.system}: {why}\n{tail}".rstrip())

    def _read_ready_line(self, prefix: str) -> int:
        """Read stdout lines until the ready line; return its port. Bounded by ``start_timeout``."""
        import selectors

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
                    raise self._failure(f"closed stdout (exit {self._proc.wait(5)}) before ready")
                if line.startswith(prefix):
                    return int(line.strip().rsplit(":", 1)[1])
        finally:
            sel.close()

    def _wait_port(self) -> None:
        assert self._proc is not None
        deadline = time.monotonic() + self.start_timeout
        while True:
            if self._proc.poll() is not None:
                raise self._failure(f"exited with {self._proc.returncode} before accepting connections")
            try:
                with socket.create_connection((self.host, self.port), timeout=1.0):
                    return
            except OSError:
                if time.monotonic() > deadline:
                    raise self._failure(f"port {self.port} not accepting within {self.start_timeout:.0f} s")
                time.sleep(0.05)

    def version(self) -> str | None:
        """Version string of this broker (the project's, Mosquitto's or amqtt's)."""
        if self.system == "mosquitto":
            return mosquitto_version()
        return _dist_version("sdv-fanout" if self.system == "fanout" else "amqtt")
