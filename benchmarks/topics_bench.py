# Over 500 lines: one benchmark of three systems (fanout, Redis Streams, NATS JetStream) with three phases each, kept side by side so that each phase reads the same for all three.
"""Durable topics benchmark (issue 14): append, group consumption and lag after a consumer outage, against Redis
Streams and NATS JetStream in the same run on the same machine.

- ``append``: publishers, each with a window of messages of 1 KB unacknowledged at most, publish ``count``
  messages round robin over ``VINS`` topics ``ecp/<VIN>/response``; one run per ``(publishers, window)`` of
  :data:`APPEND_RUNS`: ``PUBLISHERS`` (4) publishers at each of ``WINDOWS`` (32, as a paho-like client keeps, and 256,
  a deeply pipelining client), then 16 and 64 publishers at window 32 (the "many publishers" of issue 14: many
  platform services or vehicles, each a paho-like client). 4 x 32 keeps 128 messages in flight: there the figure
  is the commit latency of the whole path (docs/topics.md); the others keep 512 or more:
  - fanout: MQTT 3.1.1 QoS 1 to a durable topic ``ecp/+/response``, published by compiled clients: one
    ``cfleet publish`` process per publisher (``benchmarks/cfleet``, C; ``--request-prefix ''``: each VIN's own
    topic, ``VINS`` of them shared out between the publishers); a PUBACK comes once the append is fsynced on the
    primary AND on its replica (``fanout.replicas = 1``, ``min_replicas_to_ack = 1``; default config otherwise: the
    shard count of ``fanout.dispatchers = 0``, 1 on 2 CPUs);
  - Redis Streams (Debian ``redis-server``, ``appendonly yes``, ``appendfsync always``): ``XADD`` pipelined
    a window deep per client by ``redis-benchmark`` (Debian ``redis-tools``, C: ``-c publishers -P window``), a
    reply = written and fsynced by the AOF;
  - NATS JetStream (Debian ``nats-server -js``, file storage): ``js.publish`` with a window awaiting acks per
    client (nats-py). NATS 2.9 has no per-message fsync option (``sync_interval`` came with 2.10): its acks mean
    written to the OS, fsynced every 2 minutes; recorded as ``nats_fsync_per_message: false``. Its client is
    Python (no compiled NATS client is packaged here): its figures may be its client's.
  Why compiled clients: a Python client costs 10-46 µs of CPU per message on this machine; until 2026-12-01 the
  append runs used redis-py, which held Redis Streams to its own pace (93-96 % of a CPU at 20-36k msg/s while
  redis-server used a quarter of one; ``redis-benchmark`` drives the same server at 53-120k). The CPU of each
  system's client per message is recorded (``append_client_cpu_us_per_msg_...``), so a client-bound figure shows.
  Figure: messages/s = count / (last ack - first send), as ``append_msgs_per_s_w<window>`` for 4 publishers and
  ``append_msgs_per_s_p<publishers>_w<window>`` for the others. Target: fanout >= 1.0x Redis (reported per run).
  For fanout also the CPU µs per appended message of each process role (``append_cpu_us_per_msg_...``, same
  suffixes: node, dispatcher, replica, raylet, ..., and ``client``: the cfleet processes and this one), from
  ``/proc`` and cfleet's own report. The paced publishing of the ``lag`` phase and the consumers stay Python
  (the project's codec on raw asyncio sockets, redis-py, nats-py).
- ``consume``: one group reads all ``count`` messages from the start and acknowledges them, in pages:
  fanout through the dispatchers' ``topic_read`` / ``topic_commit`` (:func:`fanout.topics.consume.consume`, as
  ``fanout consume --ack`` does, ``page`` entries per partition per call), Redis ``XREADGROUP COUNT page`` +
  pipelined ``XACK``, NATS a durable pull consumer ``fetch(page)`` acknowledging each message. Target: fanout >=
  50,000 messages/s per group.
- ``lag``: the consumer is away while ``RATE`` msg/s are published for ``outage_s`` (10 s quick, 60 s full; the
  publishers use the deep window so that the rate is reachable, ``outage_rate_achieved`` says what was); then it
  comes back and the time until it has acknowledged everything is the drain time. Target: <= 10 s.

The machine is shared (2 cores): the load average at start and end of each phase is recorded.

Run alone: ``python -m benchmarks.topics_bench [--quick]`` (needs ``make peers``); ``--only fanout --append-only``
runs the append phase of one system alone (``topics_bench[_quick]_append.json``), for A/B runs of the append path.
"""
from __future__ import annotations

