"""The Controller's questions to every shard: request lifecycle (status, list, cancel, expiry sweep) and
``fanout inspect``.

Strategy: a request's VINs are spread over the shards by VIN, so every question goes to every shard's
primary (one call each, concurrently) and the answers are merged here (:func:`fanout.dispatcher.lifecycle.merge`).
The counters come from each shard's ``requests`` table (kept by the writes, replicated), the rows in flight
from each dispatcher's memory. A cancel is applied by every primary through its single writer: when
:meth:`RequestDesk.cancel_request` returns, no shard sends the request any more and its pending rows are
settled as cancelled on every replica.
"""
from __future__ import annotations

import asyncio
from typing import Any, Callable

from fanout.dispatcher.lifecycle import merge
from storage.keys import check_request_id, check_vin, shard_of
from storage.request_stats import count_states

CALL_TIMEOUT_S = 10.0
STATES_LIMIT = 100_000  # requests per shard read for fanout_requests{state}


class RequestDesk:
    """Request lifecycle across the shards.

    Args:
        dispatchers: returns the current primary handle of each shard (it changes on failover).
    """

    def __init__(self, dispatchers: Callable[[], list[Any]]) -> None:
        self._dispatchers = dispatchers

    def _all(self) -> list[Any]:
        found = self._dispatchers()
        if not found:
            raise RuntimeError("the fanout cluster is not started")
        return found

    async def _ask(self, method: str, *args: Any) -> list[Any]:
        return await asyncio.gather(*(asyncio.wait_for(getattr(d, method).remote(*args), CALL_TIMEOUT_S)
                                      for d in self._all()))

    async def request_status(self, request_id: str) -> dict[str, Any] | None:
        """``{request_id, vins, pending, inflight, delivered, discarded, expired, cancelled, state, times}``
        summed over the shards, or None when no shard knows the request."""
        check_request_id(request_id)
        parts = [p for p in await self._ask("request_status", request_id) if p is not None]
        return merge(parts) if parts else None

    async def list_requests(self, limit: int = 100) -> list[dict[str, Any]]:
        """The first ``limit`` requests by request id, each summed over the shards."""
        by_id: dict[str, list[dict[str, Any]]] = {}
        for rows in await self._ask("list_requests", limit):
            for row in rows:
                by_id.setdefault(row["request_id"], []).append(row)
        return [merge(by_id[rid]) for rid in sorted(by_id)[:limit]]

    async def cancel_request(self, request_id: str) -> dict[str, Any] | None:
        """Cancel ``request_id`` on every shard (idempotent); its status after, or None if it is unknown."""
        check_request_id(request_id)
        if await self.request_status(request_id) is None:
            return None
        parts = [p for p in await self._ask("cancel_request", request_id) if p is not None]
        return merge(parts) if parts else None

    async def request_states(self) -> dict[str, int]:
        """How many requests are in each state (``active``, ``done``, ``cancelled``, ``expired``)."""
        return count_states(await self._ask("request_states", STATES_LIMIT))

    async def expire_sweep(self) -> dict[str, Any]:
        """Every shard settles the pending rows of its lapsed requests (the GC cycle's expiry step)."""
        done = await self._ask("expire_sweep")
        return {"requests": sorted({r for d in done for r in d["requests"]}), "rows": sum(d["rows"] for d in done)}

    async def inspect(self, kind: str, ident: str) -> dict[str, Any]:
        """``fanout inspect vin|data|request ID``.

        Raises:
            ValueError: unknown kind or an invalid id.
        """
        dispatchers = self._all()
        if kind == "vin":
            check_vin(ident)
            return await dispatchers[shard_of(ident, len(dispatchers))].inspect_vin.remote(ident)
        if kind == "request":
            parts = await asyncio.gather(*(d.inspect_request.remote(ident) for d in dispatchers))
            by_status: dict[str, int] = {}
            for p in parts:
                for st, n in p["by_status"].items():
                    by_status[st] = by_status.get(st, 0) + n
            return {"request_id": ident, "rows": sum(p["rows"] for p in parts), "by_status": by_status,
                    "shards": parts}
        if kind == "data":
            metas = await asyncio.gather(*(d.inspect_data.remote(ident) for d in dispatchers))
            return {"data_id": ident, "present_on_shards": sum(m is not None for m in metas),
                    "shards": len(metas), "meta": next((m for m in metas if m is not None), None)}
        raise ValueError(f"unknown inspect kind {kind!r} (vin, data or request)")


__all__ = ["RequestDesk", "STATES_LIMIT"]
