"""Asyncio ends of a direct channel: :class:`ChannelServer` (inside the callee actor) and :class:`ChannelClient`.

Strategy: a thin adapter over :mod:`fanout.channel.frames`. The server runs each request as a task of the
actor's own handler, started in arrival order (as a Ray async actor starts its calls), and answers with the
handler's result or its exception (pickled, so the caller sees the exception type the handler raised, as
with a Ray call minus the ``RayTaskError`` wrapper). One client keeps one connection and multiplexes calls
over it by request id; when the connection breaks every pending call fails with :class:`ChannelError` and the
next call reconnects through ``resolve`` (the callee may have restarted on another port).

Bounds: a frame over ``max_frame`` closes the connection (either side; a caller trying to send one gets
``ChannelError`` and nothing is sent); a server connection with ``max_inflight`` requests running stops
reading until one finishes; a peer that has not completed the handshake within ``HANDSHAKE_TIMEOUT_S`` is
closed, and buffers at most the size of a handshake before it proves the secret.

Only authenticated peers' frames are unpickled: the channel carries the same pickled Python objects a Ray call
would, between actors of one cluster that share its secret.
"""
from __future__ import annotations

import asyncio
import pickle
from typing import Any, Awaitable, Callable, Mapping

import structlog

from ..mqtt.tls_handshakes import HandshakeStats
from . import frames as fr

log = structlog.get_logger(__name__)

HANDSHAKE_TIMEOUT_S = 5.0
CONNECT_TIMEOUT_S = 5.0
DEFAULT_MAX_FRAME = 80 << 20
DEFAULT_MAX_INFLIGHT = 1024
# TLS handshakes in progress at once per channel server: a cluster opens one connection per caller actor
# and callee, so more than this at once is a stranger (fanout.mqtt.tls_handshakes)
MAX_TLS_HANDSHAKES = 256
_PICKLE = pickle.HIGHEST_PROTOCOL
_HELLO_BYTES = len(fr.MAGIC) + fr.NONCE_BYTES
_REPLY_HEAD = fr.NONCE_BYTES + fr.PROOF_BYTES + 1

Handler = Callable[..., Awaitable[Any]]


def _dump_exception(exc: BaseException) -> bytes:
    try:
        return pickle.dumps(exc, _PICKLE)
    except Exception:
        return pickle.dumps(RuntimeError(f"{type(exc).__name__}: {exc}"), _PICKLE)


class ChannelServer:
    """Serves ``handlers`` (method name -> coroutine function) to clients proving ``secret`` for ``service``.

    Args:
        secret: the cluster's channel secret.
        service: the one service name this server answers to.
        handlers: what a client may call; any other name is answered with ``AttributeError``.
        max_frame: largest frame read or written.
        max_inflight: requests of one connection running at once before it stops reading.
        ssl: a server TLS context (:func:`fanout.channel.tls.server_context`), or None for plain TCP. The
            secret's handshake then runs inside the tunnel; a peer gets ``HANDSHAKE_TIMEOUT_S`` for TLS's.
    """

    def __init__(self, secret: bytes, service: str, handlers: Mapping[str, Handler], *,
                 max_frame: int = DEFAULT_MAX_FRAME, max_inflight: int = DEFAULT_MAX_INFLIGHT,
                 ssl: Any = None) -> None:
        self.secret = secret
        self.ssl = ssl
        self.service = service
        self.handlers = dict(handlers)
        self.max_frame = max_frame
        self.max_inflight = max_inflight
        self.address: tuple[str, int] | None = None
        self._server: asyncio.base_events.Server | None = None
        self._conns: set[_ServerConnection] = set()
        self.stats = {"connections": 0, "refused": 0, "requests": 0, "protocol_errors": 0}
        self.handshakes: HandshakeStats | None = None  # a TLS channel's handshakes, by outcome
        if ssl is not None:
            self.handshakes = HandshakeStats("channel", MAX_TLS_HANDSHAKES, "fanout.channel.peer.MAX_TLS_HANDSHAKES")
            self.handshakes.install(ssl)

    def figures(self) -> dict[str, int]:
        """:attr:`stats`, plus on a TLS channel ``tls_failed``: handshakes that did not complete (refused
        certificate, protocol error, timeout or the peer left, over :data:`MAX_TLS_HANDSHAKES`)."""
        out = dict(self.stats)
        hs = self.handshakes
        if hs is not None:
            out["tls_failed"] = sum(hs.failures.values()) + hs.abandoned + hs.refused
        return out

    async def start(self, host: str, port: int = 0) -> tuple[str, int]:
        """Listen on ``host:port`` (0 = any free port); the bound ``(host, port)``.

        Raises:
            RuntimeError: the address cannot be bound (names it).
        """
        loop = asyncio.get_running_loop()
        try:
            self._server = await loop.create_server(
                lambda: _ServerConnection(self), host, port, ssl=self.ssl,
                ssl_handshake_timeout=HANDSHAKE_TIMEOUT_S if self.ssl is not None else None)
        except OSError as exc:
            raise RuntimeError(f"channel {self.service}: cannot listen on {host}:{port}: {exc}") from exc
        self.address = (host, self._server.sockets[0].getsockname()[1])
        return self.address

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
            for c in list(self._conns):
                c.abort()
            await self._server.wait_closed()
            self._server = None