import asyncio
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Awaitable, Callable

from .harness.plots import grouped_bars, pyplot, save_figure
from .harness.processes import free_port
from .harness.results import bench_parser, load_avg, log, result_name, run_header, save_result

NAME = "topics_bench"
MSG_SIZE = 1024
PUBLISHERS = 4
WINDOW = 32  # unacknowledged messages per publisher by default
WINDOWS = (32, 256)  # the append phase runs at each: a paho-like client, and a deeply pipelining one
# (publishers, window) of the append runs: PUBLISHERS at each of WINDOWS, then many paho-like publishers
APPEND_RUNS = tuple((PUBLISHERS, w) for w in WINDOWS) + ((16, 32), (64, 32))
APPEND_CLIENTS = {"fanout": "cfleet publish (C), one process per publisher",
                  "redis": "redis-benchmark (C), -c publishers -P window",
                  "nats": "nats-py (Python), in the benchmark process"}
VINS = 1000
PAGE = 2000
RATE = 5000
TARGET_APPEND_X_REDIS = 1.0
TARGET_CONSUME = 50_000
TARGET_DRAIN_S = 10.0
SYSTEMS = ("fanout", "redis", "nats")
_ALL_SYSTEMS = SYSTEMS  # --only narrows SYSTEMS; such a run writes topics_bench_partial (harness.results.result_name)
APPEND_ONLY = False  # --append-only: the append phase alone (A/B runs of an append-path change)
DIRECT_CHANNELS = True  # cluster.direct_channels of the fanout subject (--ray-calls: false, the A/B of the channels)


def append_suffix(publishers: int, window: int) -> str:
    """The suffix of an append run's keys in the JSON: ``w32`` for :data:`PUBLISHERS` publishers (the keys of every
    earlier result), ``p16_w32`` for other counts."""
    return f"w{window}" if publishers == PUBLISHERS else f"p{publishers}_w{window}"


def _topics(n: int = VINS) -> list[str]:
    return [f"ecp/BENCH{i:012d}/response" for i in range(n)]


class Paced:
    """A publisher's schedule: ``count`` messages, at most ``window`` unacknowledged, at most ``rate`` per second
    (None: as fast as acks allow)."""

    def __init__(self, count: int, rate: float | None) -> None:
        self.count = count
        self.rate = rate
        self.t0 = time.perf_counter()

    async def wait_turn(self, i: int) -> None:
        if self.rate:
            due = self.t0 + i / self.rate
            delay = due - time.perf_counter()
            if delay > 0:
                await asyncio.sleep(delay)


# -- fanout ---------------------------------------------------------------------------------------------------

class MqttPublisher(asyncio.Protocol):
    """A raw MQTT 3.1.1 QoS 1 publisher on the project's codec, ``window`` PUBLISHes unacknowledged at most."""

    def __init__(self, client_id: str, topics: list[bytes], payload: bytes, window: int) -> None:
        from fanout.mqtt.codec import PacketReader

        self.client_id, self.topics, self.payload, self.window = client_id, topics, payload, window
        self.reader = PacketReader()
        loop = asyncio.get_running_loop()
        self.connack: asyncio.Future = loop.create_future()
        self.room = asyncio.Event()
        self.acked = 0
        self.sent = 0
        self.transport: Any = None

    def connection_made(self, transport: Any) -> None:
        from fanout.mqtt.codec import encode
        from fanout.mqtt.packets import Connect

        self.transport = transport
        transport.write(encode(Connect(self.client_id, clean_session=True, keepalive=300)))

    def data_received(self, data: bytes) -> None:
        from fanout.mqtt.packets import Connack, Puback

        for p in self.reader.feed(data):
            if type(p) is Puback:
                self.acked += 1
            elif type(p) is Connack and not self.connack.done():
                self.connack.set_result(p.return_code)
        self.room.set()

    def connection_lost(self, exc: Exception | None) -> None:
        if not self.connack.done():
            self.connack.set_exception(ConnectionError(str(exc)))
        self.room.set()

    async def run(self, count: int, rate: float | None, offset: int) -> None:
        from fanout.mqtt.codec import encode_publish

        paced = Paced(count, rate)
        n = len(self.topics)
        for i in range(count):
            await paced.wait_turn(i)
            while self.sent - self.acked >= self.window:
                self.room.clear()
                if self.transport.is_closing():
                    raise ConnectionError(f"{self.client_id}: connection closed")
                await asyncio.wait_for(self.room.wait(), 60)
            self.transport.write(encode_publish(self.topics[(offset + i) % n], self.payload, 1, False, False,
                                                self.sent % 65535 + 1))
            self.sent += 1
        while self.acked < self.sent:
            self.room.clear()
            await asyncio.wait_for(self.room.wait(), 60)


