"""Lean MQTT load generator for the benchmarks: raw asyncio sockets on the project's codec.

Strategy: one ``asyncio.Protocol`` per connection (:class:`LeanClient`), no tasks or streams per
connection, so one generator process drives thousands of connections and tens of thousands of
messages per second. A publisher keeps a window of ``WINDOW`` QoS 1 publishes unacknowledged by the
broker and at most ``MAX_UNDELIVERED`` not yet received by the subscribers (refilled from
``data_received`` as PUBACKs or deliveries arrive, one ``write`` per refill); a subscriber PUBACKs every
QoS 1 PUBLISH a read returned in one ``write`` (PUBACK bytes are prebuilt per packet id) and counts it
in a shared :class:`Tally`. Each payload starts with the send time (``perf_counter_ns``), so
end-to-end latency needs no extra packets. With ``mqtt5=True`` a client speaks MQTT 5: its publisher keeps at
most the server's Receive Maximum unacknowledged (when lower than ``WINDOW``) and, with ``topic_aliases``, sends
each topic once with a Topic Alias (within the server's Topic Alias Maximum) and then the alias alone; a
subscriber with ``topic_aliases`` announces that many as its Topic Alias Maximum, so the broker may alias too
(the generator reads only payloads). A PUBACK with reason code 0 is the same 4 bytes in both versions. Every wait is bounded by progress (:func:`bounded`,
:func:`wait_progress`): a run that stops moving for ``STALL_S`` seconds raises ``TimeoutError``
instead of hanging. The same code drives every broker, so the generator's own cost is the same for
all of them. :func:`paho_1to1` drives the same 1 -> 1 load through paho-mqtt clients.
"""
from __future__ import annotations

import asyncio
import struct
import sys
import threading
import time
from typing import Any, Awaitable, Callable, Sequence, TypeVar

from fanout.mqtt.codec import PacketReader, encode, encode_puback, encode_publish
from fanout.mqtt.encoder5 import encode_publish5
from fanout.mqtt.packets import Connack, Connect, Puback, Publish, Suback, Subscribe
from fanout.mqtt.packets5 import Connack5, Connect5, Puback5, Publish5, Suback5, Subscribe5, Subscription
from fanout.mqtt.properties import EMPTY_PROPERTIES, Properties
from fanout.mqtt.property_block import topic_alias_property

T = TypeVar("T")

WINDOW = 128  # unacknowledged QoS 1 publishes a publisher keeps in flight
MAX_UNDELIVERED = 1024  # published but not yet received by a subscriber: bounds the broker's queues
PAYLOAD_SIZE = 64  # bytes; the first 8 carry the send time (perf_counter_ns)
STALL_S = 30.0  # a wait without progress for this long fails
CONNECT_CONCURRENCY = 200  # TCP connects + CONNECTs in progress at once

_PAD = bytes(PAYLOAD_SIZE - 8)
_TS = struct.Struct("<q")
_now_ns = time.perf_counter_ns
_PUBACKS: list[bytes] = []


def pubacks() -> list[bytes]:
    """PUBACK packets for every packet id, built once (index = packet id)."""
    if not _PUBACKS:
        _PUBACKS.extend([b""] + [encode_puback(i) for i in range(1, 65536)])
    return _PUBACKS


# ---------------------------------------------------------------------------------------------------
# lean load generator


class Tally:
    """Messages received by a group of subscribers, with latencies and a future set at ``expected``.

    ``publisher`` (set by :meth:`LeanClient.publish`) is refilled as messages arrive when it waits on
    ``MAX_UNDELIVERED``.
    """

    __slots__ = ("received", "expected", "done", "latencies_ns", "last_ns", "publisher")

    def __init__(self) -> None:
        self.received = 0
        self.expected = 0
        self.done: asyncio.Future[None] | None = None
        self.latencies_ns: list[int] = []
        self.last_ns = 0
        self.publisher: LeanClient | None = None

    def arm(self, expected: int) -> None:
        """Start counting a new run of ``expected`` messages."""
        self.received = 0
        self.expected = expected
        self.latencies_ns = []
        self.done = asyncio.get_running_loop().create_future()

    def check(self, now_ns: int) -> None:
        """Resolve ``done`` once ``expected`` messages arrived (``now_ns`` is the last arrival)."""
        if self.received >= self.expected and self.done is not None and not self.done.done():
            self.last_ns = now_ns
            self.done.set_result(None)


