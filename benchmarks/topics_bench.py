# Over 500 lines: one benchmark of three systems (fanout, Redis Streams, NATS JetStream) with three phases each, kept side by side so that each phase reads the same for all three.
"""Durable topics benchmark (issue 14): append, group consumption and lag after a consumer outage, against Redis
Streams and NATS JetStream in the same run on the same machine.

- ``append``: publishers, each with a window of messages of 1 KB unacknowledged at most, publish ``count``
  messages round robin over ``VINS`` topics ``ecp/<VIN>/response``; one run per ``(publishers, window)`` of
  :data:`APPEND_RUNS`: ``PUBLISHERS`` (4) publishers at each of ``WINDOWS`` (32, as a paho-like client keeps, and 256,
  a deeply pipelining client), then 16 and 64 publishers at window 32 (the "many publishers" of issue 14: many
  platform services or vehicles, each a paho-like client). 4 x 32 keeps 128 messages in flight: there the figure
  is the commit latency of the whole path (docs/topics.md); the others keep 512 or more:
  - fanout: MQTT 3.1.1 QoS 1 (the project's codec on raw asyncio sockets) to a durable topic ``ecp/+/response``;
    a PUBACK comes once the append is fsynced on the primary AND on its replica (``fanout.replicas = 1``,
    ``min_replicas_to_ack = 1``; default config otherwise: the shard count of ``fanout.dispatchers = 0``, 1 on
    2 CPUs);
  - Redis Streams (Debian ``redis-server``, ``appendonly yes``, ``appendfsync always``): ``XADD`` pipelined
    a window deep per client (redis-py asyncio), a reply = written and fsynced by the AOF;
  - NATS JetStream (Debian ``nats-server -js``, file storage): ``js.publish`` with a window awaiting acks per
    client (nats-py). NATS 2.9 has no per-message fsync option (``sync_interval`` came with 2.10): its acks mean
    written to the OS, fsynced every 2 minutes; recorded as ``nats_fsync_per_message: false``.
  Figure: messages/s = count / (last ack - first send), as ``append_msgs_per_s_w<window>`` for 4 publishers and
  ``append_msgs_per_s_p<publishers>_w<window>`` for the others. Target: fanout >= 1.0x Redis (reported per run).
  For fanout also the CPU µs per appended message of each process role (``append_cpu_us_per_msg_...``, same
  suffixes: node, dispatcher, replica, raylet, ..., and ``client``, this process's publishers), from ``/proc``.
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

        out: dict[str, float] = {"client": proc_cpu_seconds(os.getpid())}
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
        return await _mqtt_publish(self.port, count, rate, f"fanout-{tag}", window, publishers)

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

    def close(self) -> None:
        self.proc.terminate()
        self.proc.wait(10)

    async def append(self, count: int, rate: float | None = None, tag: str = "a", window: int = WINDOW,
                     publishers: int = PUBLISHERS) -> float:
        import redis.asyncio as aioredis

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

        async def one(k: int, js: Any) -> None:
            paced = Paced(per, rate / publishers if rate else None)
            i = 0
            while i < per:  # a window of publishes awaiting their acks at once
                n = min(window, per - i)
                await paced.wait_turn(i + n - 1)
                await asyncio.gather(*(js.publish(subjects[(k * 7 + j) % VINS], payload) for j in range(i, i + n)))
                i += n

        started = time.perf_counter()
        try:
            await asyncio.gather(*(one(k, js) for k, (_nc, js) in enumerate(conns)))
        finally:
            for nc, _js in conns:
                await nc.close()
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
                out[f"append_msgs_per_s_{sfx}"] = round(await subject.append(count, tag=f"run{p}x{w}", window=w,
                                                                            publishers=p))
                log(NAME, f"{name} append ({p} publishers, window {w}): {out[f'append_msgs_per_s_{sfx}']:,} msg/s")
                if cpu:  # CPU µs per appended message per process role (ticks of 10 ms: whole phases only)
                    after = cpu()
                    per = {k: round(1e6 * (after[k] - before.get(k, 0.0)) / count, 1) for k in after}
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
                 ylabel="msg/s", title="Durable append, 1 KB, publishers x window (ack = fsynced)")
    for ax, key, title, target, tl in (
            (axes[1], "consume_msgs_per_s", "Group consumption with acks", TARGET_CONSUME, "50,000/s target"),
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
                              "append_runs": [list(r) for r in APPEND_RUNS], "lag_window": WINDOW, "page": PAGE, "rate": RATE,
                              "outage_s": outage_s, "vins": VINS, "fanout_replicas": 1, "fanout_min_replicas_to_ack": 1,
                              "redis_appendfsync": "always", "nats_fsync_per_message": False,
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
