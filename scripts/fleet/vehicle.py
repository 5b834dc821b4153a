"""One simulated vehicle: a slotted ``asyncio.Protocol`` speaking MQTT 3.1.1 through the project's codec.

Strategy:

- A Protocol per vehicle, not a client library: paho costs a thread and ~100 KB per client, asyncio
  streams a task and two buffers. A :class:`Vehicle` is one slotted object (a dozen references) that
  lives for the whole run and is its own protocol for every connection it makes; per connection it
  adds a :class:`PacketReader` and the transport. No task per vehicle: timers are loop handles (one
  per vehicle at a time: the CONNACK/SUBACK deadline, then the heartbeat/keepalive tick).
- Shared state (options, counters, ledger, random generator, the PUBACK table) lives in the process's
  worker; the vehicle reaches it through one reference typed as :class:`VehicleHost`, the part of
  :class:`~scripts.fleet.worker.Worker` a vehicle calls, so this module does not import the worker.
- Life cycle: ``connection_made`` sends CONNECT and SUBSCRIBE ``<prefix>/+`` at QoS 1 in one write
  (MQTT-3.1.4 lets a client send before CONNACK; a refused CONNECT closes the connection and the
  SUBSCRIBE is never processed); CONNACK 0 -> connected; SUBACK -> publish ``ecp/<VIN>/online`` (so
  the dispatcher's "online" trigger finds the subscription) and start the heartbeat tick. Every delivery is recorded in
  the ledger, then acknowledged at once (all PUBACKs a read produced go out in one ``write``) or after
  the ack delay (a loop timer bound to the transport, so a PUBACK never goes out on a later
  connection).
- Crash: on the *first* receipt of a request by this vehicle, with probability ``crash_rate``, the
  socket is dropped before that PUBACK (PUBACKs of earlier deliveries of the same read are written
  first). Redeliveries never crash, so even ``crash_rate=1.0`` converges: every request crashes its
  vehicle once and is acknowledged on its redelivery (DUP=1 on a resumed persistent session).
- Any connection loss reconnects through the worker's rate-limited connector: after
  ``reconnect_delay`` for a crash, with exponential backoff (jittered) otherwise; a vehicle whose
  CONNACK or SUBACK does not arrive within ``connect_timeout`` is aborted and retried the same way.
"""
from __future__ import annotations

import asyncio
import random
from typing import Protocol

from fanout.mqtt.codec import PacketReader, encode, encode_publish
from fanout.mqtt.errors import ProtocolError
from fanout.mqtt.packets import (
    DISCONNECT_BYTES, PINGREQ_BYTES, SUBACK_FAILURE, Connack, Connect, Publish, Suback, Subscribe,
)

from .accounting import NEW, Ledger
from .options import FleetOptions
from .payload import now_us, sent_time_us

IDLE = 0  # no connection (queued for a connect, or waiting for a reconnect delay)
FAILED = -1  # handshake failed and was counted; connection_lost follows
TCP = 1  # CONNECT + SUBSCRIBE sent, waiting for CONNACK
CONNECTED = 2  # CONNACK 0, waiting for SUBACK
SUBSCRIBED = 3  # SUBACK received, online published, heartbeats running

SUB_PACKET_ID = 1


class Counters:
    """Running totals of one fleet process (ints the vehicles bump; read by ``Worker.snapshot``)."""

    __slots__ = ("connected", "subscribed", "connects", "first_connects", "reconnects", "connect_errors",
                 "crashes", "losses", "subscribe_errors", "protocol_errors", "unexpected", "heartbeats",
                 "pubacks", "overlaps")

    def __init__(self) -> None:
        for name in self.__slots__:
            setattr(self, name, 0)

    def as_dict(self) -> dict[str, int]:
        return {name: getattr(self, name) for name in self.__slots__}


class VehicleHost(Protocol):
    """What a :class:`Vehicle` uses of its process (:class:`~scripts.fleet.worker.Worker` implements it)."""

    opts: FleetOptions
    counters: Counters
    ledger: Ledger
    rng: random.Random
    loop: asyncio.AbstractEventLoop
    crash_rate: float
    max_packet_size: int
    ping_period: float
    pubacks: list[bytes]  # encoded PUBACK by packet id
    stopping: bool
    open_transports: int

    def delivery_prefix(self, vin: str) -> str: ...

    def ack_delay(self) -> float: ...

    def backoff(self, attempts: int) -> float: ...

    def next_packet_id(self) -> int: ...

    def first_connect(self) -> None: ...

    def connect_error(self, reason: str) -> None: ...

    def note_error(self, reason: str) -> None: ...

    def schedule_connect(self, vehicle: "Vehicle", delay: float) -> None: ...

    def handshake_done(self) -> None: ...


