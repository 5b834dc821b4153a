"""Child processes of a benchmark and what is read from ``/proc`` about them.

Strategy:

- :class:`Child` is the one way a benchmark runs a server (a peer broker, ``fanout broker``, ``fanout up``):
  a temporary folder of its own, stdout piped for the ready line, stderr into a log file whose tail goes
  into every start-up error, ``PR_SET_PDEATHSIG`` so the child dies with the benchmark process even if
  that is killed outright, and a bounded stop (SIGTERM, then SIGKILL). Its owner (:mod:`.peers`,
  :mod:`.cluster`) decides the command line and what "ready" means.
- CPU and RSS come from ``/proc/<pid>`` of the process itself (no wrapper process, no sampling thread):
  ``stat`` (10 ms ticks, every thread that ever ran) or ``task/*/schedstat`` (nanoseconds, live threads).
- :func:`processes_for`: how many processes hold N sockets under this machine's descriptor limit (the
  fleet's rule with the server's margin), for listener and fleet process counts; :func:`storm_size`: how
  many one process holds.
"""
from __future__ import annotations

import contextlib
import ctypes
import os
import resource
import selectors
import signal
import socket
import subprocess
import tempfile
import time
from pathlib import Path
from typing import IO, Any, Iterator

from fanout.mqtt.aio import raise_nofile_limit  # noqa: F401 - re-exported for the benchmarks

HOST = "127.0.0.1"
CLK_TCK = os.sysconf("SC_CLK_TCK")
PAGE_SIZE = os.sysconf("SC_PAGE_SIZE")
FD_MARGIN = 1_000  # descriptors a server or fleet process needs besides its connections
LOG_TAIL_LINES = 15  # lines of a child's log quoted in a start-up error


def processes_for(connections: int, at_least: int = 1) -> int:
    """Processes needed to hold ``connections`` sockets with the server's margin (:data:`FD_MARGIN`)."""
    from scripts.fleet.options import processes_needed

    return processes_needed(connections, margin=FD_MARGIN, at_least=at_least)


def storm_size(requested: int) -> tuple[int, str | None]:
    """The largest connection storm a single-process server can hold here (its descriptor limit minus
    :data:`FD_MARGIN`, at most ``requested``), and why it is smaller than requested (or None)."""
    hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
    if hard == resource.RLIM_INFINITY or hard - FD_MARGIN >= requested:
        return requested, None
    n = max(1, hard - FD_MARGIN)
    return n, (f"RLIMIT_NOFILE hard limit is {hard} per process and cannot be raised here (no CAP_SYS_RESOURCE); "
               f"a single-process server holds one descriptor per connection, so {n:,} = {hard:,} - {FD_MARGIN:,} "
               f"spare is its largest storm; {requested:,} needs `ulimit -Hn {requested + FD_MARGIN}` or more")


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago (for brokers that need a port up front)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((HOST, 0))
        return s.getsockname()[1]


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


def die_with_parent() -> None:
    """preexec_fn: SIGKILL this child when the benchmark process dies (PR_SET_PDEATHSIG)."""
    try:
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL, 0, 0, 0)
    except OSError:
        pass


@contextlib.contextmanager
def stopped_on_error(owner: Any) -> Iterator[None]:
    """For a server's ``__enter__``: on any exception (KeyboardInterrupt too) call ``owner.__exit__`` so what
    already started is stopped, then let the exception go on."""
    try:
        yield
    except BaseException:
        owner.__exit__(None, None, None)
        raise


class StartError(RuntimeError):
    """A child did not become ready; the message carries the tail of its log."""


