"""What the platform sends in the benchmarks: requests through the platform client, one raw trigger, and
the naive per-vehicle publisher the peers get.

Strategy:

- Every request's payload is ``payload_size`` bytes starting with the fleet's 12-byte send-time header
  (``scripts/fleet/payload.py``), stamped at the moment the platform starts sending that request; the
  fleet's ledger measures each delivery from it. The same stamp is the request's "trigger time".
- This cluster: :class:`PlatformSender` wraps :class:`fanout.client.FanoutClient` (the platform client:
  blob on ``$SDV-FANOUT/data/<sha1>``, trigger on ``$SDV-FANOUT/trigger``, split at 1 MiB, pipelined,
  PUBACK = durable). :func:`raw_trigger` sends one trigger as ONE PUBLISH on a raw socket (the cluster's
  ``mqtt.max_packet_size`` must allow it) and times the PUBLISH-to-PUBACK interval alone.
- Peers: :class:`NaivePublisher` is what a platform does without a fanout service: one QoS 1 PUBLISH per
  vehicle and request on the vehicle's delivery topic ``agent/<VIN>/proxy/request/<request id>``,
  request after request, at most ``window`` unacknowledged (refilled from ``data_received`` as PUBACKs
  arrive, one ``write`` per refill), through the project's codec. The broker acknowledges on receipt and
  queues per subscriber (Mosquitto: ``max_inflight_messages`` 32 per vehicle).
"""
from __future__ import annotations

import asyncio
import json
import os
import tempfile
import time
from dataclasses import dataclass, field
from typing import Any

from fanout.mqtt.codec import PacketReader, encode, encode_publish
from fanout.mqtt.packets import Connack, Connect, Puback

from .fleet import HEADER_SIZE, now_us, stamp

PLATFORM_LOGIN = ("platform", "platform")  # the dev platform login of a loopback listener without users
NAIVE_WINDOW = 128


@dataclass(slots=True)
class Sent:
    """One request as the platform sent it."""

    request_id: str
    vins: int
    sent_us: int
    acked_us: int | None = None
    chunks: int = 1
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def ack_s(self) -> float | None:
        return None if self.acked_us is None else (self.acked_us - self.sent_us) / 1e6


def payload_body(payload_size: int) -> bytes:
    """The bytes after the header (random, so blobs do not compress or deduplicate)."""
    return os.urandom(max(0, payload_size - HEADER_SIZE))


class PlatformSender:
    """The platform client (``FanoutClient``, dev login, fresh outbox in a temporary directory)."""

    def __init__(self, host: str, port: int, *, payload_size: int = 256, ack_timeout_s: float = 120.0) -> None:
        self.host, self.port = host, port
        self.body = payload_body(payload_size)
        self.ack_timeout_s = ack_timeout_s
        self._tmp = tempfile.TemporaryDirectory(prefix="bench-outbox-")
        self.client: Any = None
        self._waiters: list[tuple[Sent, asyncio.Future[None]]] = []

    async def __aenter__(self) -> "PlatformSender":
        from fanout.client import FanoutClient

        # connect_timeout_s: a loaded benchmark machine may answer the CONNECT late; that is no failed phase
        self.client = FanoutClient(self.host, self.port, *PLATFORM_LOGIN, outbox_dir=self._tmp.name,
                                   ack_timeout_s=self.ack_timeout_s, close_timeout_s=30.0, connect_timeout_s=30.0)
        await self.client.start()
        if not self.client.status().connected:
            error = self.client.status().last_error
            await self.__aexit__(None, None, None)  # __aexit__ does not run when __aenter__ raises: stop its tasks
            raise RuntimeError(f"platform client cannot connect to {self.host}:{self.port}: {error}")
        return self

    async def __aexit__(self, *exc: object) -> None:
        for _, w in self._waiters:
            w.cancel()
        try:
            if self.client is not None:
                await self.client.close()
        finally:
            self._tmp.cleanup()

    async def submit(self, request_id: str, vins: list[str]) -> Sent:
        """Stamp a payload, submit blob + trigger; the returned record gets ``acked_us`` on PUBACK."""
        sent = Sent(request_id, len(vins), now_us())
        payload = stamp(self.body, sent.sent_us)
        handle = await self.client.submit(vins, payload, request_id=request_id)

        async def acked() -> None:
            await handle.acked(self.ack_timeout_s)
            sent.acked_us = now_us()
            sent.chunks = max(1, handle.progress()[1] - 1)  # PUBLISH packets minus the blob

        self._waiters.append((sent, asyncio.ensure_future(acked())))
        return sent

    async def all_acked(self, timeout_s: float | None = None) -> None:
        """Wait until every submitted request is acknowledged (durable); raises the first failure."""
        pending = [w for _, w in self._waiters]
        if pending:
            done, rest = await asyncio.wait(pending, timeout=timeout_s or self.ack_timeout_s)
            if rest:
                raise TimeoutError(f"{len(rest)} request(s) not acknowledged within {timeout_s or self.ack_timeout_s:.0f} s")
            for w in done:
                w.result()