class _ServerConnection(asyncio.Protocol):
    def __init__(self, server: ChannelServer) -> None:
        self.server = server
        self.transport: asyncio.Transport | None = None
        self.snonce = b""
        self.hs = bytearray()  # handshake bytes, until the client proved the secret
        self.decoder: fr.FrameDecoder | None = None
        self.inflight = 0
        self.paused = False
        self.closed = False
        self.timer: asyncio.TimerHandle | None = None
        self.peer: Any = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        self.peer = transport.get_extra_info("peername")
        self.server._conns.add(self)
        hello, self.snonce = fr.server_hello()
        self.transport.write(hello)
        self.timer = asyncio.get_running_loop().call_later(HANDSHAKE_TIMEOUT_S, self._handshake_timeout)

    def _handshake_timeout(self) -> None:
        if self.decoder is None:
            self._refuse("no handshake within %.0fs" % HANDSHAKE_TIMEOUT_S)

    def _refuse(self, why: str) -> None:
        self.server.stats["refused"] += 1
        log.warning("channel connection refused", service=self.server.service, peer=str(self.peer), reason=why)
        self.abort()

    def abort(self) -> None:
        self.closed = True
        if self.transport is not None:
            self.transport.abort()

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        self.server._conns.discard(self)
        if self.timer is not None:
            self.timer.cancel()

    def data_received(self, data: bytes) -> None:
        if self.decoder is None:
            hs = self.hs
            hs += data
            if len(hs) < _REPLY_HEAD:
                return
            size = fr.client_reply_size(bytes(hs[:_REPLY_HEAD]))
            if len(hs) < size:
                return
            try:
                service, answer = fr.check_client(self.server.secret, self.snonce, bytes(hs[:size]))
            except fr.HandshakeError as exc:
                self._refuse(str(exc))
                return
            if service != self.server.service:
                self._refuse(f"client asked for service {service!r}, this is {self.server.service!r}")
                return
            self.transport.write(answer)
            self.decoder = fr.FrameDecoder(self.server.max_frame)
            if self.timer is not None:
                self.timer.cancel()
                self.timer = None
            data = bytes(hs[size:])
            self.hs = bytearray()
            if not data:
                return
        try:
            frames = self.decoder.feed(data)
        except fr.ChannelError as exc:
            self.server.stats["protocol_errors"] += 1
            log.warning("channel protocol error", service=self.server.service, peer=str(self.peer), error=str(exc))
            self.abort()
            return
        loop = asyncio.get_running_loop()
        handlers = self.server.handlers
        for rid, kind, payload in frames:
            if kind != fr.REQUEST:
                self.server.stats["protocol_errors"] += 1
                self.abort()
                return
            self.server.stats["requests"] += 1
            try:
                method, args = pickle.loads(payload)
                handler = handlers[method]
            except KeyError:
                self._reply(rid, fr.ERROR, _dump_exception(AttributeError(
                    f"channel {self.server.service} has no method {method!r}")))
                continue
            except Exception as exc:
                self._reply(rid, fr.ERROR, _dump_exception(ValueError(f"malformed channel request: {exc}")))
                continue
            self.inflight += 1
            task = loop.create_task(handler(*args))
            task.add_done_callback(lambda t, rid=rid: self._done(rid, t))
        if self.inflight >= self.server.max_inflight and not self.paused:
            self.paused = True
            self.transport.pause_reading()

    def _done(self, rid: int, task: asyncio.Task) -> None:
        self.inflight -= 1
        if self.paused and self.inflight < self.server.max_inflight and not self.closed:
            self.paused = False
            self.transport.resume_reading()
        if task.cancelled():
            self._reply(rid, fr.ERROR, _dump_exception(fr.ChannelError("call cancelled by the callee")))
            return
        exc = task.exception()
        if exc is not None:
            self._reply(rid, fr.ERROR, _dump_exception(exc))
            return
        try:
            payload = pickle.dumps(task.result(), _PICKLE)
        except Exception as e:
            self._reply(rid, fr.ERROR, _dump_exception(TypeError(f"result cannot be pickled: {e}")))
            return
        self._reply(rid, fr.REPLY, payload)

    def _reply(self, rid: int, kind: int, payload: bytes) -> None:
        if self.closed:
            return
        if len(payload) > self.server.max_frame:
            kind, payload = fr.ERROR, _dump_exception(fr.ChannelError(
                f"reply of {len(payload)} bytes over max_frame {self.server.max_frame}"))
        self.transport.write(fr.encode_header(len(payload), rid, kind) + payload)


