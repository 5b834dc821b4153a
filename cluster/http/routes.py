"""The HTTP routes (aiohttp handlers) and the guard every request passes first.

Routes (JSON unless said otherwise; ``ID`` is a request id, checked as the store checks it):

=======================================  =================================================================
``GET /metrics``                         Prometheus text exposition (:mod:`cluster.http.metrics`); no login
``GET /api/status``                      what ``fanout status`` prints
``GET /api/requests/ID``                 one request: ``request_id``, ``vins``, ``delivered``, ``pending``,
                                         ``inflight``, ``expired``, ``discarded``, ``cancelled``, ``state``,
                                         first/last delivery and expiry times (ms); 404 if unknown
``GET /api/requests?limit=N``            ``{"requests": [...]}``: the first N (<= 1000) requests by id
``POST /api/requests/ID/cancel``         cancel: nothing more of it is delivered; its status after (404 if unknown)
``GET /``, ``/static/console.{js,css}``  the console page (files under ``cluster/http/static``)
=======================================  =================================================================

The guard (:func:`guard`): the login rule of :mod:`cluster.http.auth`; a state-changing method (POST)
from a browser must come from the console's own origin (``Origin`` equal to the request's scheme and
``Host``, ``Sec-Fetch-Site`` same-origin), since a browser re-sends cached basic credentials with
cross-site requests; errors become JSON ``{"error": ...}``: NotImplementedError 501, ValueError 400, a
RuntimeError of the cluster (e.g. not started) 503, a timeout 504, anything else 500 (logged). Every
response carries ``nosniff``, a same-origin-only Content-Security-Policy and ``no-store`` for data.
"""
from __future__ import annotations

import asyncio
import json
from functools import partial
from pathlib import Path
from typing import Awaitable, Callable, Protocol

import structlog
from aiohttp import web

from storage.keys import check_request_id

from .auth import REALM, HttpAuth
from .metrics import CONTENT_TYPE
from .views import ClusterView, RequestsView

log = structlog.get_logger(__name__)


class Served(Protocol):
    """What the routes use of :class:`cluster.http.service.HttpService`."""

    auth: HttpAuth
    cluster: ClusterView
    requests: RequestsView

    async def metrics_text(self) -> bytes: ...


SERVICE: web.AppKey[Served] = web.AppKey("fanout_http_service")
STATIC_DIR = Path(__file__).resolve().parent / "static"
# path -> (file under STATIC_DIR, content type); nothing else is served from disk
STATIC_FILES: dict[str, tuple[str, str]] = {
    "/": ("console.html", "text/html; charset=utf-8"),
    "/static/console.js": ("console.js", "text/javascript; charset=utf-8"),
    "/static/console.css": ("console.css", "text/css; charset=utf-8"),
}
CSP = ("default-src 'none'; script-src 'self'; style-src 'self'; connect-src 'self'; img-src 'self'; "
       "base-uri 'none'; form-action 'none'; frame-ancestors 'none'")
ROUTE_TIMEOUT_S = 15.0
LIST_LIMIT_MAX = 1000

_dumps = partial(json.dumps, default=str, separators=(",", ":"))


def _error(status: int, message: str, headers: dict[str, str] | None = None) -> web.Response:
    return web.json_response({"error": message}, status=status, headers=headers, dumps=_dumps)


def _same_origin(request: web.Request) -> bool:
    site = request.headers.get("Sec-Fetch-Site")
    if site is not None and site not in ("same-origin", "none"):
        return False
    origin = request.headers.get("Origin")
    return origin is None or origin == f"{request.scheme}://{request.host}"