class _Conn(asyncio.Protocol):
    """A raw MQTT connection: CONNACK, PUBACK futures by packet id, and a refill callback."""

    def __init__(self, client_id: str, username: str | None = None, password: str | None = None) -> None:
        loop = asyncio.get_running_loop()
        self.client_id, self.username, self.password = client_id, username, password
        self.reader = PacketReader(1 << 28)
        self.transport: asyncio.Transport | None = None
        self.connack: asyncio.Future[int] = loop.create_future()
        self.acks: dict[int, asyncio.Future[float]] = {}
        self.on_pubacks: Any = None
        self.lost: asyncio.Future[None] = loop.create_future()

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        pw = self.password.encode() if self.password else None
        transport.write(encode(Connect(self.client_id, True, 600, self.username, pw, None)))  # type: ignore[attr-defined]

    def connection_lost(self, exc: Exception | None) -> None:
        if not self.lost.done():
            self.lost.set_result(None)
        for fut in [self.connack, *self.acks.values()]:
            if not fut.done():
                fut.set_exception(ConnectionError(f"{self.client_id}: connection lost ({exc})"))

    def data_received(self, data: bytes) -> None:
        n = 0
        for p in self.reader.feed(data):
            tp = type(p)
            if tp is Puback:
                n += 1
                fut = self.acks.pop(p.packet_id, None)  # type: ignore[attr-defined]
                if fut is not None and not fut.done():
                    fut.set_result(time.perf_counter())
            elif tp is Connack and not self.connack.done():
                self.connack.set_result(p.return_code)  # type: ignore[attr-defined]
        if n and self.on_pubacks is not None:
            self.on_pubacks(n)


async def _open(host: str, port: int, client_id: str, login: tuple[str, str] | None, timeout: float = 30.0) -> _Conn:
    loop = asyncio.get_running_loop()
    user, pw = login if login else (None, None)
    _, conn = await asyncio.wait_for(loop.create_connection(lambda: _Conn(client_id, user, pw), host, port), timeout)
    code = await asyncio.wait_for(conn.connack, timeout)
    if code != 0:
        raise RuntimeError(f"{client_id}: CONNACK return code {code}")
    return conn


async def raw_trigger(host: str, port: int, vins: list[str], request_id: str, *, payload_size: int = 256,
                      timeout_s: float = 120.0) -> dict[str, Any]:
    """Publish a blob, then ONE trigger PUBLISH naming every VIN; time the trigger's PUBLISH -> PUBACK.

    Returns:
        ``encode_s`` (JSON + MQTT encoding, not part of the ack time), ``payload_bytes``, ``ack_s`` (from
        the start of the write to the PUBACK), ``sent_us``.
    """
    conn = await _open(host, port, f"bench-raw-{request_id}", PLATFORM_LOGIN)
    try:
        t0 = time.perf_counter()
        sent_us = now_us()
        blob = stamp(payload_body(payload_size), sent_us)
        data_id = f"bench-{request_id}"
        trigger = json.dumps({"ids": vins, "request_id": request_id, "data_id": data_id}).encode()
        packet = encode_publish("$SDV-FANOUT/trigger", trigger, 1, False, False, 2)
        encode_s = time.perf_counter() - t0
        conn.acks[1] = asyncio.get_running_loop().create_future()
        conn.transport.write(encode_publish(f"$SDV-FANOUT/data/{data_id}", blob, 1, False, False, 1))  # type: ignore[union-attr]
        await asyncio.wait_for(conn.acks[1], timeout_s)
        fut = conn.acks[2] = asyncio.get_running_loop().create_future()
        t1 = time.perf_counter()
        conn.transport.write(packet)  # type: ignore[union-attr]
        acked = await asyncio.wait_for(fut, timeout_s)
        return {"encode_s": encode_s, "payload_bytes": len(trigger), "ack_s": acked - t1, "sent_us": sent_us}
    finally:
        conn.transport.close()  # type: ignore[union-attr]


