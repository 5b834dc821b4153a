"""Thin asyncio adapter around the sans-I/O broker core: sockets, clock, timers, nothing else.

Strategy:

- ``asyncio.Protocol`` (not streams): ``data_received`` hands the bytes straight to
  :meth:`Broker.data_received`; no coroutine, task or buffer per connection. The protocol object is
  slotted and holds two references.
- Output is coalesced per loop iteration: the broker calls ``on_output`` when its first byte (or event)
  becomes pending, which schedules one ``call_soon(self._flush)``; the flush does one
  ``transport.write`` per connection with everything produced since, then closes the transports of
  connections the broker closed.
- Time: one periodic sweep per ``sweep_interval_s`` (default 1 s) calls :meth:`Broker.tick`, which
  handles connect timeouts, keepalive (through a timing wheel, no per-connection timers), ``$SYS`` and
  session expiry.
- Authentication that may run PBKDF2 (a CONNECT with a user name when users are configured) runs in the
  default executor so a slow hash never stalls the loop; the broker holds that client's packets.
- Back-pressure: ``pause_writing`` marks the connection; the broker then drops QoS 0 messages for it
  (counted) while QoS 1/2 stay bounded by the inflight window and the session queue.
- uvloop: :func:`run` uses it when installed. Binding failure raises ``RuntimeError`` naming host:port.
"""
from __future__ import annotations

import asyncio
import resource
import time
from typing import Any, Awaitable, Callable, TypeVar

import structlog

from .auth import AccessControl, is_loopback_host
from .broker import Broker
from .connection import CLOSED, Connection
from .hooks import BrokerHooks
from .settings import MQTTSettings

log = structlog.get_logger(__name__)
T = TypeVar("T")
_monotonic = time.monotonic


def _now_ms() -> int:
    return int(_monotonic() * 1000)


def raise_nofile_limit() -> tuple[int, int]:
    """Raise this process's RLIMIT_NOFILE soft limit to the hard limit (children inherit it).

    Why: every connection is a descriptor, and the soft limit (often 1,024) is what fails first; the
    hard limit is the most an unprivileged process gets (more connections per machine need more
    listener processes, ``mqtt.listeners_per_node``).

    Returns:
        (soft, hard) after the change.
    """
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < hard:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    return resource.getrlimit(resource.RLIMIT_NOFILE)


class _MQTTProtocol(asyncio.Protocol):
    """One TCP connection: forwards bytes and connection events to the broker core."""

    __slots__ = ("_server", "_conn")

    def __init__(self, server: "MQTTServer") -> None:
        self._server = server
        self._conn: Connection | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        server = self._server
        server._protocols.add(self)
        conn = server.broker.connection_made(_now_ms(), transport.get_extra_info("peername"))
        conn.transport = transport
        self._conn = conn

    def data_received(self, data: bytes) -> None:
        self._server.broker.data_received(self._conn, data, int(_monotonic() * 1000))  # type: ignore[arg-type]

    def eof_received(self) -> bool:
        return False  # half-close: let the transport close; connection_lost follows

    def connection_lost(self, exc: Exception | None) -> None:
        server = self._server
        server._protocols.discard(self)
        conn = self._conn
        if conn is not None:
            reason = "connection lost" if exc is None else f"connection lost: {exc!r}"
            server.broker.connection_lost(conn, _now_ms(), reason)
            conn.transport = None
        if not server._protocols and server._all_closed is not None:
            server._all_closed.set()

    def pause_writing(self) -> None:
        if self._conn is not None:
            self._conn.write_paused = True

    def resume_writing(self) -> None:
        if self._conn is not None:
            self._conn.write_paused = False


class _LingeringClose(asyncio.Protocol):
    """Takes over a transport the broker closed during :meth:`MQTTServer.stop`: half-close, then drain.

    Why: ``transport.close()`` stops reading at once, so the PUBACKs a subscriber keeps sending while
    its last messages are flushed pile up unread; closing a socket with unread input makes the kernel
    send RST, which discards the bytes still queued on both sides (the subscriber loses messages the
    broker already acknowledged to their publisher). Sending FIN (``write_eof``) after the pending
    output and reading until the peer closes is the "lingering close" of web servers.
    """

    __slots__ = ("_inner",)

    def __init__(self, inner: _MQTTProtocol) -> None:
        self._inner = inner

    def data_received(self, data: bytes) -> None:
        pass  # the session is over; what the client still sends (PUBACKs, PINGREQs) is discarded

    def eof_received(self) -> bool:
        return False  # the peer closed its side too: let the transport close

    def connection_lost(self, exc: Exception | None) -> None:
        self._inner.connection_lost(exc)