class ChannelClient:
    """Calls a :class:`ChannelServer`: ``await client.call("method", *args)``.

    Args:
        secret: the cluster's channel secret.
        service: the server's service name.
        resolve: coroutine function giving the server's current ``(host, port)``, or ``(host, port, ssl)`` with a
            client TLS context (:func:`fanout.channel.tls.client_context`) when that server speaks TLS (asked at
            every (re)connect).
        max_frame: largest frame sent or read.
    """

    def __init__(self, secret: bytes, service: str, resolve: Callable[[], Awaitable[tuple[Any, ...]]], *,
                 max_frame: int = DEFAULT_MAX_FRAME) -> None:
        self.secret = secret
        self.service = service
        self.resolve = resolve
        self.max_frame = max_frame
        self._conn: _ClientConnection | None = None
        self._connecting: asyncio.Future | None = None
        self._rid = 0
        self.connects = 0
        self._closed = False

    @property
    def connected(self) -> bool:
        return self._conn is not None and not self._conn.closed

    async def call(self, method: str, *args: Any) -> Any:
        """Run ``method(*args)`` on the server; its result, or the exception it raised.

        Raises:
            ChannelError: the connection could not be made or broke before the reply (the call may or may not
                have run), or the request is over ``max_frame`` (not sent).
        """
        conn = self._conn
        if conn is None or conn.closed:
            conn = await self._connect()
        payload = pickle.dumps((method, args), _PICKLE)
        if len(payload) > self.max_frame:
            raise fr.ChannelError(f"{self.service}.{method}: request of {len(payload)} bytes over max_frame "
                                  f"{self.max_frame}")
        self._rid = rid = (self._rid + 1) & 0xFFFFFFFF
        fut = asyncio.get_running_loop().create_future()
        conn.pending[rid] = fut
        conn.transport.write(fr.encode_header(len(payload), rid, fr.REQUEST) + payload)
        try:
            return await fut
        finally:
            conn.pending.pop(rid, None)

    async def _connect(self) -> "_ClientConnection":
        if self._closed:
            raise fr.ChannelError(f"channel to {self.service} closed")
        if self._connecting is not None:
            return await asyncio.shield(self._connecting)
        loop = asyncio.get_running_loop()
        self._connecting = loop.create_future()
        try:
            conn = await asyncio.wait_for(self._open(), CONNECT_TIMEOUT_S)
        except BaseException as exc:
            err = exc if isinstance(exc, fr.ChannelError) else fr.ChannelError(
                f"cannot connect to channel {self.service}: {type(exc).__name__}: {exc}")
            self._connecting.set_exception(err)
            self._connecting.exception()  # retrieved: nobody else may be waiting
            self._connecting = None
            if isinstance(exc, asyncio.CancelledError):
                raise
            raise err from exc
        self._conn = conn
        self.connects += 1
        self._connecting.set_result(conn)
        self._connecting = None
        return conn

    async def _open(self) -> "_ClientConnection":
        address = await self.resolve()
        host, port = address[0], address[1]
        ctx = address[2] if len(address) > 2 else None
        loop = asyncio.get_running_loop()
        _t, conn = await loop.create_connection(
            lambda: _ClientConnection(self), host, port, ssl=ctx,
            ssl_handshake_timeout=CONNECT_TIMEOUT_S if ctx is not None else None)
        await conn.ready
        return conn

    def close(self) -> None:
        self._closed = True
        if self._conn is not None:
            self._conn.abort(fr.ChannelError(f"channel to {self.service} closed"))