class NaivePublisher:
    """Publishes every request to every vehicle topic at QoS 1, pipelined (see the module docstring)."""

    def __init__(self, host: str, port: int, *, payload_size: int = 256, window: int = NAIVE_WINDOW,
                 topic_prefix: str = "agent/{VIN}/proxy/request") -> None:
        self.host, self.port = host, port
        self.body = payload_body(payload_size)
        self.window = window
        self.topic_prefix = topic_prefix
        self.conn: _Conn | None = None

    async def __aenter__(self) -> "NaivePublisher":
        self.conn = await _open(self.host, self.port, f"bench-naive-{os.getpid()}", None)
        return self

    async def __aexit__(self, *exc: object) -> None:
        if self.conn is not None and self.conn.transport is not None:
            self.conn.transport.close()

    async def publish(self, request_ids: list[str], vins: list[str], *, max_s: float, stall_s: float = 30.0
                      ) -> tuple[list[Sent], bool]:
        """Send ``len(request_ids) * len(vins)`` messages, request after request; wait for every PUBACK.

        Returns:
            (one :class:`Sent` per request started, with ``acked_us`` = when its last PUBACK arrived;
            True when ``max_s`` passed and sending stopped early).
        """
        conn = self.conn
        assert conn is not None and conn.transport is not None
        loop = asyncio.get_running_loop()
        n = len(vins)
        total = len(request_ids) * n
        prefixes = [self.topic_prefix.replace("{VIN}", v) + "/" for v in vins]
        state = {"sent": 0, "acked": 0, "limit": total}
        sents: list[Sent] = []
        done: asyncio.Future[None] = loop.create_future()
        payload = b""
        rid = ""

        def fill(acks: int = 0) -> None:
            nonlocal payload, rid
            before = state["acked"]
            state["acked"] = before + acks
            for k in range(before // n, min(state["acked"] // n, len(sents))):  # requests now fully acked
                sents[k].acked_us = now_us()
            sent, limit = state["sent"], state["limit"]
            room = min(self.window - (sent - state["acked"]), limit - sent)
            if room > 0:
                out = []
                for i in range(sent, sent + room):
                    r, v = divmod(i, n)
                    if v == 0:
                        rid = request_ids[r]
                        sents.append(Sent(rid, n, now_us()))
                        payload = stamp(self.body, sents[-1].sent_us)
                    out.append(encode_publish(prefixes[v] + rid, payload, 1, False, False, i % 65535 + 1))
                state["sent"] = sent + room
                conn.transport.write(b"".join(out))  # type: ignore[union-attr]
            if state["acked"] >= state["limit"] and not done.done():
                done.set_result(None)

        conn.on_pubacks = fill
        t0 = last_change = time.monotonic()
        last = -1
        capped = False
        fill()
        while not done.done():
            await asyncio.wait([done, conn.lost], timeout=0.25, return_when=asyncio.FIRST_COMPLETED)
            if conn.lost.done():
                raise ConnectionError("naive publisher: connection lost")
            now = time.monotonic()
            if state["acked"] != last:
                last, last_change = state["acked"], now
            elif now - last_change > stall_s:
                raise TimeoutError(f"naive publisher: no PUBACK for {stall_s:.0f} s ({state['acked']}/{total})")
            if not capped and now - t0 >= max_s:
                capped = True
                state["limit"] = state["sent"]
                fill()
        conn.on_pubacks = None
        if sents and sents[-1].acked_us is None:  # capped inside the last request
            sents[-1].vins = state["sent"] - (len(sents) - 1) * n
            sents[-1].acked_us = now_us()
        return sents, capped


__all__ = ["PlatformSender", "NaivePublisher", "Sent", "raw_trigger", "payload_body", "PLATFORM_LOGIN"]