class LeanClient(asyncio.Protocol):
    """One raw MQTT connection on the project's codec; PUBACKs QoS 1 PUBLISHes as it reads them.

    Args:
        mqtt5: speak MQTT 5 instead of 3.1.1.
        topic_aliases: MQTT 5 only: topic aliases to use (publisher) and to accept (subscriber); 0 = none.
    """

    def __init__(self, client_id: str, tally: Tally | None = None, keepalive: int = 300, *, mqtt5: bool = False,
                 topic_aliases: int = 0) -> None:
        loop = asyncio.get_running_loop()
        self.client_id = client_id
        self.tally = tally
        self.keepalive = keepalive
        self.mqtt5 = mqtt5
        self.topic_aliases = topic_aliases if mqtt5 else 0
        self.window = WINDOW  # lowered to the server's Receive Maximum (MQTT 5)
        self.server_aliases = 0  # the server's Topic Alias Maximum (MQTT 5)
        self._parts: list[tuple[bytes, bytes]] = []  # per topic: (topic or b"" once aliased, properties body)
        self.reader = PacketReader(protocol_level=5 if mqtt5 else 4)
        self.transport: asyncio.Transport | None = None
        self.connack: asyncio.Future[int] = loop.create_future()
        self.suback: asyncio.Future[tuple[int, ...]] | None = None
        self.lost: asyncio.Future[None] = loop.create_future()
        # publisher state
        self.sent = self.acked = self.outstanding = self.limit = self.base = 0
        self.blocked = False  # waiting for subscribers (MAX_UNDELIVERED), not for PUBACKs
        self.topics: list[bytes] = []
        self.delivered: Tally | None = None
        self.acked_all: asyncio.Future[None] | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        if self.mqtt5:
            props = Properties(topic_alias_maximum=self.topic_aliases) if self.topic_aliases else EMPTY_PROPERTIES
            connect: Any = Connect5(self.client_id, True, self.keepalive, properties=props)
        else:
            connect = Connect(self.client_id, clean_session=True, keepalive=self.keepalive)
        self.transport.write(encode(connect))  # type: ignore[union-attr]

    def connection_lost(self, exc: Exception | None) -> None:
        if not self.lost.done():
            self.lost.set_result(None)
        for fut in (self.connack, self.suback, self.acked_all, self.tally.done if self.tally else None):
            if fut is not None and not fut.done():
                fut.set_exception(ConnectionError(f"{self.client_id}: connection lost ({exc})"))

    def data_received(self, data: bytes) -> None:
        acks: list[bytes] = []
        pubacks = 0
        tally = self.tally
        now = _now_ns()
        for p in self.reader.feed(data):
            tp = type(p)
            if tp is Publish or tp is Publish5:
                if p.qos:
                    acks.append(_PUBACKS[p.packet_id])  # type: ignore[index]
                if tally is not None:
                    tally.latencies_ns.append(now - _TS.unpack_from(p.payload)[0])  # type: ignore[attr-defined]
                    tally.received += 1
            elif tp is Puback or tp is Puback5:
                pubacks += 1
            elif tp is Connack:
                if not self.connack.done():
                    self.connack.set_result(p.return_code)  # type: ignore[attr-defined]
            elif tp is Connack5:
                props = p.properties  # type: ignore[attr-defined]
                self.window = min(WINDOW, props.receive_maximum or 65535)
                self.server_aliases = props.topic_alias_maximum or 0
                if not self.connack.done():
                    self.connack.set_result(p.reason_code)  # type: ignore[attr-defined]
            elif tp is Suback or tp is Suback5:
                if self.suback is not None and not self.suback.done():
                    codes = p.return_codes if tp is Suback else p.reason_codes  # type: ignore[attr-defined]
                    self.suback.set_result(tuple(codes))
        if acks:
            self.transport.write(b"".join(acks))  # type: ignore[union-attr]
        if pubacks:
            self.acked += pubacks
            self.outstanding -= pubacks
            self._fill()
        if tally is not None:
            pub = tally.publisher
            if pub is not None and pub.blocked:
                pub._fill()
            tally.check(now)

    async def subscribe(self, topic: str, timeout: float) -> None:
        self.suback = asyncio.get_running_loop().create_future()
        sub = Subscribe5(1, (Subscription(topic, 1),)) if self.mqtt5 else Subscribe(1, ((topic, 1),))
        self.transport.write(encode(sub))  # type: ignore[union-attr]
        codes = await asyncio.wait_for(self.suback, timeout)
        if codes != (1,):
            raise RuntimeError(f"{self.client_id}: SUBACK {codes} for {topic!r}, expected (1,)")

    def publish(self, count: int, topics: list[bytes], delivered: Tally) -> None:
        """Start sending ``count`` QoS 1 messages round robin over ``topics``.

        At most ``WINDOW`` are unacknowledged by the broker and at most ``MAX_UNDELIVERED`` are not yet
        counted by ``delivered`` (the subscribers' tally, armed by the caller).
        """
        if self.mqtt5 and topics is not self.topics:  # the aliases set on this connection so far stay valid
            aliases = min(self.topic_aliases, self.server_aliases)
            self._parts = [(t, topic_alias_property(k + 1) if k < aliases else b"") for k, t in enumerate(topics)]
        self.topics = topics
        self.base = self.sent
        self.limit = self.sent + count
        self.delivered = delivered
        delivered.publisher = self
        self.acked_all = asyncio.get_running_loop().create_future()
        self._fill()

    def stop(self) -> None:
        """Send nothing more; ``delivered`` now expects only what was sent, ``acked_all`` what was sent."""
        self.limit = self.sent
        if self.delivered is not None:
            self.delivered.expected = self.sent - self.base
            self.delivered.check(_now_ns())
        self._fill()

    def _fill(self) -> None:
        out: list[bytes] = []
        sent, limit, topics = self.sent, self.limit, self.topics
        n_topics = len(topics)
        room = min(self.window - self.outstanding, limit - sent)
        delivered = self.delivered
        if delivered is not None:
            undelivered = sent - self.base - delivered.received
            if MAX_UNDELIVERED - undelivered < room:
                room = MAX_UNDELIVERED - undelivered
                self.blocked = room <= 0
        if room > 0:
            ts = _TS.pack(_now_ns()) + _PAD
            if self.mqtt5:
                parts = self._parts
                for i in range(sent, sent + room):
                    k = i % n_topics
                    topic, props = parts[k]
                    out.append(encode_publish5(topic, ts, 1, False, False, i % 65535 + 1, props))
                    if props and topic:
                        parts[k] = (b"", props)  # the alias is set: later publishes carry it alone
            else:
                for i in range(sent, sent + room):
                    out.append(encode_publish(topics[i % n_topics], ts, 1, False, False, i % 65535 + 1))
            self.sent = sent + room
            self.outstanding += room
            self.transport.write(b"".join(out))  # type: ignore[union-attr]
        elif self.acked >= limit and self.acked_all is not None and not self.acked_all.done():
            self.acked_all.set_result(None)


