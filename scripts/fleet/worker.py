"""The vehicles of one fleet process: options, rate-limited connector, source addresses, counters.

Strategy:

- 127.0.0.0/8: a TCP client socket needs a distinct (source address, source port) per destination,
  and one source address has only the ephemeral port range (``ip_local_port_range``, ~28k here). Linux
  routes all of 127/8 to ``lo`` without configuration, so when the broker is on a loopback address,
  vehicle ``i`` (global index over all processes) binds to ``127.0.<1 + k // 254>.<1 + k % 254>`` with
  ``k = i // per_address`` before connecting. The socket sets ``IP_BIND_ADDRESS_NO_PORT`` first, so the
  kernel picks the port at connect time by the whole 4-tuple instead of reserving one at bind time.
- Connector: one task takes vehicles from a FIFO at ``connect_rate`` per second (token bucket, burst
  of 20 ms worth) with at most ``connect_concurrency`` TCP connects in progress; initial connects and
  every reconnect go through it, so a broker restart cannot turn into an uncontrolled storm.
- ``RLIMIT_NOFILE``: the soft limit is raised to the hard limit; a hard limit below what the process
  needs (its vehicles plus a margin) stops the run before any connect with a message saying so.
- Counters are plain ints on one slotted object; :meth:`Worker.snapshot` copies them (with the ledger
  totals, RSS and connect timing) for the parent's display and summary.
"""
from __future__ import annotations

import asyncio
import ipaddress
import os
import random
import resource
import socket
from collections import deque
from dataclasses import dataclass
from typing import Any, Callable

import psutil
import structlog

from fanout.mqtt.codec import encode_puback

from .accounting import Ledger, order_by_string, order_from_list
from .payload import now_us
from .vehicle import Vehicle

log = structlog.get_logger(__name__)

IP_BIND_ADDRESS_NO_PORT = getattr(socket, "IP_BIND_ADDRESS_NO_PORT", 24)  # Linux >= 4.2
FD_MARGIN = 64  # descriptors a fleet process needs besides its vehicles
MAX_ERROR_KINDS = 50


class FleetError(Exception):
    """The fleet cannot run as configured (the message says why and what to change)."""


@dataclass(slots=True)
class FleetOptions:
    """Everything a fleet run needs (the CLI flags of ``scripts/mock_vehicles.py``, same names).

    ``vins`` None means generated from ``vin_prefix``/``count``/``vin_start``/``vin_digits``.
    ``order_ids`` (with ``expect_order``) is the platform's queue order; None orders request ids as strings.
    Durations are seconds; ``connect_rate`` 0 is unlimited; ``duration``/``expect`` None are unset.
    """

    host: str = "127.0.0.1"
    port: int = 1883
    vins: list[str] | None = None
    vin_prefix: str = "SIM"
    count: int = 10
    vin_start: int = 1
    vin_digits: int = 9
    username: str | None = None
    password: str | None = None
    persistent: bool = False
    keepalive: int = 60
    topic_prefix: str = "agent/{VIN}/proxy/request"
    heartbeat_interval: float = 30.0
    heartbeat_qos: int = 0
    ack_delay: float = 0.0
    ack_jitter: float = 0.0
    crash_rate: float = 0.0
    reconnect_delay: float = 1.0
    reconnect_max: float = 30.0
    connect_rate: float = 1000.0
    connect_concurrency: int = 256
    connect_timeout: float = 10.0
    processes: int = 1
    source_addresses: str = "auto"
    per_address: int = 20_000
    expect_order: bool = False
    order_ids: list[str] | None = None
    duration: float | None = None
    expect: int | None = None
    timeout: float = 300.0
    linger: float = 0.0
    max_requests: int = 10_000
    max_samples: int = 200_000
    max_packet_size: int = 16 * 1024 * 1024
    summary_requests: int = 1000
    display: str = "auto"
    seed: int | None = None

    def validate(self) -> None:
        """Raise :class:`FleetError` naming the first option out of range."""
        checks = [
            (0 <= self.crash_rate <= 1, "crash_rate must be in [0, 1]"),
            (self.heartbeat_qos in (0, 1), "heartbeat_qos must be 0 or 1"),
            (0 <= self.keepalive <= 0xFFFF, "keepalive must be in 0..65535"),
            (self.processes >= 1, "processes must be >= 1"),
            (self.connect_concurrency >= 1, "connect_concurrency must be >= 1"),
            (self.connect_rate >= 0, "connect_rate must be >= 0 (0 = unlimited)"),
            (self.per_address >= 1, "per_address must be >= 1"),
            (self.source_addresses in ("auto", "off") or _is_ipv4(self.source_addresses),
             "source_addresses must be auto, off or a first IPv4 address"),
            (self.reconnect_delay >= 0 and self.reconnect_max >= self.reconnect_delay,
             "reconnect_delay must be >= 0 and <= reconnect_max"),
            (self.password is None or self.username is not None, "a password needs a username"),
            (self.display in ("auto", "live", "lines", "off"), "display must be auto, live, lines or off"),
            ("+" not in self.topic_prefix and "#" not in self.topic_prefix, "topic_prefix cannot hold wildcards"),
        ]
        for ok, message in checks:
            if not ok:
                raise FleetError(message)


