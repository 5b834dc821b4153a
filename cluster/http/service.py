"""The controller's HTTP listener: binding, TLS, bounds, start and stop (routes in :mod:`cluster.http.routes`).

Strategy (Ray Serve's proxy actor, STYLE.md section 4): the Controller actor creates one
:class:`HttpService` in its ``__init__`` and schedules :meth:`HttpService.start` as a task on its event
loop; the Controller's ``ready()`` awaits that task and re-raises its failure, so ``fanout up`` fails with
a message naming ``http.host:port`` when the port is taken. The server shares the controller's event loop
and calls the controller object directly (no Ray call to itself). No signal handlers (an actor has no main
thread).

Bounds: at most :data:`MAX_CONNECTIONS` connections (more get ``503`` and are closed), request line and
header fields <= 8 KiB, at most :data:`MAX_HEADERS` header lines, request bodies <= :data:`MAX_BODY_BYTES`,
an idle or never-completed connection closed after :data:`KEEPALIVE_S`, TLS handshakes bounded by
:data:`TLS_HANDSHAKE_S` each and at most :data:`MAX_CONNECTIONS` at once (counted by outcome,
:mod:`fanout.mqtt.tls_handshakes`), every route bounded by ``routes.ROUTE_TIMEOUT_S``.

``/metrics`` scrapes are single-flight: a scrape arriving while one is being gathered shares its result,
so many scrapers (or console tabs) cost the nodes and shards one round of calls.
"""
from __future__ import annotations

import asyncio
import socket
import time
from typing import Any

import structlog
from aiohttp import web

from fanout.mqtt.tls_handshakes import HandshakeStats

from .auth import HttpAuth, tls_context
from .metrics import render
from .routes import build_app
from .views import ClusterView, RequestsView, requests_view

log = structlog.get_logger(__name__)

MAX_CONNECTIONS = 64
MAX_HEADERS = 64
MAX_FIELD_BYTES = 8190
MAX_BODY_BYTES = 64 * 1024
KEEPALIVE_S = 15.0
TLS_HANDSHAKE_S = 10.0
SHUTDOWN_S = 5.0
_BUSY = b"HTTP/1.1 503 Service Unavailable\r\nContent-Length: 0\r\nConnection: close\r\nRetry-After: 1\r\n\r\n"


class _Busy(asyncio.Protocol):
    """A connection over :data:`MAX_CONNECTIONS`: answer 503 and close."""

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        transport.write(_BUSY)  # type: ignore[attr-defined]
        transport.close()


def format_url(scheme: str, host: str, port: int) -> str:
    """``scheme://host:port/`` with IPv6 literals in brackets."""
    return f"{scheme}://[{host}]:{port}/" if ":" in host else f"{scheme}://{host}:{port}/"