@web.middleware
async def guard(request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]) -> web.StreamResponse:
    service = request.app[SERVICE]
    auth = service.auth
    if auth.required(request.path):
        decision = await auth.decide(request.headers.get("Authorization"))
        if decision.status == 401:
            return _error(401, "login required: an admin user (HTTP basic)", {"WWW-Authenticate": REALM})
        if decision.status == 403:
            return _error(403, f"user {decision.user!r} is not an admin")
    if request.method not in ("GET", "HEAD", "OPTIONS") and not _same_origin(request):
        return _error(403, "cross-origin request refused")
    try:
        return await asyncio.wait_for(handler(request), ROUTE_TIMEOUT_S)
    except web.HTTPException:
        raise
    except NotImplementedError as exc:
        return _error(501, str(exc))
    except ValueError as exc:
        return _error(400, str(exc))
    except asyncio.TimeoutError:
        return _error(504, f"the cluster did not answer within {ROUTE_TIMEOUT_S:.0f}s")
    except RuntimeError as exc:  # the controller's own "not started" and the like
        message = str(exc).strip().splitlines()[-1] if str(exc).strip() else "cluster unavailable"
        log.warning("http route unavailable", path=request.path, error=message)
        return _error(503, message)
    except Exception:
        log.exception("http route failed", path=request.path, method=request.method)
        return _error(500, "internal error (logged by the controller)")


async def _headers(request: web.Request, response: web.StreamResponse) -> None:
    """Security and caching headers on every response (``on_response_prepare``)."""
    h = response.headers
    h["X-Content-Type-Options"] = "nosniff"
    h["Content-Security-Policy"] = CSP
    h["Referrer-Policy"] = "no-referrer"
    h["X-Frame-Options"] = "DENY"
    h["Server"] = "sdv-fanout"
    h.setdefault("Cache-Control", "no-cache" if request.path in STATIC_FILES else "no-store")


async def metrics(request: web.Request) -> web.Response:
    body = await request.app[SERVICE].metrics_text()
    return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE})


async def status(request: web.Request) -> web.Response:
    return web.json_response(await request.app[SERVICE].cluster.status(), dumps=_dumps)


async def list_requests(request: web.Request) -> web.Response:
    raw = request.query.get("limit", "100")
    if not raw.isdigit() or not 1 <= int(raw) <= LIST_LIMIT_MAX:
        raise ValueError(f"limit must be an integer from 1 to {LIST_LIMIT_MAX}, got {raw!r}")
    rows = await request.app[SERVICE].requests.list_requests(int(raw))
    return web.json_response({"requests": rows}, dumps=_dumps)


async def _one_request(request: web.Request, verb: Callable[[str], Awaitable[dict | None]]) -> web.Response:
    """``verb(request_id)`` of the id in the path (checked as the store checks it); 404 when it returns None."""
    request_id = request.match_info["request_id"]
    check_request_id(request_id)
    found = await verb(request_id)
    if found is None:
        return _error(404, f"no request {request_id!r} is known to the cluster")
    return web.json_response(found, dumps=_dumps)


async def show_request(request: web.Request) -> web.Response:
    return await _one_request(request, request.app[SERVICE].requests.request_status)


async def cancel_request(request: web.Request) -> web.Response:
    return await _one_request(request, request.app[SERVICE].requests.cancel_request)


def _static(path: str, body: bytes, content_type: str) -> Callable[[web.Request], Awaitable[web.Response]]:
    async def serve(request: web.Request) -> web.Response:
        return web.Response(body=body, headers={"Content-Type": content_type})

    serve.__name__ = f"static {path}"
    return serve


def build_app(service: Served, *, max_body_bytes: int) -> web.Application:
    """The aiohttp application of ``service`` (static files read once, here)."""
    app = web.Application(middlewares=[guard], client_max_size=max_body_bytes)
    app[SERVICE] = service
    app.on_response_prepare.append(_headers)
    app.router.add_get("/metrics", metrics)
    app.router.add_get("/api/status", status)
    app.router.add_get("/api/requests", list_requests)
    # a request id is one MQTT topic level: no '/' (check_request_id refuses NUL and over-long ids)
    app.router.add_get("/api/requests/{request_id}", show_request)
    app.router.add_post("/api/requests/{request_id}/cancel", cancel_request)
    for path, (name, content_type) in STATIC_FILES.items():
        app.router.add_get(path, _static(path, (STATIC_DIR / name).read_bytes(), content_type))
    return app


__all__ = ["build_app", "guard", "STATIC_FILES", "CSP", "SERVICE"]