async def _mqtt_publish(port: int, count: int, rate: float | None, tag: str, window: int = WINDOW,
                        publishers: int = PUBLISHERS) -> float:
    loop = asyncio.get_running_loop()
    topics = [t.encode() for t in _topics()]
    payload = b"x" * MSG_SIZE
    pubs = []
    for k in range(publishers):
        _t, pub = await loop.create_connection(
            lambda k=k: MqttPublisher(f"{tag}-{k}", topics, payload, window), "127.0.0.1", port)
        assert await asyncio.wait_for(pub.connack, 30) == 0
        pubs.append(pub)
    per = count // publishers
    started = time.perf_counter()
    try:
        await asyncio.gather(*(p.run(per, rate / publishers if rate else None, k * 7) for k, p in enumerate(pubs)))
    finally:
        for p in pubs:
            p.transport.close()
    return per * publishers / (time.perf_counter() - started)


# -- compiled clients of the append runs (see the module docstring) --------------------------------------------

async def _client_process(argv: list[str]) -> str:
    """Run one client process to its end; its stdout.

    No ``preexec_fn`` (``die_with_parent``): without one the child is started by ``vfork``, not by copying this
    process (~200 MB with Ray's client loaded, several ms per fork: 64 publishers would start over most of a second
    of a run); the clients end by themselves within their time cap.

    Raises:
        RuntimeError: it exited non-zero (the message carries the end of its stderr).
    """
    proc = await asyncio.create_subprocess_exec(*argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                                stderr=subprocess.PIPE)
    out, err = await asyncio.wait_for(proc.communicate(), 300)
    if proc.returncode != 0:
        raise RuntimeError(f"{Path(argv[0]).name} exited {proc.returncode}: {err.decode(errors='replace')[-500:]}")
    return out.decode()


def _children_cpu_s() -> float:
    import resource

    ru = resource.getrusage(resource.RUSAGE_CHILDREN)  # every child that ended and was waited for
    return ru.ru_utime + ru.ru_stime