def _is_ipv4(text: str) -> bool:
    try:
        ipaddress.IPv4Address(text)
    except ValueError:
        return False
    return True


def source_addresses(opts: FleetOptions, target: str, vehicles: int) -> list[str] | None:
    """The source addresses vehicles bind to, ``per_address`` consecutive vehicles each.

    Args:
        opts: ``source_addresses`` (``auto``: spread over 127/8 when ``target`` is IPv4 loopback;
            ``off``; or the first address of a consecutive range) and ``per_address``.
        target: the resolved broker address.
        vehicles: the whole fleet's size (over every process).

    Returns:
        The addresses, or None to let the kernel choose.
    """
    if opts.source_addresses == "off":
        return None
    if opts.source_addresses == "auto":
        if not (_is_ipv4(target) and ipaddress.IPv4Address(target).is_loopback):
            return None
        # 127.0.<1 + k // 254>.<1 + k % 254>: skips .0 and .255 in the last byte
        n = max(1, -(-vehicles // opts.per_address))
        return [f"127.0.{1 + k // 254}.{1 + k % 254}" for k in range(n)]
    first = int(ipaddress.IPv4Address(opts.source_addresses))
    return [str(ipaddress.IPv4Address(first + k)) for k in range(max(1, -(-vehicles // opts.per_address)))]


def raise_nofile(needed: int) -> tuple[int, int]:
    """Raise the soft ``RLIMIT_NOFILE`` to the hard limit.

    Args:
        needed: descriptors this process needs.

    Returns:
        (soft, hard) after raising.

    Raises:
        FleetError: the hard limit is below ``needed`` (names both and the ways out).
    """
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and hard < needed:
        raise FleetError(
            f"RLIMIT_NOFILE hard limit is {hard}, below the {needed} descriptors this process needs: "
            f"split the fleet with --processes (each process needs its share + {FD_MARGIN}) or raise the hard "
            f"limit (ulimit -Hn, systemd LimitNOFILE, docker --ulimit nofile=...). A local broker needs as many.")
    if soft != hard:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    return hard, hard


class Counters:
    """Running totals of one fleet process (ints; read by :meth:`Worker.snapshot`)."""

    __slots__ = ("connected", "subscribed", "connects", "first_connects", "reconnects", "connect_errors",
                 "crashes", "losses", "subscribe_errors", "protocol_errors", "unexpected", "heartbeats",
                 "pubacks", "overlaps")

    def __init__(self) -> None:
        for name in self.__slots__:
            setattr(self, name, 0)

    def as_dict(self) -> dict[str, int]:
        return {name: getattr(self, name) for name in self.__slots__}


class Worker:
    """The vehicles of one process and what they share.

    Args:
        opts: the fleet options (``vins`` ignored: ``vins`` below is this process's share).
        vins: this process's VINs.
        offset: global index of ``vins[0]`` (source addresses are assigned on the global index).
        total: the whole fleet's size.
        worker_id: process number, for the seed and logs.
    """

    def __init__(self, opts: FleetOptions, vins: list[str], offset: int = 0, total: int | None = None,
                 worker_id: int = 0) -> None:
        self.opts = opts
        self.worker_id = worker_id
        self.offset = offset
        self.total = len(vins) if total is None else total
        self.counters = Counters()
        self.rng = random.Random(None if opts.seed is None else opts.seed * 1000 + worker_id)
        order = None
        if opts.expect_order:
            order = order_from_list(opts.order_ids) if opts.order_ids is not None else order_by_string
        self.ledger = Ledger(len(vins), order=order, max_requests=opts.max_requests, max_samples=opts.max_samples,
                             seed=None if opts.seed is None else opts.seed + worker_id)
        self.crash_rate = opts.crash_rate
        self.max_packet_size = opts.max_packet_size
        self.ping_period = opts.keepalive * 0.5 if opts.keepalive else float("inf")
        if opts.heartbeat_interval > 0 and opts.heartbeat_interval <= self.ping_period:
            self.ping_period = float("inf")  # heartbeats keep the connection alive
        head, sep, tail = opts.topic_prefix.partition("{VIN}")
        self._prefix = (head, tail + "/") if sep else (opts.topic_prefix + "/", None)
        self.pubacks = [b""] + [encode_puback(i) for i in range(1, 65536)]
        self.rss_base = psutil.Process().memory_info().rss
        self.vehicles = [Vehicle(self, i, vin) for i, vin in enumerate(vins)]
        self.stopping = False
        self.open_transports = 0
        self.errors: dict[str, int] = {}
        self.first_connect_us: int | None = None
        self.last_first_connect_us: int | None = None
        self.start_us = now_us()
        self._pid = 0
        self._sources: list[str] | None = None
        self._pending: deque[Vehicle] = deque()
        self._tasks: set[asyncio.Task[None]] = set()

    # ------------------------------------------------------------------ helpers used by vehicles

    def delivery_prefix(self, vin: str) -> str:
        """``<topic prefix with VIN>/``."""
        head, tail = self._prefix
        return head if tail is None else head + vin + tail

    def ack_delay(self) -> float:
        """Seconds to wait before a PUBACK (``ack_delay`` +- ``ack_jitter``, at least 0)."""
        o = self.opts
        if not o.ack_jitter:
            return o.ack_delay
        return max(0.0, o.ack_delay + self.rng.uniform(-o.ack_jitter, o.ack_jitter))

    def backoff(self, attempts: int) -> float:
        """Reconnect delay after ``attempts`` failures: doubling from ``reconnect_delay``, capped, +-20%."""
        o = self.opts
        base = max(o.reconnect_delay, 0.05)
        return min(o.reconnect_max, base * 2 ** min(attempts - 1, 20)) * self.rng.uniform(0.8, 1.2)

    def next_packet_id(self) -> int:
        self._pid = self._pid % 0xFFFF + 1
        return self._pid

    def first_connect(self) -> None:
        """A vehicle got its first CONNACK (connect rate timing)."""
        self.counters.first_connects += 1
        t = now_us()
        if self.first_connect_us is None:
            self.first_connect_us = t
        self.last_first_connect_us = t

    def connect_error(self, reason: str) -> None:
        self.counters.connect_errors += 1
        self.note_error(reason)

    def note_error(self, reason: str) -> None:
        """Count an error by kind (bounded: at most ``MAX_ERROR_KINDS`` kinds, then ``other``)."""
        key = reason if reason in self.errors or len(self.errors) < MAX_ERROR_KINDS else "other"
        self.errors[key] = self.errors.get(key, 0) + 1

    def schedule_connect(self, vehicle: Vehicle, delay: float) -> None:
        """Queue ``vehicle`` for the connector, now or after ``delay`` seconds."""
        if self.stopping:
            return
        if delay > 0:
            self.loop.call_later(delay, self._enqueue, vehicle)
        else:
            self._enqueue(vehicle)

    def _enqueue(self, vehicle: Vehicle) -> None:
        if not self.stopping:
            self._pending.append(vehicle)
            self._wake.set()

    # ------------------------------------------------------------------ connector

    async def _connector(self) -> None:
        o = self.opts
        loop = self.loop
        sem = asyncio.Semaphore(o.connect_concurrency)
        rate = o.connect_rate
        burst = max(1.0, rate / 50)
        tokens, last = burst, loop.time()
        while True:
            if not self._pending:
                self._wake.clear()
                await self._wake.wait()
                continue
            await sem.acquire()
            if rate:
                while True:
                    now = loop.time()
                    tokens = min(burst, tokens + (now - last) * rate)
                    last = now
                    if tokens >= 1:
                        break
                    await asyncio.sleep((1 - tokens) / rate)
                tokens -= 1
            vehicle = self._pending.popleft()
            task = loop.create_task(self._connect(vehicle, sem))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    async def _connect(self, vehicle: Vehicle, sem: asyncio.Semaphore) -> None:
        sock = socket.socket(self._family, socket.SOCK_STREAM)
        try:
            sock.setblocking(False)
            if self._sources is not None:
                k = (self.offset + vehicle.index) // self.opts.per_address
                try:
                    sock.setsockopt(socket.IPPROTO_IP, IP_BIND_ADDRESS_NO_PORT, 1)
                except OSError:
                    pass
                sock.bind((self._sources[k], 0))
            await asyncio.wait_for(self.loop.sock_connect(sock, self._target), self.opts.connect_timeout)
            await self.loop.create_connection(lambda: vehicle, sock=sock)
        except (OSError, asyncio.TimeoutError) as exc:
            sock.close()
            vehicle.connect_failed(type(exc).__name__ + (f" errno {exc.errno}" if getattr(exc, "errno", None) else ""))
        except BaseException:
            sock.close()
            raise
        finally:
            sem.release()

    # ------------------------------------------------------------------ run

    def snapshot(self) -> dict[str, Any]:
        """Counters, ledger totals, connect timing and RSS, as a picklable dict."""
        snap: dict[str, Any] = self.counters.as_dict()
        snap.update(self.ledger.counters())
        snap.update(vehicles=len(self.vehicles), start_us=self.start_us, first_connect_us=self.first_connect_us,
                    last_first_connect_us=self.last_first_connect_us, rss=psutil.Process().memory_info().rss,
                    rss_base=self.rss_base, errors=dict(self.errors), pid=os.getpid(),
                    sources=len(self._sources or ()), nofile=resource.getrlimit(resource.RLIMIT_NOFILE)[0])
        return snap

    async def run(self, report: Callable[[dict[str, Any]], None], should_stop: Callable[[], bool],
                  interval: float = 0.25, poll: float = 0.05) -> dict[str, Any]:
        """Connect every vehicle and keep them running until ``should_stop()`` is true.

        Args:
            report: called with :meth:`snapshot` every ``interval`` seconds.
            should_stop: polled every ``poll`` seconds.
            interval: report period.
            poll: stop-check period.

        Returns:
            The final snapshot (``connected``/``subscribed`` as at the stop) with ``ledger`` (the
            ledger's export, taken after every connection closed).

        Raises:
            FleetError: the descriptor limit is too low, or the broker address does not resolve.
        """
        self.loop = asyncio.get_running_loop()
        self._wake = asyncio.Event()
        raise_nofile(len(self.vehicles) + FD_MARGIN)
        o = self.opts
        try:
            infos = await self.loop.getaddrinfo(o.host, o.port, type=socket.SOCK_STREAM)
        except OSError as exc:
            raise FleetError(f"cannot resolve {o.host}:{o.port}: {exc}") from exc
        self._family, _, _, _, self._target = infos[0]
        self._sources = source_addresses(o, self._target[0], self.total) if self._family == socket.AF_INET else None
        log.info("fleet.start", worker=self.worker_id, vehicles=len(self.vehicles), target=f"{o.host}:{o.port}",
                 sources=len(self._sources or ()), connect_rate=o.connect_rate)
        self.start_us = now_us()
        self._pending.extend(self.vehicles)
        connector = self.loop.create_task(self._connector())
        next_report = self.loop.time()
        try:
            while not should_stop():
                if self.loop.time() >= next_report:
                    report(self.snapshot())
                    next_report += interval
                await asyncio.sleep(poll)
                if connector.done():
                    connector.result()  # re-raise a connector failure
        finally:
            final = self.snapshot()
            await self.shutdown(connector)
        final.update(self.ledger.counters())
        final["ledger"] = self.ledger.export()
        final["errors"] = dict(self.errors)
        return final

    async def shutdown(self, connector: asyncio.Task[None] | None = None, timeout: float = 10.0) -> None:
        """Stop connecting, DISCONNECT and close every connection; wait (bounded) until all closed."""
        self.stopping = True
        self._pending.clear()
        for task in [connector, *self._tasks]:
            if task is not None:
                task.cancel()
        await asyncio.gather(*(t for t in [connector, *self._tasks] if t is not None), return_exceptions=True)
        for v in self.vehicles:
            v.close()
        deadline = self.loop.time() + timeout
        while self.open_transports > 0 and self.loop.time() < deadline:
            await asyncio.sleep(0.02)
        if self.open_transports > 0:
            for v in self.vehicles:
                if v.transport is not None:
                    v.transport.abort()
            await asyncio.sleep(0.05)
