"""Build and run ``cfleet``, the compiled MQTT load generator (``benchmarks/cfleet/*.c``), from Python.

Strategy:

- :func:`build` runs ``make cfleet`` (the one place the compiler flags live) when ``build/cfleet`` is
  missing or older than a source; :func:`sources_digest` names the sources a result was measured with.
- :class:`FleetSpec` / :class:`PublishSpec` are the command lines of ``cfleet fleet`` and ``cfleet
  publish`` as dataclasses (field names follow the flags).
- :class:`FleetProcess` runs ``cfleet fleet`` in the background: a reader thread follows its stderr
  (``cfleet ready ...`` once every vehicle is subscribed, ``cfleet progress key=value ...`` lines), so
  the benchmark can wait until the fleet is ready, take an exact counter snapshot (SIGUSR1 makes cfleet
  print a progress line within 10 ms), stop it (SIGTERM: it disconnects and prints its JSON) and read
  its one JSON object from stdout. Every wait is bounded; the process is killed when the ``with``
  block ends and gets ``PR_SET_PDEATHSIG``, so it never outlives the benchmark. (Not a harness
  :class:`~benchmarks.harness.processes.Child`: that reads one ready line from stdout and logs stderr to a
  file, while cfleet's stderr is read line by line for the whole run.)
- :func:`run_publish` runs ``cfleet publish`` to completion and returns its JSON.
"""
from __future__ import annotations

import collections
import json
import signal
import subprocess
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Sequence

from .harness.processes import HOST, die_with_parent
from .harness.versions import REPO, files_digest

SOURCES = REPO / "benchmarks" / "cfleet"
BINARY = REPO / "build" / "cfleet"
DEFAULT_TOPIC_PREFIX = "agent/{VIN}/proxy/request"


class CfleetError(RuntimeError):
    """cfleet could not be built, did not get ready, or ended without its JSON (the message says why)."""


def _sources() -> list[Path]:
    return sorted([*SOURCES.glob("*.c"), *SOURCES.glob("*.h")])


def is_stale(binary: Path = BINARY) -> bool:
    """True when the binary is missing or older than one of the sources."""
    if not binary.exists():
        return True
    built = binary.stat().st_mtime
    return any(src.stat().st_mtime > built for src in _sources())


def build(force: bool = False, timeout_s: float = 180.0) -> Path:
    """Compile cfleet with ``make cfleet`` when needed (or always with ``force``); returns the binary.

    Raises:
        CfleetError: make or the compiler failed (their output is in the message) or timed out.
    """
    if not force and not is_stale():
        return BINARY
    argv = ["make", "-s", "-C", str(REPO), "cfleet"]
    if force:
        argv.insert(1, "-B")
    try:
        out = subprocess.run(argv, capture_output=True, text=True, timeout=timeout_s)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise CfleetError(f"make cfleet: {exc}") from exc
    if out.returncode != 0 or not BINARY.exists():
        raise CfleetError(f"make cfleet failed ({out.returncode}):\n{(out.stdout + out.stderr)[-3000:]}")
    return BINARY


def sources_digest() -> str:
    """SHA-1 (12 hex digits) over the cfleet sources as they are on disk."""
    return files_digest(_sources())


def parse_result(stdout: str) -> dict[str, Any]:
    """The JSON object cfleet printed last on stdout.

    Raises:
        CfleetError: no line of stdout is a JSON object.
    """
    for line in reversed(stdout.strip().splitlines()):
        line = line.strip()
        if line.startswith("{"):
            try:
                return json.loads(line)
            except json.JSONDecodeError as exc:
                raise CfleetError(f"cfleet printed malformed JSON: {exc}: {line[:300]}") from exc
    raise CfleetError(f"cfleet printed no JSON object (stdout {stdout[-300:]!r})")


def _ports(port: int | Sequence[int]) -> str:
    return str(port) if isinstance(port, int) else ",".join(str(p) for p in port)


@dataclass(slots=True, kw_only=True)
class _VehicleOptions:
    """What ``cfleet fleet`` and ``cfleet publish`` share: the broker and the vehicles' VINs and topics."""

    host: str = HOST
    prefix: str = "WVW"
    digits: int = 14
    start: int = 1
    keepalive: int = 60
    time_cap_s: float = 120.0
    topic_prefix: str = DEFAULT_TOPIC_PREFIX
    username: str | None = None
    password: str | None = None

    def _argv(self, binary: Path, mode: str, port: int | Sequence[int], vehicles: int) -> list[str]:
        argv = [str(binary), mode, "--host", self.host, "--port", _ports(port), "--vehicles", str(vehicles),
                "--prefix", self.prefix, "--digits", str(self.digits), "--start", str(self.start),
                "--topic-prefix", self.topic_prefix, "--time-cap", f"{self.time_cap_s:g}",
                "--keepalive", str(self.keepalive)]
        if self.username is not None:
            argv += ["--username", self.username]
        if self.password is not None:
            argv += ["--password", self.password]
        return argv


