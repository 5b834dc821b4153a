"""What the HTTP layer asks of the cluster: two small protocols the Controller actor satisfies.

Strategy: the HTTP server runs inside the Controller's event loop (``actors.controller``) and calls the
controller object directly, never through Ray. ``actors/`` may not import ``cluster/`` (DESIGN.md layers),
so the controller is handed :class:`cluster.http.HttpService` at construction and these protocols describe,
structurally, what the service uses:

- :class:`ClusterView`: ``status()`` (the ``fanout status`` JSON), ``metrics_snapshot()`` (what ``/metrics``
  renders, see :mod:`cluster.http.metrics`) and ``inspect(kind, id)`` (``fanout inspect``).
- :class:`RequestsView`: the request lifecycle (``/api/requests...``, the console's requests panel and
  ``fanout_requests{state}``). The Controller implements it over the per-request counters each shard keeps
  in its store (:mod:`actors.requests`, :mod:`storage.request_stats`). A cluster view without it (a test
  double, an older controller) gets :class:`InspectRequests` from :func:`requests_view`: ``request_status``
  from the ``reqs`` rows that ``fanout inspect request ID`` reads, :class:`NotBuilt` (HTTP 501) for the rest.
"""
from __future__ import annotations

from typing import Any, Protocol, runtime_checkable


class NotBuilt(NotImplementedError):
    """A route whose data the cluster does not keep yet; the message says what is missing (HTTP 501)."""


@runtime_checkable
class ClusterView(Protocol):
    async def status(self) -> dict[str, Any]: ...

    async def metrics_snapshot(self) -> dict[str, Any]: ...

    async def inspect(self, kind: str, ident: str) -> dict[str, Any]: ...


@runtime_checkable
class RequestsView(Protocol):
    """The request lifecycle as the HTTP routes and the console see it.

    ``request_status`` returns ``{"request_id", "vins", "delivered", "pending", ...}`` (the issue's fields
    that the implementation keeps; ``"truncated": True`` when counts are a lower bound) or None for an
    unknown request. Any method may raise :class:`NotBuilt` (or ``NotImplementedError``): the route answers
    501 with its message.
    """

    async def list_requests(self, limit: int) -> list[dict[str, Any]]: ...

    async def request_status(self, request_id: str) -> dict[str, Any] | None: ...

    async def cancel_request(self, request_id: str) -> dict[str, Any] | None: ...

    async def request_states(self) -> dict[str, int]: ...


LIFECYCLE = "the request lifecycle (per-request counters in the store, issue 15)"


class InspectRequests:
    """:class:`RequestsView` over ``inspect("request", id)``: per-status counts of a request's ``reqs`` rows.

    Each shard reads at most ``ShardCore.inspect_request``'s limit (1,000 rows) of one request; beyond
    that the counts are a lower bound and the answer says ``"truncated": true``.
    """

    def __init__(self, cluster: ClusterView) -> None:
        self._cluster = cluster

    async def list_requests(self, limit: int) -> list[dict[str, Any]]:
        raise NotBuilt(f"listing requests needs {LIFECYCLE}; GET /api/requests/ID answers one request")

    async def request_status(self, request_id: str) -> dict[str, Any] | None:
        found = await self._cluster.inspect("request", request_id)
        if not found["rows"]:
            return None
        by_status = found["by_status"]
        return {"request_id": request_id, "vins": found["rows"], "delivered": by_status.get("delivered", 0),
                "pending": by_status.get("pending", 0),
                "truncated": any(s.get("truncated") for s in found["shards"]), "source": "reqs rows"}

    async def cancel_request(self, request_id: str) -> dict[str, Any] | None:
        raise NotBuilt(f"cancelling a request needs {LIFECYCLE}")

    async def request_states(self) -> dict[str, int]:
        raise NotBuilt(f"request counts per state need {LIFECYCLE}")


def requests_view(cluster: Any) -> RequestsView:
    """The cluster itself when it implements :class:`RequestsView`, else :class:`InspectRequests` over it."""
    return cluster if isinstance(cluster, RequestsView) else InspectRequests(cluster)


__all__ = ["ClusterView", "RequestsView", "InspectRequests", "NotBuilt", "requests_view"]