async def cfleet_publishers(port: int, count: int, window: int, publishers: int,
                            tag: str) -> tuple[float, float, int]:
    """``publishers`` ``cfleet publish`` processes at once, ``window`` QoS 1 PUBLISHes unacknowledged each, together
    at least ``count`` 1 KB messages round robin over their VINs' topics ``ecp/<VIN>/response`` (:data:`VINS` topics
    shared out between them, as the Python publishers and redis-benchmark use).

    Returns:
        (messages/s from the first PUBLISH to the last PUBACK over all of them, their CPU seconds together, the
        messages: ``count`` rounded up to whole rounds of every publisher's VINs).
    """
    from .cfleet_run import PublishSpec, build, parse_result

    binary = build()
    vins = max(1, VINS // publishers)
    requests = -(-count // (publishers * vins))
    specs = [PublishSpec(port=port, vehicles=vins, requests=requests, window=window, payload=MSG_SIZE,
                         request_prefix="", client_id=f"{tag}-{k}", prefix="BENCH", digits=12, start=k * vins,
                         topic_prefix="ecp/{VIN}/response", time_cap_s=120.0) for k in range(publishers)]
    outs = [parse_result(o) for o in await asyncio.gather(*(_client_process(s.argv(binary)) for s in specs))]
    acked = sum(o["pubacks"] for o in outs)
    if acked != sum(o["publishes"] for o in outs) or any(o["status"] != "done" for o in outs):
        raise RuntimeError(f"cfleet publish: {acked} PUBACKs for {sum(o['publishes'] for o in outs)} publishes, "
                           f"status {sorted({o['status'] for o in outs})}")
    first = min(o["first_publish_unix_us"] for o in outs)
    last = max(o["last_puback_unix_us"] for o in outs)
    return acked * 1e6 / (last - first), sum(o["cpu_s"] for o in outs), acked


async def redis_benchmark(port: int, count: int, window: int, publishers: int) -> tuple[float, float]:
    """``redis-benchmark`` XADDing ``count`` 1 KB entries to ``responses``: ``publishers`` connections, each
    pipelining ``window`` XADDs per round trip, over :data:`VINS` topics.

    Returns:
        (requests/s as redis-benchmark reports them, its CPU seconds).
    """
    import csv

    binary = shutil.which("redis-benchmark") or "/usr/bin/redis-benchmark"
    cpu0 = _children_cpu_s()
    out = await _client_process([binary, "-h", "127.0.0.1", "-p", str(port), "-c", str(publishers), "-P",
                                 str(window), "-n", str(count), "-r", str(VINS), "--csv", "XADD", "responses", "*",
                                 "topic", "ecp/BENCH__rand_int__/response", "payload", "x" * MSG_SIZE])
    rows = [r for r in csv.reader(out.splitlines()) if len(r) > 1]
    if len(rows) < 2 or rows[0][1] != "rps":
        raise RuntimeError(f"redis-benchmark printed no rps: {out[-300:]!r}")
    return float(rows[-1][1]), _children_cpu_s() - cpu0


class FanoutSubject:
    """A fanout cluster in this process's Ray with the durable topic ``responses`` (``ecp/+/response``)."""

    def __init__(self, tmp: Path) -> None:
        import dataclasses

        import ray

        from actors.ray_observability import system_config
        from cluster.runtime import start_fanout
        from fanout.config import load_config
        from storage.topics import TopicSpec

        cfg = load_config(None, env={}).replace("mqtt", host="127.0.0.1", port=0, sys_interval="0s")
        cfg = cfg.replace("storage", data_dir=str(tmp / "data")).replace("http", port=0)
        cfg = cfg.replace("fanout", gc_interval="0s", replicas=1, min_replicas_to_ack=1)
        cfg = cfg.replace("cluster", direct_channels=DIRECT_CHANNELS)
        cfg = dataclasses.replace(cfg, topics=(TopicSpec.build("responses", "ecp/+/response"),))
        self.client_cpu_s = 0.0  # of the compiled publishers so far
        self.appended = 0  # messages of the last append
        ray.init(address="local", num_cpus=2, include_dashboard=False, object_store_memory=200 << 20,
                 resources={"fanout_node": 1}, log_to_driver=False, configure_logging=False,
                 _system_config=system_config(cfg))  # as `fanout up` starts Ray
        try:
            self.fanout = start_fanout(cfg, name="topics-bench", log_to_driver=False)
        except BaseException:
            ray.shutdown()
            raise
        self.port = self.fanout.port
        self.shards = self.fanout.info["shards"]  # recorded in the JSON: the default count depends on the CPUs
        from cluster.cli.consume import ControllerSource

        self.source = ControllerSource(self.fanout.controller)

    def cpu_by_role(self) -> dict[str, float]:
        """CPU seconds so far of this process (the benchmark's MQTT publishers and consumer: ``client``) and of
        every Ray process under it, summed per role (node, dispatcher, replica, raylet, ...)."""
        import psutil

        from .harness.cluster import _role
        from .harness.processes import proc_cpu_seconds

        out: dict[str, float] = {"client": proc_cpu_seconds(os.getpid()) + self.client_cpu_s}
        for child in psutil.Process().children(recursive=True):
            try:
                cmd = child.cmdline()
                role = "replica" if cmd and cmd[0].startswith("ray::StoreReplica") else _role(cmd)
                out[role] = out.get(role, 0.0) + proc_cpu_seconds(child.pid)
            except (psutil.NoSuchProcess, psutil.AccessDenied, FileNotFoundError, ProcessLookupError):
                continue
        return out

    def close(self) -> None:
        import ray

        try:
            self.fanout.stop(shutdown_ray=False)
        finally:
            ray.shutdown()

    async def append(self, count: int, rate: float | None = None, tag: str = "a", window: int = WINDOW,
                     publishers: int = PUBLISHERS) -> float:
        if rate is not None:  # the lag phase's paced publishing
            self.appended = count // publishers * publishers
            return await _mqtt_publish(self.port, count, rate, f"fanout-{tag}", window, publishers)
        msgs_per_s, cpu_s, self.appended = await cfleet_publishers(self.port, count, window, publishers,
                                                                   f"fanout-{tag}")
        self.client_cpu_s += cpu_s
        return msgs_per_s

    def consume(self, group: str, limit: int | None = None) -> tuple[int, float]:
        from fanout.topics.consume import consume

        started = time.perf_counter()
        r = consume(self.source, "responses", group, start="earliest", limit=limit, ack=True, page=PAGE,
                    emit=lambda p, e: None)
        return r.emitted, time.perf_counter() - started


# -- Redis Streams ---------------------------------------------------------------------------------------------

class RedisSubject:
    """``redis-server`` with ``appendonly yes``, ``appendfsync always``; one stream ``responses``."""

    def __init__(self, tmp: Path) -> None:
        binary = shutil.which("redis-server") or "/usr/bin/redis-server"
        self.port = free_port()
        self.dir = tmp / "redis"
        self.dir.mkdir()
        self.proc = subprocess.Popen([binary, "--port", str(self.port), "--bind", "127.0.0.1", "--dir", str(self.dir),
                                      "--appendonly", "yes", "--appendfsync", "always", "--save", "",
                                      "--protected-mode", "no"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        _wait_port(self.port)
        self.client_cpu_s = 0.0  # of redis-benchmark so far
        self.appended = 0  # messages of the last append

    def close(self) -> None:
        self.proc.terminate()
        self.proc.wait(10)

    async def append(self, count: int, rate: float | None = None, tag: str = "a", window: int = WINDOW,
                     publishers: int = PUBLISHERS) -> float:
        import redis.asyncio as aioredis

        if rate is None:
            r = aioredis.Redis(host="127.0.0.1", port=self.port)
            try:  # redis-benchmark rounds -n up to whole pipelines: the stream says how many it appended
                before = await r.xlen("responses")
                msgs_per_s, cpu_s = await redis_benchmark(self.port, count, window, publishers)
                self.appended = await r.xlen("responses") - before
            finally:
                await r.aclose()
            self.client_cpu_s += cpu_s
            return msgs_per_s
        self.appended = count // publishers * publishers  # the lag phase's paced publishing: redis-py

        topics = _topics()
        payload = b"x" * MSG_SIZE
        clients = [aioredis.Redis(host="127.0.0.1", port=self.port) for _ in range(publishers)]
        per = count // publishers

        async def one(k: int, r: Any) -> None:
            paced = Paced(per, rate / publishers if rate else None)
            i = 0
            while i < per:  # a window of XADDs in one pipeline round trip, as a pipelining client does
                n = min(window, per - i)
                await paced.wait_turn(i + n - 1)
                pipe = r.pipeline(transaction=False)
                for j in range(i, i + n):
                    pipe.xadd("responses", {"topic": topics[(k * 7 + j) % VINS], "payload": payload})
                await pipe.execute()
                i += n

        started = time.perf_counter()
        try:
            await asyncio.gather(*(one(k, r) for k, r in enumerate(clients)))
        finally:
            for r in clients:
                await r.aclose()
        return per * publishers / (time.perf_counter() - started)

    async def consume(self, group: str, limit: int | None = None) -> tuple[int, float]:
        import redis.asyncio as aioredis

        r = aioredis.Redis(host="127.0.0.1", port=self.port)
        try:
            try:
                await r.xgroup_create("responses", group, id="0")
            except Exception as exc:  # BUSYGROUP: it exists
                if "BUSYGROUP" not in str(exc):
                    raise
            started = time.perf_counter()
            got = 0
            while limit is None or got < limit:
                resp = await r.xreadgroup(group, "c1", {"responses": ">"}, count=PAGE)
                if not resp or not resp[0][1]:
                    break
                ids = [i for i, _fields in resp[0][1]]
                await r.xack("responses", group, *ids)
                got += len(ids)
            return got, time.perf_counter() - started
        finally:
            await r.aclose()


# -- NATS JetStream -------------------------------------------------------------------------------------------

class NatsSubject:
    """``nats-server -js`` with file storage; stream ``responses`` on subjects ``ecp.*.response``."""

    def __init__(self, tmp: Path) -> None:
        binary = shutil.which("nats-server") or "/usr/sbin/nats-server"
        self.port = free_port()
        self.dir = tmp / "nats"
        self.dir.mkdir()
        self.proc = subprocess.Popen([binary, "-js", "-sd", str(self.dir), "-a", "127.0.0.1", "-p", str(self.port)],
                                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        _wait_port(self.port)
        self._ready = False
        self.client_cpu_s = 0.0  # nats-py in this process, during the appends
        self.appended = 0  # messages of the last append

    def close(self) -> None:
        self.proc.terminate()
        self.proc.wait(10)

    async def _connect(self) -> Any:
        import nats
        from nats.js.api import StorageType, StreamConfig

        nc = await nats.connect(f"nats://127.0.0.1:{self.port}")
        js = nc.jetstream()
        if not self._ready:
            await js.add_stream(StreamConfig(name="responses", subjects=["ecp.*.response"], storage=StorageType.FILE))
            self._ready = True
        return nc, js

    async def append(self, count: int, rate: float | None = None, tag: str = "a", window: int = WINDOW,
                     publishers: int = PUBLISHERS) -> float:
        subjects = [t.replace("/", ".") for t in _topics()]
        payload = b"x" * MSG_SIZE
        conns = [await self._connect() for _ in range(publishers)]
        per = count // publishers
        self.appended = per * publishers

        async def one(k: int, js: Any) -> None:
            paced = Paced(per, rate / publishers if rate else None)
            i = 0
            while i < per:  # a window of publishes awaiting their acks at once
                n = min(window, per - i)
                await paced.wait_turn(i + n - 1)
                await asyncio.gather(*(js.publish(subjects[(k * 7 + j) % VINS], payload) for j in range(i, i + n)))
                i += n

        started = time.perf_counter()
        cpu0 = time.process_time()
        try:
            await asyncio.gather(*(one(k, js) for k, (_nc, js) in enumerate(conns)))
        finally:
            for nc, _js in conns:
                await nc.close()
        self.client_cpu_s += time.process_time() - cpu0
        return per * publishers / (time.perf_counter() - started)

    async def consume(self, group: str, limit: int | None = None) -> tuple[int, float]:
        import nats.errors
        from nats.js.api import AckPolicy, ConsumerConfig, DeliverPolicy

        nc, js = await self._connect()
        try:
            sub = await js.pull_subscribe("ecp.*.response", durable=group, stream="responses",
                                          config=ConsumerConfig(ack_policy=AckPolicy.EXPLICIT,
                                                                deliver_policy=DeliverPolicy.ALL,
                                                                max_ack_pending=PAGE * 4))
            started = time.perf_counter()
            got = 0
            while limit is None or got < limit:
                try:
                    msgs = await sub.fetch(PAGE, timeout=1.0)
                except (nats.errors.TimeoutError, asyncio.TimeoutError):
                    break
                for m in msgs:
                    await m.ack()
                got += len(msgs)
            elapsed = time.perf_counter() - started
            return got, max(1e-9, elapsed - (1.0 if limit is None else 0.0))  # the final empty fetch's timeout
        finally:
            await nc.close()


def _wait_port(port: int, timeout_s: float = 20.0) -> None:
    import socket

    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
            return
        except OSError:
            time.sleep(0.05)
    raise RuntimeError(f"nothing listens on 127.0.0.1:{port} after {timeout_s}s")


# -- phases ---------------------------------------------------------------------------------------------------

async def _maybe(x: Any) -> Any:
    return await x if asyncio.iscoroutine(x) else x


async def _drain(subject: Any, group: str, expected: int) -> tuple[int, float]:
    """Consume until ``expected`` messages were acknowledged; returns (messages, seconds)."""
    started = time.perf_counter()
    got = 0
    while got < expected and time.perf_counter() - started < 300:
        n, _s = await _maybe(subject.consume(group))
        got += n
        if n == 0:
            await asyncio.sleep(0.05)
    return got, time.perf_counter() - started


async def run_system(name: str, make: Callable[[], Any], count: int, outage_s: float) -> dict[str, Any]:
    out: dict[str, Any] = {"load_avg_1m_start": load_avg()[0]}
    with tempfile.TemporaryDirectory(prefix=f"topics-bench-{name}-") as tmp:
        subject = make(Path(tmp))
        if getattr(subject, "shards", None):
            out["shards"] = subject.shards
        try:
            await subject.append(min(2000, count), tag="warm")  # warm-up (connections, first fsyncs)
            for p, w in APPEND_RUNS:
                cpu = getattr(subject, "cpu_by_role", None)
                before = cpu() if cpu else None
                sfx = append_suffix(p, w)
                client0 = subject.client_cpu_s
                out[f"append_msgs_per_s_{sfx}"] = round(await subject.append(count, tag=f"run{p}x{w}", window=w,
                                                                            publishers=p))
                n = subject.appended  # count, or a little more or less: whole rounds of every publisher
                out[f"append_client_cpu_us_per_msg_{sfx}"] = round(1e6 * (subject.client_cpu_s - client0) / n, 1)
                log(NAME, f"{name} append ({p} publishers, window {w}): {out[f'append_msgs_per_s_{sfx}']:,} msg/s, "
                          f"client {out[f'append_client_cpu_us_per_msg_{sfx}']} µs/msg")
                if cpu:  # CPU µs per appended message per process role (ticks of 10 ms: whole phases only)
                    after = cpu()
                    per = {k: round(1e6 * (after[k] - before.get(k, 0.0)) / n, 1) for k in after}
                    out[f"append_cpu_us_per_msg_{sfx}"] = {k: v for k, v in sorted(per.items()) if v > 0}
                    log(NAME, f"{name} append CPU µs/msg ({p} x {w}): {out[f'append_cpu_us_per_msg_{sfx}']}")
            if APPEND_ONLY:
                return out
            await _maybe(subject.consume("warm"))  # the warm-up group reads everything once (caches)
            n, s = await _maybe(subject.consume("bench"))
            out["consume_msgs"] = n
            out["consume_msgs_per_s"] = round(n / s) if s > 0 else None
            log(NAME, f"{name} consume: {n:,} messages at {out['consume_msgs_per_s']:,} msg/s")
            # lag: the "bench" group is caught up; it goes away while RATE msg/s are published for outage_s
            backlog = int(RATE * outage_s)
            t0 = time.perf_counter()
            achieved = await subject.append(backlog, rate=RATE, tag="outage", window=max(WINDOWS))
            out["outage_publish_s"] = round(time.perf_counter() - t0, 2)
            out["outage_rate_achieved"] = round(achieved)
            got, drain_s = await _drain(subject, "bench", backlog // PUBLISHERS * PUBLISHERS)
            out["lag_messages"] = got
            out["drain_s"] = round(drain_s, 3)
            log(NAME, f"{name} lag: {got:,} messages published in {out['outage_publish_s']} s "
                      f"({out['outage_rate_achieved']:,}/s) drained in {out['drain_s']} s")
        finally:
            subject.close()
            out["load_avg_1m_end"] = load_avg()[0]
    return out


def plot(result: dict[str, Any], name: str, out_dir: str | Path | None) -> Path:
    plt = pyplot()
    fig, axes = plt.subplots(1, 3, figsize=(14, 4))
    sysd = result["systems"]
    labels = [s for s in SYSTEMS if s in sysd]
    grouped_bars(axes[0], [f"{p} x {w}" for p, w in APPEND_RUNS],
                 {s: [sysd[s].get(f"append_msgs_per_s_{append_suffix(p, w)}") for p, w in APPEND_RUNS] for s in labels},
                 ylabel="msg/s", title="Durable append, 1 KB, publishers x window (fanout, Redis: C clients)")
    for ax, key, title, target, tl in (
            (axes[1], "consume_msgs_per_s", "Group consumption with acks (Python clients)", TARGET_CONSUME,
             "50,000/s target"),
            (axes[2], "drain_s", f"Drain after a {result['outage_s']:.0f} s outage at {RATE:,}/s", TARGET_DRAIN_S,
             "10 s target")):
        grouped_bars(ax, labels, {key: [sysd[s].get(key) for s in labels]}, ylabel=key, title=title, target=target,
                     target_label=tl)
    return save_figure(fig, name, out_dir)


def run(quick: bool = False, *, out_dir: str | Path | None = None) -> dict[str, Any]:
    os.environ.setdefault("FANOUT_LOG_LEVEL", "warning")
    from fanout import log as fanout_log

    fanout_log.configure(level=os.environ["FANOUT_LOG_LEVEL"])
    started = time.time()
    count = 20_000 if quick else 100_000
    outage_s = 10.0 if quick else 60.0
    result: dict[str, Any] = {**run_header(NAME, quick, started), "count": count, "msg_size": MSG_SIZE,
                              "publishers": PUBLISHERS, "windows": list(WINDOWS),
                              "append_runs": [list(r) for r in APPEND_RUNS], "lag_window": WINDOW, "page": PAGE,
                              "rate": RATE,
                              "outage_s": outage_s, "vins": VINS, "fanout_replicas": 1, "fanout_min_replicas_to_ack": 1,
                              "redis_appendfsync": "always", "nats_fsync_per_message": False,
                              "append_clients": dict(APPEND_CLIENTS),
                              "fanout_direct_channels": DIRECT_CHANNELS, "systems": {}}
    makers = {"fanout": FanoutSubject, "redis": RedisSubject, "nats": NatsSubject}
    for name in SYSTEMS:
        try:
            result["systems"][name] = asyncio.run(run_system(name, makers[name], count, outage_s))
        except Exception as exc:
            log(NAME, f"{name} failed: {exc!r}")
            result["systems"][name] = {"error": repr(exc)[:500]}
    f, r = result["systems"].get("fanout", {}), result["systems"].get("redis", {})
    result["ratios"] = {}
    for p, w in APPEND_RUNS:
        sfx = append_suffix(p, w)
        a, b = f.get(f"append_msgs_per_s_{sfx}"), r.get(f"append_msgs_per_s_{sfx}")
        result["ratios"][f"append_fanout_over_redis_{sfx}"] = round(a / b, 3) if a and b else None
    result["targets_met"] = {
        f"append_ge_1x_redis_{append_suffix(p, w)}":
            (result["ratios"][f"append_fanout_over_redis_{append_suffix(p, w)}"] or 0) >= TARGET_APPEND_X_REDIS
        for p, w in APPEND_RUNS
    }
    if not APPEND_ONLY:
        result["targets_met"]["consume_ge_50k"] = (f.get("consume_msgs_per_s") or 0) >= TARGET_CONSUME
        result["targets_met"]["drain_le_10s"] = f.get("drain_s") is not None and f["drain_s"] <= TARGET_DRAIN_S
    result["command"] = "python -m benchmarks.topics_bench" + (" --quick" if quick else "") + (
        " --append-only" if APPEND_ONLY else "")
    # An append-only run has its own file: it must not stand in for the full benchmark's results.
    # --only and --ray-calls runs are A/B runs too: their own file (result_name's "_partial").
    partial = SYSTEMS != _ALL_SYSTEMS or not DIRECT_CHANNELS
    save_result(result_name(NAME, quick, partial=partial and not APPEND_ONLY) + ("_append" if APPEND_ONLY else ""),
                result, plot, out_dir, started=started)
    return result


def main(argv: list[str] | None = None) -> int:
    global SYSTEMS
    parser = bench_parser(NAME, __doc__)
    parser.add_argument("--only", choices=SYSTEMS, default=None, help="one system only")
    parser.add_argument("--append-only", action="store_true",
                        help="the append phase alone (no consumption, no lag): quicker A/B runs of the append path")
    parser.add_argument("--ray-calls", action="store_true",
                        help="fanout with cluster.direct_channels = false (hot calls as Ray calls), for A/B runs")
    args = parser.parse_args(argv)
    global DIRECT_CHANNELS, APPEND_ONLY
    DIRECT_CHANNELS = not args.ray_calls
    APPEND_ONLY = args.append_only
    if args.only:
        SYSTEMS = (args.only,)
    r = run(args.quick, out_dir=args.out_dir)
    for name, figures in r["systems"].items():
        print(name, figures)
    print("targets:", r["targets_met"])
    return 0


if __name__ == "__main__":
    sys.exit(main())