class HttpService:
    """The HTTP listener of a cluster view (the Controller).

    Args:
        config: the loaded config (``http.host``, ``http.port``, users, ``mqtt.tls_*``).
        cluster: what the routes read (:class:`cluster.http.views.ClusterView`; a
            :class:`~cluster.http.views.RequestsView` too once the request lifecycle exists).
    """

    def __init__(self, config: Any, cluster: ClusterView) -> None:
        self.config = config
        self.cluster = cluster
        self.requests: RequestsView = requests_view(cluster)
        self.host: str = config.http.host
        self.port: int = config.http.port
        self.auth: HttpAuth = None  # type: ignore[assignment]  # set by start(), before the first request
        self.url: str | None = None
        self.refused_connections = 0
        self.handshakes: HandshakeStats | None = None  # with TLS: how the listener's handshakes ended
        self._runner: web.AppRunner | None = None
        self._server: asyncio.AbstractServer | None = None
        self._scrape: asyncio.Future | None = None

    async def start(self) -> str:
        """Bind and serve; return the URL (``http(s)://H:P/``).

        Raises:
            ConfigError: no users on a non-loopback host, TLS files that do not load.
            RuntimeError: the address cannot be bound (the message names ``http.host:port``).
        """
        self.auth = HttpAuth(self.config)
        ssl_ctx = tls_context(self.config)
        if ssl_ctx is not None:
            self.handshakes = HandshakeStats("http", MAX_CONNECTIONS, "cluster.http.service.MAX_CONNECTIONS")
            self.handshakes.install(ssl_ctx)
        runner = web.AppRunner(build_app(self, max_body_bytes=MAX_BODY_BYTES), handle_signals=False,
                               access_log=None, keepalive_timeout=KEEPALIVE_S, max_headers=MAX_HEADERS,
                               max_line_size=MAX_FIELD_BYTES, max_field_size=MAX_FIELD_BYTES,
                               shutdown_timeout=SHUTDOWN_S)
        await runner.setup()
        try:
            sock = _bind(self.host, self.port)
            self._server = await asyncio.get_running_loop().create_server(
                self._protocol, sock=sock, ssl=ssl_ctx, ssl_handshake_timeout=TLS_HANDSHAKE_S if ssl_ctx else None)
        except BaseException:
            await runner.cleanup()
            raise
        self._runner = runner
        self.url = format_url("https" if ssl_ctx else "http", self.host, sock.getsockname()[1])
        if self.auth.development:
            log.warning("http console open without login (development mode)", url=self.url,
                        hint="loopback listener without [users]; configure an admin user to require a login")
        elif not any(u.role == "admin" for u in self.config.users.values()):
            log.warning("no admin user configured: only /metrics can be used", url=self.url,
                        hint="add an [users.<name>] table with role = \"admin\"")
        log.info("http listener ready", url=self.url, tls=ssl_ctx is not None, login=not self.auth.development)
        return self.url

    def _protocol(self) -> asyncio.BaseProtocol:
        server = self._runner.server if self._runner is not None else None
        if server is None or len(server.connections) >= MAX_CONNECTIONS:
            self.refused_connections += 1
            return _Busy()
        return server()

    async def stop(self) -> None:
        """Stop accepting, close connections (in-flight requests get :data:`SHUTDOWN_S`)."""
        if self._server is not None:
            self._server.close()
            self._server = None
        if self._runner is not None:
            runner, self._runner = self._runner, None
            await runner.cleanup()
            log.info("http listener stopped", url=self.url)

    async def metrics_text(self) -> bytes:
        """The ``/metrics`` body: one cluster snapshot (shared by concurrent scrapes), rendered."""
        if self._scrape is None:
            self._scrape = asyncio.ensure_future(self._gather())
            self._scrape.add_done_callback(self._scrape_done)
        snapshot = await asyncio.shield(self._scrape)
        return render(snapshot)

    def _scrape_done(self, fut: asyncio.Future) -> None:
        self._scrape = None
        if not fut.cancelled():
            fut.exception()  # retrieved: the awaiting routes report it

    async def _gather(self) -> dict[str, Any]:
        started = time.perf_counter()
        snapshot = dict(await self.cluster.metrics_snapshot())
        try:
            snapshot["requests"] = await self.requests.request_states()
        except NotImplementedError:
            snapshot["requests"] = None
        snapshot["http_auth_failures"] = self.auth.failures
        snapshot["http_tls"] = self.handshakes.figures() if self.handshakes is not None else None
        snapshot["collect_s"] = time.perf_counter() - started
        return snapshot


def _bind(host: str, port: int) -> socket.socket:
    """A listening socket on ``host:port`` (IPv4 or IPv6, SO_REUSEADDR).

    Raises:
        RuntimeError: the address cannot be resolved or bound; names ``http.host:port``.
    """
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
        family, kind, proto, _, address = infos[0]
        sock = socket.socket(family, kind, proto)
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            sock.bind(address)
            sock.listen(128)
            sock.setblocking(False)
        except BaseException:
            sock.close()
            raise
    except OSError as exc:
        where = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
        raise RuntimeError(f"cannot listen for HTTP on {where} (http.host/http.port; 0 = no HTTP listener): "
                           f"{exc.strerror or exc}") from None
    return sock


__all__ = ["HttpService", "format_url", "MAX_CONNECTIONS"]