async def connect(host: str, port: int, factory: Callable[[], LeanClient], timeout: float = STALL_S,
                  ssl: Any = None) -> LeanClient:
    """Open one connection (over TLS with an ``ssl`` client context), send CONNECT and wait for a CONNACK 0."""
    loop = asyncio.get_running_loop()
    _, client = await asyncio.wait_for(
        loop.create_connection(factory, host, port, ssl=ssl, server_hostname=host if ssl is not None else None), timeout)
    code = await asyncio.wait_for(client.connack, timeout)
    if code != 0:
        raise RuntimeError(f"{client.client_id}: CONNACK return code {code}")
    return client


async def connect_many(host: str, port: int, factories: Sequence[Callable[[], LeanClient]],
                       progress: list[int], ssl: Any = None) -> list[LeanClient]:
    """Connect one client per factory, ``CONNECT_CONCURRENCY`` at a time; ``progress[0]`` counts them.

    On any failure the clients already connected are closed before the error propagates.
    """
    sem = asyncio.Semaphore(CONNECT_CONCURRENCY)
    made: list[LeanClient] = []

    async def one(factory: Callable[[], LeanClient]) -> LeanClient:
        async with sem:
            client = await connect(host, port, factory, STALL_S, ssl)
            made.append(client)
            progress[0] += 1
            return client

    try:
        return list(await bounded(asyncio.gather(*(one(f) for f in factories)), lambda: progress[0]))
    except BaseException:
        close_all(made)
        raise