class MQTTServer:
    """The MQTT listener of one node: binds, runs the broker core, stops cleanly.

    Args:
        settings: the MQTT settings (``fanout.config.mqtt_settings(config)``).
        host: listener address (default ``settings.host``).
        port: listener port, 0 for any free port (default ``settings.port``).
        hooks: :class:`BrokerHooks` for an embedding layer, or None.
        acl: an access-control object; default builds :class:`AccessControl` from ``settings``.
        sweep_interval_s: period of the timeout/keepalive/$SYS sweep (also the timing resolution).
        reuse_port: bind with SO_REUSEPORT so that several listener processes share host:port and the
            kernel spreads new connections over them (every one of them must set it).

    Raises:
        ConfigError: from :class:`AccessControl` (e.g. a non-loopback listener without users).
    """

    def __init__(self, settings: MQTTSettings, *, host: str | None = None, port: int | None = None,
                 hooks: BrokerHooks | None = None, acl: Any = None, sweep_interval_s: float = 1.0,
                 reuse_port: bool = False) -> None:
        self.settings = settings
        self.host = settings.host if host is None else host
        self._port = settings.port if port is None else port
        self.acl = acl if acl is not None else AccessControl(settings, listener_is_loopback=is_loopback_host(self.host))
        self._sweep_interval = sweep_interval_s
        self.reuse_port = reuse_port
        self.broker = Broker(
            settings, self.acl, hooks, now_ms=_now_ms(),
            defer_auth=self._defer_auth if settings.users else None,
            on_output=self._schedule_flush, wheel_resolution_ms=int(sweep_interval_s * 1000),
        )
        self._loop: asyncio.AbstractEventLoop | None = None
        self._server: asyncio.base_events.Server | None = None
        self._sweeper: asyncio.TimerHandle | None = None
        self._flush_scheduled = False
        self._protocols: set[_MQTTProtocol] = set()
        self._all_closed: asyncio.Event | None = None
        self._lingering = False  # set by stop(drain=True): closed connections half-close and drain

    @property
    def port(self) -> int:
        """The bound port (the real one when configured with port 0, once started)."""
        if self._server is not None and self._server.sockets:
            return int(self._server.sockets[0].getsockname()[1])
        return self._port

    @property
    def url(self) -> str:
        """``mqtt://host:port`` of the listener."""
        return f"mqtt://{self.host}:{self.port}"

    async def start(self) -> None:
        """Bind and start accepting connections.

        Raises:
            RuntimeError: the address cannot be bound (names host:port).
        """
        loop = self._loop = asyncio.get_running_loop()
        soft, _ = raise_nofile_limit()
        try:
            self._server = await loop.create_server(
                lambda: _MQTTProtocol(self), self.host, self._port, reuse_address=True, backlog=4096,
                reuse_port=self.reuse_port or None,
            )
        except OSError as exc:
            raise RuntimeError(f"cannot listen on {self.host}:{self._port}: {exc.strerror or exc}") from exc
        self._sweeper = loop.call_later(self._sweep_interval, self._sweep)
        log.info("mqtt listening", host=self.host, port=self.port, loop=type(loop).__module__,
                 reuse_port=self.reuse_port, max_descriptors=soft)

    def _sweep(self) -> None:
        try:
            self.broker.tick(_now_ms())
        except Exception:  # never let one bad tick stop the timer
            log.exception("mqtt sweep failed")
        if self._loop is not None and self._server is not None:
            self._sweeper = self._loop.call_later(self._sweep_interval, self._sweep)

    def _schedule_flush(self) -> None:
        if not self._flush_scheduled and self._loop is not None:
            self._flush_scheduled = True
            self._loop.call_soon(self._flush)

    def flush_now(self) -> None:
        """Write the pending output now instead of at the scheduled flush (a big delivery batch writes
        its first part to the sockets before encoding the rest)."""
        self._flush()

    def _flush(self) -> None:
        self._flush_scheduled = False
        for conn, data in self.broker.flush():
            t = conn.transport
            if t is None:
                continue
            if data and not t.is_closing():
                t.write(data)
            if conn.state >= CLOSED:
                if self._lingering and not t.is_closing() and t.can_write_eof():
                    t.set_protocol(_LingeringClose(t.get_protocol()))
                    t.write_eof()
                else:
                    t.close()

    def _defer_auth(self, conn: Connection, fn: Callable[[], Any]) -> None:
        loop = self._loop
        assert loop is not None
        fut = loop.run_in_executor(getattr(self.acl, "login_executor", None), fn)  # bounded PBKDF2 pool

        def done(f: asyncio.Future) -> None:
            exc = f.exception()
            self.broker.auth_done(conn, exc if exc is not None else f.result(), _now_ms())

        fut.add_done_callback(done)

    async def stop(self, drain: bool = True, *, publish_wills: bool = False, timeout: float = 5.0) -> None:
        """Stop accepting, close every connection and release the port.

        Args:
            drain: True writes what is pending and closes gracefully (waiting up to ``timeout``);
                False aborts every connection at once.
            publish_wills: publish the wills of connected clients (default False: a clean stop is
                not a client failure, see :mod:`fanout.mqtt.broker`).
            timeout: seconds to wait for graceful closes before aborting.
        """
        if self._server is None:
            return
        port = self.port
        server, self._server = self._server, None
        server.close()
        if self._sweeper is not None:
            self._sweeper.cancel()
            self._sweeper = None
        self._lingering = drain
        n = self.broker.shutdown(publish_wills=publish_wills)
        self._flush()
        if self._protocols:
            if not drain:
                for p in list(self._protocols):
                    t = p._conn.transport if p._conn is not None else None
                    if t is not None:
                        t.abort()
            self._all_closed = asyncio.Event()
            try:
                await asyncio.wait_for(self._all_closed.wait(), timeout)
            except asyncio.TimeoutError:
                for p in list(self._protocols):
                    t = p._conn.transport if p._conn is not None else None
                    if t is not None:
                        t.abort()
        await server.wait_closed()
        self._flush()
        self._lingering = False
        log.info("mqtt stopped", host=self.host, port=port, connections_closed=n, drained=drain)

    def __repr__(self) -> str:
        return f"<MQTTServer {self.host}:{self.port} clients={self.broker.clients_connected}>"


def new_event_loop() -> asyncio.AbstractEventLoop:
    """A uvloop event loop when uvloop is installed, else the default asyncio loop."""
    try:
        import uvloop
    except ImportError:  # pragma: no cover - uvloop is a dependency on Linux
        return asyncio.new_event_loop()
    return uvloop.new_event_loop()


def run(main: Callable[[], Awaitable[T]]) -> T:
    """Run ``main()`` to completion on a fresh (uvloop when installed) event loop."""
    with asyncio.Runner(loop_factory=new_event_loop) as runner:
        return runner.run(main())


__all__ = ["MQTTServer", "run", "new_event_loop"]