class Vehicle(asyncio.Protocol):
    """One simulated vehicle (client id = VIN), reused as the protocol of each of its connections.

    Args:
        worker: the process's worker (options, counters, ledger, connector).
        index: index in the worker (the ledger's vehicle number).
        vin: client id.
    """

    __slots__ = ("worker", "index", "vin", "transport", "reader", "state", "timer", "attempts", "ever",
                 "crashed", "next_hb", "unacked")

    def __init__(self, worker: VehicleHost, index: int, vin: str) -> None:
        self.worker = worker
        self.index = index
        self.vin = vin
        self.transport: asyncio.Transport | None = None
        self.reader: PacketReader | None = None
        self.state = IDLE
        self.timer: asyncio.TimerHandle | None = None
        self.attempts = 0  # failed attempts since the last successful subscribe (backoff exponent)
        self.ever = False  # connected at least once (later CONNACKs count as reconnects)
        self.crashed = False  # the current connection was dropped by a simulated crash
        self.next_hb = 0.0  # loop time of the next heartbeat
        self.unacked = 0  # deliveries received on this connection and not yet PUBACKed

    # ------------------------------------------------------------------ connection events

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        w = self.worker
        self.transport = transport  # type: ignore[assignment]
        self.reader = PacketReader(w.max_packet_size)
        self.state = TCP
        w.open_transports += 1
        o = w.opts
        password = o.password.encode() if o.password is not None else None
        # MQTT-3.1.4: a client may send packets before CONNACK; SUBSCRIBE rides in the same write
        subscribe = Subscribe(SUB_PACKET_ID, ((w.delivery_prefix(self.vin) + "+", 1),))
        transport.write(encode(Connect(self.vin, not o.persistent, o.keepalive, o.username, password))  # type: ignore[attr-defined]
                        + encode(subscribe))
        self.timer = w.loop.call_later(o.connect_timeout, self._handshake_timeout)

    def connection_lost(self, exc: Exception | None) -> None:
        w = self.worker
        c = w.counters
        w.open_transports -= 1
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None
        state = self.state
        if state in (TCP, CONNECTED, FAILED):
            w.handshake_done()
        if state >= CONNECTED:
            c.connected -= 1
        if state == SUBSCRIBED:
            c.subscribed -= 1
        self.state = IDLE
        self.transport = None
        self.reader = None
        self.unacked = 0
        if w.stopping:
            return
        if self.crashed:
            self.crashed = False
            w.schedule_connect(self, w.opts.reconnect_delay)
            return
        if state == TCP:
            w.connect_error(f"closed before CONNACK: {exc!r}" if exc else "closed before CONNACK")
        elif state >= CONNECTED:
            c.losses += 1
        self.attempts += 1
        w.schedule_connect(self, w.backoff(self.attempts))

    def eof_received(self) -> bool:
        return False  # the broker closed: let the transport close, connection_lost follows

    def connect_failed(self, reason: str) -> None:
        """The TCP connect itself failed (called by the worker): count it and retry with backoff."""
        w = self.worker
        w.handshake_done()
        w.connect_error(reason)
        self.attempts += 1
        if not w.stopping:
            w.schedule_connect(self, w.backoff(self.attempts))

    def _fail(self, reason: str) -> None:
        """Count a failed handshake and abort the connection (connection_lost then retries)."""
        self.worker.connect_error(reason)
        if self.state == CONNECTED:  # a SUBACK timeout: connection_lost does not count FAILED ones
            self.worker.counters.connected -= 1
        self.state = FAILED
        if self.transport is not None:
            self.transport.abort()

    def _handshake_timeout(self) -> None:
        self.timer = None
        self._fail("CONNACK timeout" if self.state == TCP else "SUBACK timeout")

    def close(self) -> None:
        """Clean shutdown: DISCONNECT, then close (the broker discards no will; none is set)."""
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None
        t = self.transport
        if t is not None and not t.is_closing():
            if self.state >= CONNECTED:
                t.write(DISCONNECT_BYTES)
            t.close()

    # ------------------------------------------------------------------ packets

    def data_received(self, data: bytes) -> None:
        w = self.worker
        try:
            packets = self.reader.feed(data)  # type: ignore[union-attr]
        except ProtocolError as exc:  # drop the connection; what it carried is redelivered or lost with it
            w.counters.protocol_errors += 1
            w.note_error(f"protocol error: {exc.reason}")
            if self.state == TCP:
                self.state = FAILED
            self.transport.abort()  # type: ignore[union-attr]
            return
        acks: list[bytes] = []
        for p in packets:
            tp = type(p)
            if tp is Publish:
                if not self._delivery(p, acks):  # crashed: nothing after it is handled
                    return
            elif tp is Connack:
                self._connack(p)  # type: ignore[arg-type]
            elif tp is Suback:
                self._suback(p)  # type: ignore[arg-type]
            # PUBACK (QoS 1 heartbeats), PINGRESP: nothing to do
        if acks:
            self._write_acks(acks)

    def _write_acks(self, acks: list[bytes]) -> None:
        t = self.transport
        self.unacked -= len(acks)
        if t is not None and not t.is_closing():
            t.write(b"".join(acks) if len(acks) > 1 else acks[0])
            self.worker.counters.pubacks += len(acks)

    def _connack(self, p: Connack) -> None:
        w = self.worker
        if self.state != TCP:
            return
        if p.return_code != 0:
            self._fail(f"CONNACK return code {p.return_code}")
            return
        self.state = CONNECTED
        c = w.counters
        c.connected += 1
        c.connects += 1
        if self.ever:
            c.reconnects += 1
        else:
            self.ever = True
            w.first_connect()

    def _suback(self, p: Suback) -> None:
        w = self.worker
        if self.state != CONNECTED or p.packet_id != SUB_PACKET_ID:
            return
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None
        if SUBACK_FAILURE in p.return_codes:
            w.counters.subscribe_errors += 1
            w.note_error(f"SUBACK refused the delivery filter of {self.vin}")
        self.state = SUBSCRIBED
        w.handshake_done()
        w.counters.subscribed += 1
        self.attempts = 0
        self._publish_status("online")
        hb = w.opts.heartbeat_interval
        self.next_hb = w.loop.time() + (hb * w.rng.uniform(0.5, 1.0) if hb > 0 else float("inf"))
        self._arm_tick()

    def _delivery(self, p: Publish, acks: list[bytes]) -> bool:
        """Record one delivery; PUBACK it now (into ``acks``) or later. Returns False after a crash."""
        w = self.worker
        topic = p.topic
        prefix = w.delivery_prefix(self.vin)
        n = len(prefix)
        if len(topic) > n and topic.startswith(prefix) and "/" not in topic[n:]:
            outcome = w.ledger.record(self.index, topic[n:], p.dup, now_us(), sent_time_us(p.payload))
            if outcome == NEW and w.crash_rate and w.rng.random() < w.crash_rate:
                if acks:
                    self._write_acks(acks)
                    acks.clear()
                w.counters.crashes += 1
                self.crashed = True
                self.transport.abort()  # type: ignore[union-attr]
                return False
        else:
            w.counters.unexpected += 1
        if p.qos == 1:
            if self.unacked:
                w.counters.overlaps += 1
            self.unacked += 1
            delay = w.ack_delay()
            if delay <= 0:
                acks.append(w.pubacks[p.packet_id])  # type: ignore[index]
            else:
                w.loop.call_later(delay, self._late_ack, self.transport, p.packet_id)
        return True

    def _late_ack(self, transport: asyncio.Transport, packet_id: int) -> None:
        if self.transport is transport:  # still the connection the delivery came on
            self._write_acks([self.worker.pubacks[packet_id]])

    # ------------------------------------------------------------------ heartbeats

    def _publish_status(self, kind: str) -> None:
        w = self.worker
        qos = w.opts.heartbeat_qos
        self.transport.write(encode_publish(f"ecp/{self.vin}/{kind}", b"", qos, False, False,  # type: ignore[union-attr]
                                            w.next_packet_id() if qos else None))
        w.counters.heartbeats += 1

    def _arm_tick(self) -> None:
        w = self.worker
        when = min(self.next_hb, w.loop.time() + w.ping_period)
        if when != float("inf"):
            self.timer = w.loop.call_at(when, self._tick)

    def _tick(self) -> None:
        """Heartbeat when due, else a PINGREQ (keepalive without heartbeats); then re-arm."""
        self.timer = None
        t = self.transport
        if t is None or self.state != SUBSCRIBED or t.is_closing():
            return
        w = self.worker
        now = w.loop.time()
        if now >= self.next_hb:
            self._publish_status("heartbeat")
            self.next_hb = now + w.opts.heartbeat_interval * w.rng.uniform(0.9, 1.1)
        else:
            t.write(PINGREQ_BYTES)
        self._arm_tick()