async def wait_progress(fut: asyncio.Future[None], progress: Callable[[], int], stall_s: float = STALL_S,
                        max_s: float | None = None) -> bool:
    """Wait for ``fut`` without cancelling it.

    Returns:
        True when ``fut`` completed, False when ``max_s`` seconds passed first.

    Raises:
        TimeoutError: ``progress()`` stayed unchanged for ``stall_s`` seconds.
    """
    start = last_change = time.monotonic()
    last = progress()
    while True:
        done, _ = await asyncio.wait({fut}, timeout=1.0)
        if done:
            fut.result()
            return True
        now = time.monotonic()
        if max_s is not None and now - start >= max_s:
            return False
        current = progress()
        if current != last:
            last, last_change = current, now
        elif now - last_change > stall_s:
            raise TimeoutError(f"no progress for {stall_s:.0f} s (at {current})")


async def bounded(aw: Awaitable[T], progress: Callable[[], int], stall_s: float = STALL_S) -> T:
    """Await ``aw``; fail with TimeoutError if ``progress()`` stays unchanged for ``stall_s``."""
    task = asyncio.ensure_future(aw)
    last, last_change = progress(), time.monotonic()
    try:
        while True:
            done, _ = await asyncio.wait({task}, timeout=1.0)
            if done:
                return task.result()
            now_progress = progress()
            if now_progress != last:
                last, last_change = now_progress, time.monotonic()
            elif time.monotonic() - last_change > stall_s:
                raise TimeoutError(f"no progress for {stall_s:.0f} s (at {now_progress})")
    finally:
        if not task.done():
            task.cancel()


def close_all(clients: Sequence[LeanClient]) -> None:
    """Abort every client connection (no DISCONNECT: the broker sees them drop)."""
    for c in clients:
        if c.transport is not None:
            c.transport.abort()


def percentile_ms(sorted_ns: list[int], q: float) -> float | None:
    """The ``q`` quantile of sorted nanosecond values, in milliseconds (None if empty)."""
    if not sorted_ns:
        return None
    return sorted_ns[min(len(sorted_ns) - 1, int(q * len(sorted_ns)))] / 1e6


CANCEL_WAIT_S = 30.0


def run_async(coro: Awaitable[T], *, cancel_wait_s: float = CANCEL_WAIT_S) -> T:
    """Run ``coro`` to completion on a fresh uvloop event loop (asyncio's when uvloop is missing).

    Like ``asyncio.run``, but the clean-up is bounded: tasks ``coro`` left behind are cancelled and given
    ``cancel_wait_s`` to finish, then reported by name and stack (stderr) and abandoned. ``asyncio.run`` waits
    for them without a bound, and uvloop runs a signal handler as a loop callback whose exception it logs
    instead of raising, so neither Ctrl-C nor pytest-timeout's alarm could end that wait (a quick benchmark
    whose fleet failed hung a test run).
    """
    try:
        import uvloop

        loop = uvloop.new_event_loop()
    except ImportError:  # pragma: no cover - uvloop is a dependency on Linux
        loop = asyncio.new_event_loop()
    try:
        return loop.run_until_complete(coro)
    finally:
        try:
            _cancel_left_behind(loop, cancel_wait_s)
            loop.run_until_complete(loop.shutdown_asyncgens())
            # a thread stuck in a blocking call would make the join wait as long: bounded as well
            loop.run_until_complete(asyncio.wait([loop.create_task(loop.shutdown_default_executor())],
                                                 timeout=cancel_wait_s))
        finally:
            loop.close()