@dataclass(slots=True)
class FleetSpec(_VehicleOptions):
    """``cfleet fleet``: ``vehicles`` VINs ``<prefix><start..> zero-padded to digits`` on ``port``.

    ``requests``: unique deliveries expected per vehicle (the fleet stops ``settle_s`` after it has them
    all; 0: once every vehicle is subscribed). ``connect_rate`` 0 connects as fast as ``concurrency``
    handshakes in flight per process allow (a connection storm). ``heartbeat_interval`` > 0: every
    subscribed vehicle publishes ``ecp/<VIN>/heartbeat`` that often. ``until_signal``: run until
    :meth:`FleetProcess.stop` (or ``time_cap_s``). ``processes`` 0: as many as the descriptor limit needs.
    """

    port: int | Sequence[int]
    vehicles: int
    requests: int = 0
    connect_rate: float = 0.0
    concurrency: int = 100
    heartbeat_interval: float = 0.0
    settle_s: float = 0.0
    until_signal: bool = False
    connect_timeout_s: float = 30.0
    processes: int = 0
    progress_s: float = 0.5
    coalesce_us: int = 0
    no_online: bool = False
    persistent: bool = False

    def argv(self, binary: Path = BINARY) -> list[str]:
        argv = self._argv(binary, "fleet", self.port, self.vehicles)
        argv += ["--requests", str(self.requests), "--connect-rate", f"{self.connect_rate:g}",
                 "--concurrency", str(self.concurrency), "--heartbeat-interval", f"{self.heartbeat_interval:g}",
                 "--settle", f"{self.settle_s:g}", "--connect-timeout", f"{self.connect_timeout_s:g}",
                 "--progress", f"{self.progress_s:g}", "--coalesce-us", str(self.coalesce_us)]
        if self.processes:
            argv += ["--processes", str(self.processes)]
        if self.until_signal:
            argv.append("--until-signal")
        if self.no_online:
            argv.append("--no-online")
        if self.persistent:
            argv.append("--persistent")
        return argv


@dataclass(slots=True)
class PublishSpec(_VehicleOptions):
    """``cfleet publish``: ``requests`` rounds of one QoS 1 PUBLISH per vehicle on
    ``agent/<VIN>/proxy/request/<request_prefix>-<r:05d>``, at most ``window`` unacknowledged."""

    port: int
    vehicles: int
    requests: int
    window: int = 128
    payload: int = 256
    request_prefix: str = "req"
    client_id: str = "cfleet-platform"

    def argv(self, binary: Path = BINARY) -> list[str]:
        return [*self._argv(binary, "publish", self.port, self.vehicles),
                "--requests", str(self.requests), "--window", str(self.window), "--payload", str(self.payload),
                "--request-prefix", self.request_prefix, "--client-id", self.client_id]


def run_publish(spec: PublishSpec, timeout_s: float | None = None) -> dict[str, Any]:
    """Run ``cfleet publish`` to completion (bounded by ``timeout_s``, default the cap + 30 s).

    Raises:
        CfleetError: it failed before printing its JSON, or did not end in time.
    """
    binary = build()
    try:
        out = subprocess.run(spec.argv(binary), capture_output=True, text=True, stdin=subprocess.DEVNULL,
                             timeout=timeout_s or spec.time_cap_s + 30.0, preexec_fn=die_with_parent)
    except subprocess.TimeoutExpired as exc:
        raise CfleetError(f"cfleet publish did not finish within {exc.timeout:.0f} s") from exc
    try:
        return parse_result(out.stdout)
    except CfleetError as exc:
        raise CfleetError(f"cfleet publish exited {out.returncode}: {out.stderr.strip()[-1000:]}") from exc


def _key_values(text: str) -> dict[str, float]:
    out: dict[str, float] = {}
    for item in text.split():
        key, sep, value = item.partition("=")
        if sep:
            try:
                out[key] = float(value) if "." in value else int(value)
            except ValueError:
                continue
    return out


@dataclass(slots=True)
class Progress:
    """One ``cfleet progress`` line: its counters and the wall-clock time it was read."""

    at: float
    values: dict[str, float] = field(default_factory=dict)

    def __getitem__(self, key: str) -> float:
        return self.values.get(key, 0)


