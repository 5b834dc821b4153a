# Over 500 lines: one asyncio adapter for the four listener kinds (TCP, TLS, WS, WSS) sharing the flush and write bounds.
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
  default executor so a slow hash never stalls the loop; the socket is not read meanwhile
  (``pause_reading``), so a client cannot make the broker buffer what it sends before its CONNACK.
- Read back-pressure (:mod:`fanout.mqtt.backpressure`): the broker decides which connections to stop reading
  from (publishers while the node's queues are over their high-water mark) and to read again; the adapter
  applies the decisions right after the ``data_received`` that made them and after each flush.
- Write back-pressure: ``pause_writing`` marks the connection; the broker then drops QoS 0 messages for it
  (counted) while QoS 1/2 stay bounded by the inflight window and the session queue. A client that does
  not read is disconnected and its transport aborted, which frees the buffer at once
  (:meth:`Broker.write_buffer_full`). "Does not read" is a write buffer over ``max_write_buffer_bytes``
  from which nothing drained for ``WRITE_STALL_MS``; or a write to a transport that was already over its
  high-water mark taking the buffer over ``max_write_buffer_bytes`` + what the session holds (a client
  behind that keeps being given more: acknowledgements of a publish flood, retained replays of repeated
  subscribes). One burst into a transport that kept up is accepted whatever its size (the resend of a
  resumed session, the retained messages of a new subscription): a client that reads is never cut off
  for taking it at its own pace, and what it holds is bounded by the session and the retained store.
- uvloop: :func:`run` uses it when installed. Binding failure raises ``RuntimeError`` naming host:port.
- Extra listeners (:class:`fanout.mqtt.tls.ListenerSettings`), all feeding the same broker: MQTT over TLS
  (asyncio's SSL transport; the protocol sees the connection once the handshake has verified the client
  certificate, whose CN it passes on as ``Peer.cert_cn``), WebSocket and WebSocket over TLS (the same
  protocol with a :class:`fanout.mqtt.websocket.WebSocketStream` in front: upgrade and framing stay
  sans-I/O). :meth:`MQTTServer.reload_tls` loads the certificate files again without dropping anyone.
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
from .peer import Peer
from .settings import MQTTSettings
from .tls import ListenerSettings, ServerTLS, verified_cn
from .tls_handshakes import HandshakeStats
from .websocket import MQTT_PATH, WebSocketStream

log = structlog.get_logger(__name__)
T = TypeVar("T")
_monotonic = time.monotonic
WRITE_STALL_MS = 2000  # a write buffer over the bound that drains nothing for this long: the client does not read
LINGER_S = 2.0  # a connection the broker closed reads (and discards) the client's input this long at most


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

    __slots__ = ("_server", "_conn", "_kind", "written", "buffered", "stalled_ms")

    def __init__(self, server: "MQTTServer", kind: str = "mqtt") -> None:
        self._server = server
        self._conn: Connection | None = None
        self._kind = kind
        # while writing is paused: bytes written since the last sweep, buffer size at the last sweep, and
        # since when the buffer has been over the bound without draining (None: it drains)
        self.written = 0
        self.buffered = 0
        self.stalled_ms: int | None = None

    def _peer(self, transport: asyncio.BaseTransport) -> Peer:
        # an SSL transport reaches connection_made only after the handshake verified the chain
        cn = verified_cn(transport.get_extra_info("ssl_object")) if self._kind in ("mqtts", "wss") else None
        return Peer.from_peername(transport.get_extra_info("peername"), cn, self._kind)

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        server = self._server
        server._protocols.add(self)
        conn = server.broker.connection_made(_now_ms(), self._peer(transport))
        conn.transport = transport
        self._conn = conn

    def data_received(self, data: bytes) -> None:
        server = self._server
        server.broker.data_received(self._conn, data, int(_monotonic() * 1000))  # type: ignore[arg-type]
        if server._pressure.changes:  # back-pressure: stop reading before the loop hands over the next read
            server._apply_read_changes(server.broker.read_changes())  # type: ignore[arg-type]

    def eof_received(self) -> bool:
        return False  # half-close: let the transport close; connection_lost follows

    def connection_lost(self, exc: Exception | None) -> None:
        server = self._server
        server._protocols.discard(self)
        server._paused.discard(self)
        conn = self._conn
        if conn is not None:
            reason = "connection lost" if exc is None else f"connection lost: {exc!r}"
            server.broker.connection_lost(conn, _now_ms(), reason)
            conn.transport = None
        if not server._protocols and server._all_closed is not None:
            server._all_closed.set()

    def pause_writing(self) -> None:
        conn = self._conn
        if conn is not None:
            conn.write_paused = True
            self.written = 0
            self.buffered = conn.transport.get_write_buffer_size() if conn.transport is not None else 0
            self.stalled_ms = None
            self._server._paused.add(self)

    def resume_writing(self) -> None:
        if self._conn is not None:
            self._conn.write_paused = False
        self._server._paused.discard(self)

    def write_stalled(self, now_ms: int, max_buffer: int) -> int:
        """At a sweep: the buffered bytes if they are over ``max_buffer`` and nothing drained from them for
        :data:`WRITE_STALL_MS`, else 0."""
        t = self._conn.transport if self._conn is not None else None
        if t is None:
            return 0
        buffered = t.get_write_buffer_size()
        drained = self.buffered + self.written - buffered
        self.buffered, self.written = buffered, 0
        if buffered <= max_buffer or drained > 0:
            self.stalled_ms = None
            return 0
        if self.stalled_ms is None:
            self.stalled_ms = now_ms
        return buffered if now_ms - self.stalled_ms >= WRITE_STALL_MS else 0


class _FramedTransport:
    """What the broker's flush writes to for a WebSocket connection: frames the MQTT bytes first."""

    __slots__ = ("_raw", "_ws")

    def __init__(self, raw: asyncio.Transport, ws: WebSocketStream) -> None:
        self._raw = raw
        self._ws = ws

    def write(self, data: bytes) -> None:
        self._raw.write(self._ws.frame(data))

    def is_closing(self) -> bool:
        return self._raw.is_closing()

    def can_write_eof(self) -> bool:
        return False  # a WebSocket ends with a close frame, not a half-close

    def close(self) -> None:
        if not self._raw.is_closing():
            self._raw.write(self._ws.close())
        self._raw.close()

    def abort(self) -> None:
        self._raw.abort()

    # what the flush's write-buffer bound and the pre-authentication pause ask of a transport
    def get_protocol(self) -> asyncio.BaseProtocol:
        return self._raw.get_protocol()

    def get_write_buffer_size(self) -> int:
        return self._raw.get_write_buffer_size()

    def pause_reading(self) -> None:
        self._raw.pause_reading()

    def resume_reading(self) -> None:
        self._raw.resume_reading()


class _WebSocketProtocol(_MQTTProtocol):
    """One WebSocket connection (``ws``/``wss``): unwraps frames for the broker, frames its output.

    The broker sees the connection from the TCP (or TLS) accept, so its connect timeout also bounds a
    client that never completes the HTTP upgrade.
    """

    __slots__ = ("_ws", "_raw")

    def __init__(self, server: "MQTTServer", kind: str) -> None:
        super().__init__(server, kind)
        self._ws = WebSocketStream()
        self._raw: asyncio.Transport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        super().connection_made(transport)
        self._raw = transport  # type: ignore[assignment]
        self._conn.transport = _FramedTransport(transport, self._ws)  # type: ignore[union-attr, arg-type]

    def data_received(self, data: bytes) -> None:
        ws = self._ws
        mqtt = ws.receive_data(data)
        out = ws.data_to_send()
        raw = self._raw
        if out and raw is not None:
            raw.write(out)
        if mqtt:
            server = self._server
            server.broker.data_received(self._conn, mqtt, _now_ms())  # type: ignore[arg-type]
            if server._pressure.changes:
                server._apply_read_changes(server.broker.read_changes())  # type: ignore[arg-type]
        if ws.closed and raw is not None and not raw.is_closing():
            log.info("websocket closed", peer=self._conn.peer if self._conn else None, reason=ws.close_reason)
            raw.close()


class _LingeringClose(asyncio.Protocol):
    """Takes over a transport the broker closed (a protocol error, a refusing CONNACK, a takeover, a stop):
    half-close, then drain.

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


def _abort_lingering(t: Any) -> None:
    if not t.is_closing():
        t.abort()


class MQTTServer:
    """The MQTT listener of one node: binds, runs the broker core, stops cleanly.

    Args:
        settings: the MQTT settings (``fanout.config.mqtt_settings(config)``).
        host: listener address (default ``settings.host``).
        port: listener port, 0 for any free port (default ``settings.port``).
        hooks: a :class:`~fanout.mqtt.hooks.BrokerHooks` (or an object with its attributes and methods) for an
            embedding layer, or None.
        acl: an access-control object; default builds :class:`AccessControl` from ``settings``.
        sweep_interval_s: period of the timeout/keepalive/$SYS sweep (also the timing resolution).
        reuse_port: bind with SO_REUSEPORT so that several listener processes share host:port and the
            kernel spreads new connections over them (every one of them must set it).
        listeners: the optional TLS / WebSocket / WSS listeners (same host, same broker), or None.

    Raises:
        ConfigError: from :class:`AccessControl` (e.g. a non-loopback listener without users), or a
            certificate file that does not load (names the key).
    """

    def __init__(self, settings: MQTTSettings, *, host: str | None = None, port: int | None = None,
                 hooks: Any = None, acl: Any = None, sweep_interval_s: float = 1.0,
                 reuse_port: bool = False, listeners: ListenerSettings | None = None) -> None:
        self.settings = settings
        self.host = settings.host if host is None else host
        self._port = settings.port if port is None else port
        self.acl = acl if acl is not None else AccessControl(settings, listener_is_loopback=is_loopback_host(self.host))
        self._sweep_interval = sweep_interval_s
        self._max_write_buffer = settings.max_write_buffer_bytes
        self.reuse_port = reuse_port
        self.broker = Broker(
            settings, self.acl, hooks, now_ms=_now_ms(),
            defer_auth=self._defer_auth if settings.users else None,
            on_output=self._schedule_flush, wheel_resolution_ms=int(sweep_interval_s * 1000),
        )
        self._pressure = self.broker.pressure
        self._loop: asyncio.AbstractEventLoop | None = None
        self._server: asyncio.base_events.Server | None = None
        self._sweeper: asyncio.TimerHandle | None = None
        self._flush_scheduled = False
        self._protocols: set[_MQTTProtocol] = set()
        self._paused: set[_MQTTProtocol] = set()  # connections whose transport asked to stop writing
        self._all_closed: asyncio.Event | None = None
        self._lingering = False  # set by stop(drain=True): closed connections half-close and drain
        self.listeners = listeners or ListenerSettings()
        self.tls = ServerTLS(self.listeners.tls) if self.listeners.tls is not None else None
        self.handshakes: HandshakeStats | None = None  # outcomes of the TLS listeners' handshakes
        if self.tls is not None:
            caps = self.broker.state.caps
            self.handshakes = HandshakeStats(
                "mqtt", self.listeners.max_tls_handshakes, "mqtt.max_tls_handshakes",
                on_refused=lambda: caps.hit("tls_handshakes", running=self.listeners.max_tls_handshakes))
            self.handshakes.install(self.tls.listener_context)
            self.broker.sys.add_source(self.handshakes.sys_values)
        self._extra: list[tuple[str, asyncio.base_events.Server]] = []  # (scheme, server) of extra listeners

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

    @property
    def extra_urls(self) -> list[str]:
        """URLs of the started extra listeners: ``mqtts://H:P``, ``ws://H:P/mqtt``, ``wss://H:P/mqtt``."""
        host = f"[{self.host}]" if ":" in self.host else self.host
        out = []
        for scheme, server in self._extra:
            port = server.sockets[0].getsockname()[1] if server.sockets else 0
            out.append(f"{scheme}://{host}:{port}" + (MQTT_PATH if scheme in ("ws", "wss") else ""))
        return out

    def reload_tls(self) -> bool:
        """Load the certificate files again (new handshakes use them; open connections stay).

        Returns:
            True when reloaded, False when TLS is off or the files failed to load (old ones kept, logged).
        """
        return self.tls.reload() if self.tls is not None else False

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
        try:
            await self._start_extra(loop)
        except BaseException:
            self._server.close()
            for _, extra in self._extra:
                extra.close()
            self._server, self._extra = None, []
            raise
        self._sweeper = loop.call_later(self._sweep_interval, self._sweep)
        log.info("mqtt listening", host=self.host, port=self.port, loop=type(loop).__module__,
                 reuse_port=self.reuse_port, max_descriptors=soft)

    async def _start_extra(self, loop: asyncio.AbstractEventLoop) -> None:
        ls = self.listeners
        handshake_s = max(self.settings.connect_timeout_ms / 1000.0, 0.1)
        tls_ctx = self.tls.listener_context if self.tls is not None else None
        for scheme, port, ssl_ctx in (("mqtts", ls.tls_port, tls_ctx), ("ws", ls.ws_port, None),
                                      ("wss", ls.wss_port, tls_ctx)):
            if not port:
                continue
            if scheme in ("ws", "wss"):
                factory: Callable[[], asyncio.Protocol] = lambda kind=scheme: _WebSocketProtocol(self, kind)
            else:
                factory = lambda kind=scheme: _MQTTProtocol(self, kind)
            try:
                server = await loop.create_server(
                    factory, self.host, port, reuse_address=True, backlog=4096, reuse_port=self.reuse_port or None,
                    ssl=ssl_ctx, ssl_handshake_timeout=handshake_s if ssl_ctx is not None else None)
            except OSError as exc:
                raise RuntimeError(f"cannot listen ({scheme}) on {self.host}:{port}: {exc.strerror or exc}") from exc
            self._extra.append((scheme, server))
            log.info("mqtt listening", scheme=scheme, host=self.host, port=port,
                     client_auth=self.listeners.tls.client_auth if ssl_ctx is not None and self.listeners.tls else None)

    def _sweep(self) -> None:
        try:
            now = _now_ms()
            self.broker.tick(now)
            if self._paused:
                self._cut_off_stalled(now)
        except Exception:  # never let one bad tick stop the timer
            log.exception("mqtt sweep failed")
        if self._loop is not None and self._server is not None:
            self._sweeper = self._loop.call_later(self._sweep_interval, self._sweep)

    def _cut_off_stalled(self, now_ms: int) -> None:
        for proto in list(self._paused):
            buffered = proto.write_stalled(now_ms, self._max_write_buffer)
            if buffered:
                self._write_buffer_full(proto._conn, buffered)  # type: ignore[arg-type]

    def _write_buffer_full(self, conn: Connection, buffered: int) -> None:
        self.broker.write_buffer_full(conn, buffered)
        t = conn.transport
        if t is not None:
            t.abort()  # close() would keep the buffer until it is written: never
        self._schedule_flush()  # the will and the events of the close

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
        max_buffer = self._max_write_buffer
        broker = self.broker
        flushed = broker.flush()
        changes = broker.read_changes()
        if changes:
            self._apply_read_changes(changes)
        for conn, data in flushed:
            t = conn.transport
            if t is None:
                continue
            if data and not t.is_closing():
                behind = conn.write_paused
                t.write(data)
                if conn.write_paused:  # over the transport's high-water mark
                    proto = t.get_protocol()
                    if isinstance(proto, _MQTTProtocol):
                        proto.written += len(data)
                    if behind:
                        buffered = t.get_write_buffer_size()
                        if buffered > max_buffer + (conn.session.bytes if conn.session is not None else 0):
                            self._write_buffer_full(conn, buffered)
                            continue
            if conn.state >= CLOSED:
                if not t.is_closing() and t.can_write_eof():
                    self._linger(t)
                else:
                    t.close()

    def _linger(self, t: Any) -> None:
        """Close a transport the broker closed by half-closing it and draining the client's input.

        Why: a client that is still sending when the broker closes (PUBRELs for the PUBRECs before a
        DISCONNECT 0x93, PUBACKs during a stop) would make the kernel answer RST, which discards the
        DISCONNECT or CONNACK with the reason code before the client reads it. Outside a stop the drain
        lasts :data:`LINGER_S` at most, then the transport is aborted.
        """
        t.set_protocol(_LingeringClose(t.get_protocol()))
        t.write_eof()
        if not t.is_reading():
            t.resume_reading()  # paused by back-pressure or a pending login: still drain
        if not self._lingering and self._loop is not None:
            self._loop.call_later(LINGER_S, _abort_lingering, t)

    @staticmethod
    def _apply_read_changes(changes: dict[Connection, bool]) -> None:
        """Pause or resume reading as the broker's back-pressure decided (:mod:`fanout.mqtt.backpressure`)."""
        for conn, pause in changes.items():
            t = conn.transport
            if t is not None and conn.state < CLOSED and not t.is_closing():
                if pause:
                    t.pause_reading()
                else:
                    t.resume_reading()

    def _defer_auth(self, conn: Connection, fn: Callable[[], Any]) -> None:
        loop = self._loop
        assert loop is not None
        transport = conn.transport
        if transport is not None:
            transport.pause_reading()  # nothing more is read from a client until it is authenticated
        fut = loop.run_in_executor(getattr(self.acl, "login_executor", None), fn)  # bounded PBKDF2 pool

        def done(f: asyncio.Future) -> None:
            exc = f.exception()
            self.broker.auth_done(conn, exc if exc is not None else f.result(), _now_ms())
            t = conn.transport
            if t is not None and conn.state < CLOSED and not t.is_closing():
                t.resume_reading()

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
        extra, self._extra = self._extra, []
        for _, other in extra:
            other.close()
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
        for _, other in extra:
            await other.wait_closed()
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
