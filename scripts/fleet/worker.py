"""The vehicles of one fleet process: rate-limited connector, source addresses, counters, shutdown.

Strategy:

- Source addresses and descriptor limits: see :mod:`.options` (why 127/8).
- Connector: one task takes vehicles from a FIFO at ``connect_rate`` per second (token bucket, burst
  of 20 ms worth) with at most ``connect_concurrency`` handshakes in progress (from the TCP connect to
  the SUBACK, so a slow broker slows the ramp instead of timing out CONNACKs); initial connects and
  every reconnect go through it, so a broker restart cannot turn into an uncontrolled storm.
- Counters are plain ints on one slotted object; :meth:`Worker.snapshot` copies them (with the ledger
  totals, RSS and connect timing) for the parent's display and summary.
"""
from __future__ import annotations

import asyncio
import os
import random
import resource
import socket
from collections import deque
from typing import Any, Callable

import psutil
import structlog

from fanout.mqtt.codec import encode_puback

from .accounting import Ledger, order_by_string, order_from_list
from .options import FD_MARGIN, IP_BIND_ADDRESS_NO_PORT, MAX_ERROR_KINDS, FleetError, FleetOptions, raise_nofile, source_addresses
from .payload import now_us
from .vehicle import Counters, Vehicle

log = structlog.get_logger(__name__)

__all__ = ["Worker", "Counters", "FleetOptions", "FleetError", "FD_MARGIN", "raise_nofile"]


class Worker:
    """The vehicles of one process and what they share (the :class:`~.vehicle.VehicleHost` of each).

    Args:
        opts: the fleet options (``vins`` ignored: ``vins`` below is this process's share).
        vins: this process's VINs.
        offset: global index of ``vins[0]`` (source addresses are assigned on the global index).
        total: the whole fleet's size.
        worker_id: process number, for the seed and logs.
    """

    __slots__ = ("opts", "worker_id", "offset", "total", "counters", "rng", "ledger", "crash_rate", "max_packet_size",
                 "ping_period", "_prefix", "pubacks", "_proc", "rss_base", "vehicles", "stopping", "open_transports",
                 "errors", "first_connect_us", "last_first_connect_us", "start_us", "_pid", "_handshakes", "_sources",
                 "_targets", "_pending", "_tasks", "loop", "_wake", "_slot", "_family")

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
        # PINGREQ every keepalive seconds (as paho does; the broker allows 1.5x), unless heartbeats are
        # at least as frequent: any packet keeps the connection alive
        self.ping_period = float(opts.keepalive) if opts.keepalive else float("inf")
        if 0 < opts.heartbeat_interval * 1.1 <= self.ping_period:
            self.ping_period = float("inf")
        head, sep, tail = opts.topic_prefix.partition("{VIN}")
        self._prefix = (head, tail + "/") if sep else (opts.topic_prefix + "/", None)
        self.pubacks = [b""] + [encode_puback(i) for i in range(1, 65536)]
        self._proc = psutil.Process()
        self.rss_base = self._proc.memory_info().rss
        self.vehicles = [Vehicle(self, i, vin) for i, vin in enumerate(vins)]
        self.stopping = False
        self.open_transports = 0
        self.errors: dict[str, int] = {}
        self.first_connect_us: int | None = None
        self.last_first_connect_us: int | None = None
        self.start_us = now_us()
        self._pid = 0
        self._handshakes = 0  # connect attempts between the TCP connect and the SUBACK
        self._sources: list[str] | None = None
        self._targets: list[tuple[Any, ...]] = []
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

    def handshake_done(self) -> None:
        """A connect attempt ended (SUBACK, failure or loss before SUBACK): free its connector slot."""
        self._handshakes -= 1
        self._slot.set()

    async def _connector(self) -> None:
        o = self.opts
        loop = self.loop
        rate = o.connect_rate
        burst = max(1.0, rate / 50)
        tokens, last = burst, loop.time()
        while True:
            if not self._pending:
                self._wake.clear()
                await self._wake.wait()
                continue
            while self._handshakes >= o.connect_concurrency:
                self._slot.clear()
                await self._slot.wait()
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
            self._handshakes += 1
            task = loop.create_task(self._connect(vehicle))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    async def _connect(self, vehicle: Vehicle) -> None:
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
            target = self._targets[(self.offset + vehicle.index) % len(self._targets)]
            async with asyncio.timeout(self.opts.connect_timeout):  # no extra task, unlike wait_for
                await self.loop.sock_connect(sock, target)
            await self.loop.create_connection(lambda: vehicle, sock=sock)
        except (OSError, asyncio.TimeoutError) as exc:
            sock.close()
            vehicle.connect_failed(type(exc).__name__ + (f" errno {exc.errno}" if getattr(exc, "errno", None) else ""))
        except BaseException:
            sock.close()
            raise

    # ------------------------------------------------------------------ run

    def snapshot(self) -> dict[str, Any]:
        """Counters, ledger totals, connect timing and RSS, as a picklable dict."""
        snap: dict[str, Any] = self.counters.as_dict()
        snap.update(self.ledger.counters())
        cpu = self._proc.cpu_times()
        snap.update(vehicles=len(self.vehicles), start_us=self.start_us, first_connect_us=self.first_connect_us,
                    last_first_connect_us=self.last_first_connect_us, rss=self._proc.memory_info().rss,
                    cpu_s=cpu.user + cpu.system,
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
        self._slot = asyncio.Event()
        raise_nofile(len(self.vehicles) + FD_MARGIN)
        o = self.opts
        ports = o.ports()
        try:
            infos = await self.loop.getaddrinfo(o.host, ports[0], type=socket.SOCK_STREAM)
        except OSError as exc:
            raise FleetError(f"cannot resolve {o.host}: {exc}") from exc
        self._family, _, _, _, first = infos[0]
        self._targets = [(first[0], p, *first[2:]) for p in ports]  # vehicle i -> ports[i % len(ports)]
        self._sources = source_addresses(o, first[0], self.total) if self._family == socket.AF_INET else None
        log.info("fleet.start", worker=self.worker_id, vehicles=len(self.vehicles), host=o.host, ports=ports,
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