class FleetProcess:
    """``cfleet fleet`` running in the background; see the module docstring.

    Use as a context manager (kills the process if still running at the end)::

        with FleetProcess(FleetSpec(port, 1000, requests=2)) as fleet:
            fleet.wait_ready(60)
            ...  # publish
            result = fleet.result(120)
    """

    def __init__(self, spec: FleetSpec) -> None:
        self.spec = spec
        self._proc: subprocess.Popen[str] | None = None
        self._reader: threading.Thread | None = None
        self._cond = threading.Condition()
        self._ready_t: float | None = None
        self._ready_at: float | None = None
        self._progress: Progress | None = None
        self._lines = 0
        self._tail: collections.deque[str] = collections.deque(maxlen=30)
        self._eof = False

    # -- lifecycle ---------------------------------------------------------------------------------

    def start(self) -> "FleetProcess":
        binary = build()
        self._proc = subprocess.Popen(self.spec.argv(binary), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                      stdin=subprocess.DEVNULL, text=True, preexec_fn=die_with_parent)
        self._reader = threading.Thread(target=self._read_stderr, name="cfleet-stderr", daemon=True)
        self._reader.start()
        return self

    def __enter__(self) -> "FleetProcess":
        return self.start() if self._proc is None else self

    def __exit__(self, *exc: object) -> None:
        proc = self._proc
        if proc is not None and proc.poll() is None:
            proc.kill()
            proc.wait(10)
        if proc is not None:
            for stream in (proc.stdout, proc.stderr):
                if stream is not None:
                    stream.close()

    def _read_stderr(self) -> None:
        assert self._proc is not None and self._proc.stderr is not None
        for line in self._proc.stderr:
            now = time.time()
            with self._cond:
                if line.startswith("cfleet ready "):
                    kv = _key_values(line[len("cfleet ready "):])
                    self._ready_t, self._ready_at = float(kv.get("t", 0.0)), now
                elif line.startswith("cfleet progress "):
                    self._progress = Progress(now, _key_values(line[len("cfleet progress "):]))
                    self._lines += 1
                else:
                    self._tail.append(line.rstrip())
                self._cond.notify_all()
        with self._cond:
            self._eof = True
            self._cond.notify_all()

    def _why(self) -> str:
        code = self._proc.poll() if self._proc is not None else None
        tail = "\n".join(self._tail)
        return f"(exit {code}){': ' + tail if tail else ''}"

    # -- waits -------------------------------------------------------------------------------------

    @property
    def ready_at(self) -> float | None:
        """Wall-clock time (seconds since the epoch) the ready line was read, or None."""
        return self._ready_at

    @property
    def progress(self) -> Progress | None:
        """The latest progress line read."""
        return self._progress

    def wait_ready(self, timeout_s: float) -> float:
        """Wait until every vehicle is subscribed; returns cfleet's own time to that point (seconds).

        Raises:
            CfleetError: cfleet ended or the timeout passed first (with the progress and stderr so far).
        """
        deadline = time.monotonic() + timeout_s
        with self._cond:
            while self._ready_t is None:
                left = deadline - time.monotonic()
                if self._eof or left <= 0:
                    p = self._progress.values if self._progress else {}
                    what = "ended" if self._eof else f"not ready within {timeout_s:.0f} s"
                    raise CfleetError(f"cfleet fleet {what}: last progress {p} {self._why()}")
                self._cond.wait(min(left, 0.5))
            return self._ready_t

    def snapshot(self, timeout_s: float = 5.0) -> Progress:
        """The fleet's counters now: SIGUSR1 makes cfleet print a progress line within ~10 ms.

        Raises:
            CfleetError: no line came within ``timeout_s`` (cfleet ended).
        """
        with self._cond:
            seen = self._lines
        self._signal(signal.SIGUSR1)
        deadline = time.monotonic() + timeout_s
        with self._cond:
            while self._lines == seen:
                left = deadline - time.monotonic()
                if self._eof or left <= 0:
                    raise CfleetError(f"cfleet fleet gave no progress line {self._why()}")
                self._cond.wait(min(left, 0.5))
            assert self._progress is not None
            return self._progress

    def _signal(self, sig: int) -> None:
        if self._proc is not None and self._proc.poll() is None:
            self._proc.send_signal(sig)

    def stop(self) -> None:
        """Ask cfleet to disconnect every vehicle and finish (SIGTERM); :meth:`result` reads the JSON."""
        self._signal(signal.SIGTERM)

    def result(self, timeout_s: float) -> dict[str, Any]:
        """Wait (bounded) for cfleet to finish by itself; returns its JSON object.

        Raises:
            CfleetError: it did not finish in time (it is then killed) or printed no JSON.
        """
        assert self._proc is not None and self._proc.stdout is not None
        try:  # stdout carries one JSON line of a few KB, written at the end: the pipe buffer holds it
            self._proc.wait(timeout_s)
        except subprocess.TimeoutExpired as exc:
            self._proc.kill()
            self._proc.wait(10)
            raise CfleetError(f"cfleet fleet did not finish within {timeout_s:.0f} s {self._why()}") from exc
        stdout = self._proc.stdout.read()
        if self._reader is not None:
            self._reader.join(5)
        try:
            return parse_result(stdout)
        except CfleetError as exc:
            raise CfleetError(f"{exc} {self._why()}") from exc


def run_fleet(spec: FleetSpec, timeout_s: float | None = None) -> dict[str, Any]:
    """Run ``cfleet fleet`` until it stops by itself; returns its JSON."""
    with FleetProcess(spec) as fleet:
        return fleet.result(timeout_s or spec.time_cap_s + 60.0)


__all__ = ["BINARY", "CfleetError", "FleetProcess", "FleetSpec", "Progress", "PublishSpec", "build", "is_stale",
           "parse_result", "run_fleet", "run_publish", "sources_digest"]