class Child:
    """One server process and its temporary folder, from :meth:`open` to :meth:`close`.

    Args:
        label: names the child in errors (``mosquitto``, ``fanout up``).
        error: the :class:`StartError` subclass raised when it does not become ready.
        tmp_prefix: prefix of its temporary folder; ``tmp_parent`` where that folder is made (default
            the system's temporary folder).
    """

    def __init__(self, label: str, error: type[StartError] = StartError, *, tmp_prefix: str,
                 tmp_parent: str | None = None) -> None:
        self.label = label
        self.error = error
        self.proc: subprocess.Popen[str] | None = None
        self._tmp = tempfile.TemporaryDirectory(prefix=tmp_prefix, dir=tmp_parent)
        self.tmp = Path(self._tmp.name)
        self._log: IO[str] | None = None

    @property
    def pid(self) -> int:
        if self.proc is None:
            raise RuntimeError(f"{self.label} not started")
        return self.proc.pid

    def spawn(self, argv: list[str], *, log_name: str, env: dict[str, str]) -> subprocess.Popen[str]:
        """Start ``argv`` in :attr:`tmp` with stdout piped and stderr in ``<tmp>/<log_name>``."""
        self._log = open(self.tmp / log_name, "w+")
        self.proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=self._log, stdin=subprocess.DEVNULL,
                                     text=True, env=env, cwd=self.tmp, preexec_fn=die_with_parent)
        return self.proc

    def log_lines(self) -> list[str]:
        """Everything the child wrote to its log so far."""
        if self._log is None:
            return []
        self._log.flush()
        self._log.seek(0)
        return self._log.readlines()

    def failure(self, why: str) -> StartError:
        """The start-up error for ``why``, with the last lines of the child's log."""
        tail = "".join(self.log_lines()[-LOG_TAIL_LINES:])
        return self.error(f"{self.label}: {why}\n{tail}".rstrip())

    def read_ready_line(self, prefix: str, timeout_s: float) -> int:
        """Read stdout until a line starts with ``prefix`` (``... mqtt://H:P``); return its port.

        Raises:
            StartError: no such line within ``timeout_s``, or the child exited or closed stdout first.
        """
        assert self.proc is not None and self.proc.stdout is not None
        deadline = time.monotonic() + timeout_s
        sel = selectors.DefaultSelector()
        sel.register(self.proc.stdout, selectors.EVENT_READ)
        try:
            while True:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise self.failure(f"no ready line within {timeout_s:.0f} s")
                if not sel.select(min(left, 0.5)):
                    if self.proc.poll() is not None:
                        raise self.failure(f"exited with {self.proc.returncode} before ready")
                    continue
                line = self.proc.stdout.readline()
                if not line:
                    raise self.failure(f"closed stdout (exit {self.proc.wait(10)}) before ready")
                if line.startswith(prefix):
                    return int(line.strip().rsplit(":", 1)[1])
        finally:
            sel.close()

    def wait_port(self, host: str, port: int, timeout_s: float) -> None:
        """Wait until ``host:port`` accepts a TCP connection (for servers without a ready line)."""
        assert self.proc is not None
        deadline = time.monotonic() + timeout_s
        while True:
            if self.proc.poll() is not None:
                raise self.failure(f"exited with {self.proc.returncode} before accepting connections")
            try:
                with socket.create_connection((host, port), timeout=1.0):
                    return
            except OSError:
                if time.monotonic() > deadline:
                    raise self.failure(f"port {port} not accepting within {timeout_s:.0f} s")
                time.sleep(0.05)

    def stop(self, stop_timeout_s: float, kill_wait_s: float = 10.0) -> None:
        """SIGTERM the child, SIGKILL it after ``stop_timeout_s``; close its stdout pipe."""
        proc, self.proc = self.proc, None
        if proc is None:
            return
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(stop_timeout_s)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(kill_wait_s)
        if proc.stdout is not None:
            proc.stdout.close()

    def cleanup(self) -> None:
        """Close the log and remove :attr:`tmp` (after :meth:`stop`, and after whatever outlived the child)."""
        if self._log is not None:
            self._log.close()
            self._log = None
        self._tmp.cleanup()

    def close(self, stop_timeout_s: float, kill_wait_s: float = 10.0) -> None:
        """:meth:`stop`, then :meth:`cleanup` (also when stopping failed)."""
        try:
            self.stop(stop_timeout_s, kill_wait_s)
        finally:
            self.cleanup()