def _cancel_left_behind(loop: asyncio.AbstractEventLoop, wait_s: float) -> None:
    left = asyncio.all_tasks(loop)
    if not left:
        return
    for task in left:
        task.cancel()
    _done, stuck = loop.run_until_complete(asyncio.wait(left, timeout=wait_s))
    for task in stuck:
        print(f"run_async: task {task.get_name()} did not stop within {wait_s:.0f} s of its cancel; abandoned",
              file=sys.stderr)
        task.print_stack(file=sys.stderr)


def paho_1to1(host: str, port: int, count: int, max_s: float, cpu_seconds: Callable[[], float]) -> dict[str, Any]:
    """1 publisher -> 1 subscriber at QoS 1 with paho-mqtt clients used as an application would.

    Two ``paho.mqtt.client.Client`` objects with their network loop threads (``loop_start``) and paho's
    defaults (20 messages in flight); the publisher calls ``publish`` in a loop, holding back only
    when ``MAX_UNDELIVERED`` messages are not yet received, and stops after ``max_s`` seconds.

    Args:
        host, port: the broker.
        count: messages to send (fewer if ``max_s`` passes first).
        max_s: publishing stops after this long; the figures use what arrived.
        cpu_seconds: the broker process's CPU time so far.

    Returns:
        ``paho_throughput_1to1_msg_s`` and companions.
    """
    import paho.mqtt.client as mqtt

    received = [0]
    subscribed, connected = threading.Event(), threading.Event()
    last = [0.0]

    def on_message(client: Any, userdata: Any, msg: Any) -> None:
        received[0] += 1
        last[0] = time.perf_counter()

    sub = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2, client_id="paho-sub", clean_session=True)
    sub.on_message = on_message
    sub.on_subscribe = lambda *a: subscribed.set()
    pub = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2, client_id="paho-pub", clean_session=True)
    pub.on_connect = lambda *a: connected.set()
    clients = []
    try:
        for c in (sub, pub):
            c.connect(host, port, keepalive=300)
            c.loop_start()
            clients.append(c)
        sub.subscribe("bench/paho", qos=1)
        if not (subscribed.wait(STALL_S) and connected.wait(STALL_S)):
            raise TimeoutError("paho: no SUBACK/CONNACK")
        payload = bytes(PAYLOAD_SIZE)
        cpu0 = cpu_seconds()
        t0 = time.perf_counter()
        deadline = t0 + max_s
        sent = 0
        while sent < count:
            if sent - received[0] >= MAX_UNDELIVERED:
                time.sleep(0.0005)
                if time.perf_counter() > deadline:
                    break
                continue
            pub.publish("bench/paho", payload, qos=1)
            sent += 1
            if not sent % 256 and time.perf_counter() > deadline:
                break
        seen, seen_at = -1, time.monotonic()
        while received[0] < sent:
            time.sleep(0.01)
            if received[0] != seen:
                seen, seen_at = received[0], time.monotonic()
            elif time.monotonic() - seen_at > STALL_S:
                raise TimeoutError(f"paho: no progress for {STALL_S:.0f} s (at {received[0]}/{sent})")
        elapsed = last[0] - t0
        return {
            "paho_throughput_1to1_msg_s": sent / elapsed,
            "paho_cpu_us_per_msg_1to1": (cpu_seconds() - cpu0) / sent * 1e6,
            "paho_messages_1to1": sent,
            "time_capped_paho_1to1": sent < count,
            "paho_duration_1to1_s": elapsed,
        }
    finally:
        for c in clients:
            c.disconnect()
            c.loop_stop()