class _ClientConnection(asyncio.Protocol):
    def __init__(self, client: ChannelClient) -> None:
        self.client = client
        self.transport: asyncio.Transport | None = None
        self.pending: dict[int, asyncio.Future] = {}
        self.hs = bytearray()
        self.expected: bytes | None = None
        self.decoder: fr.FrameDecoder | None = None
        self.closed = False
        self.ready: asyncio.Future = asyncio.get_running_loop().create_future()

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def abort(self, exc: Exception) -> None:
        if self.transport is not None:
            self.transport.abort()
        self._fail(exc)

    def _fail(self, exc: Exception) -> None:
        self.closed = True
        if not self.ready.done():
            self.ready.set_exception(exc)
        pending, self.pending = self.pending, {}
        for fut in pending.values():
            if not fut.done():
                fut.set_exception(exc)

    def connection_lost(self, exc: Exception | None) -> None:
        self._fail(fr.ChannelError(f"channel to {self.client.service} lost" + (f": {exc}" if exc else "")))

    def data_received(self, data: bytes) -> None:
        if self.decoder is None:
            hs = self.hs
            hs += data
            try:
                if self.expected is None:
                    if len(hs) < _HELLO_BYTES:
                        return
                    reply, self.expected = fr.client_reply(self.client.secret, bytes(hs[:_HELLO_BYTES]),
                                                           self.client.service)
                    self.transport.write(reply)
                    del hs[:_HELLO_BYTES]
                if len(hs) < fr.PROOF_BYTES:
                    return
                if bytes(hs[:fr.PROOF_BYTES]) != self.expected:
                    raise fr.HandshakeError(f"channel server for {self.client.service} failed to prove the secret")
            except fr.HandshakeError as exc:
                self.abort(exc)
                return
            data = bytes(hs[fr.PROOF_BYTES:])
            self.hs = bytearray()
            self.decoder = fr.FrameDecoder(self.client.max_frame)
            self.ready.set_result(self)
            if not data:
                return
        try:
            frames = self.decoder.feed(data)
        except fr.ChannelError as exc:
            self.abort(exc)
            return
        pending = self.pending
        for rid, kind, payload in frames:
            fut = pending.pop(rid, None)
            if fut is None or fut.done():
                continue  # the caller gave up (cancelled): the reply is dropped
            try:
                value = pickle.loads(payload)
            except Exception as exc:
                fut.set_exception(fr.ChannelError(f"unreadable reply from {self.client.service}: {exc}"))
                continue
            if kind == fr.REPLY:
                fut.set_result(value)
            elif isinstance(value, BaseException):
                fut.set_exception(value)
            else:
                fut.set_exception(fr.ChannelError(f"{self.client.service}: error reply {value!r}"))


__all__ = ["ChannelServer", "ChannelClient", "DEFAULT_MAX_FRAME"]
