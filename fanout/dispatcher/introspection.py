"""What ``fanout status``, ``fanout inspect`` and ``$SYS/fanout/...`` read from one dispatcher core."""
from __future__ import annotations

from typing import Any, Protocol

from fanout.dispatcher.blobs import BlobCache
from fanout.dispatcher.machine import VinDispatcher
from fanout.dispatcher.state import InFlight
from fanout.dispatcher.takeover import TakeoverRegistry
from storage.keys import decode_ids_key

INSPECT_ROWS = 20


class DispatcherCore(Protocol):
    """What is read here of :class:`fanout.dispatcher.core.DispatcherCore` (which imports this module)."""

    store: Any
    shard: int
    vd: VinDispatcher
    registry: TakeoverRegistry
    blobs: BlobCache
    events_in: int
    rows_enqueued: int
    commits: int


def _inflight_json(inflight: InFlight | None) -> dict[str, Any] | None:
    if inflight is None:
        return None
    _vin, ts_ms, request_id = decode_ids_key(inflight.key)
    return {"request_id": request_id, "ts_ms": ts_ms, "sent_ms": inflight.sent_ms}


def shard_stats(core: DispatcherCore) -> dict[str, Any]:
    """Counters of one shard (store entries, dispatch state, ingest and takeover counters)."""
    st = core.vd.stats()
    ss = core.store.stats()
    entries = ss["entries"]
    return {
        "shard": core.shard,
        "pending_rows": entries["ids"],
        "requests_rows": entries["reqs"],
        "data_blobs": entries["data"],
        "in_flight": st.inflight,
        "connected": st.connected,
        "vehicles": st.vehicles,
        "fenced": st.fenced,
        "known_data_ids": core.blobs.known_data_ids,
        "sent": st.sent,
        "delivered": st.delivered,
        "stale_events": st.stale_events,
        "events": core.events_in,
        "rows_enqueued": core.rows_enqueued,
        "commits": core.commits,
        "takeovers": core.registry.takeovers,
        "clients": len(core.registry),
        "applied_seq": ss["applied_seq"],
        "used_bytes": ss["used_bytes"],
    }


def inspect_vin(core: DispatcherCore, vin: str) -> dict[str, Any]:
    """Dispatch state and pending rows of one VIN."""
    vs = core.vd.vehicle(vin)
    rows = core.store.next_rows(vin, limit=INSPECT_ROWS)
    state = None
    if vs is not None:
        state = {"node": vs.node, "generation": vs.generation, "subscribed": vs.subscribed,
                 "inflight": _inflight_json(vs.inflight), "resumed_inflight": vs.resumed_inflight}
    client = core.registry.connection(vin)
    return {
        "vin": vin, "shard": core.shard, "state": state,
        "connection": None if client is None else {"node": client[0], "generation": client[1]},
        "pending_rows": core.store.pending_count(vin),
        "rows": [{"ts_ms": r.ts_ms, "request_id": r.request_id, "data_id": r.data_id} for r in rows],
    }


def inspect_request(core: DispatcherCore, request_id: str, limit: int = 1000) -> dict[str, Any]:
    """``reqs`` rows of one request on this shard: counts per status and a sample."""
    rows = core.store.request_rows(request_id, limit=limit)
    by_status: dict[str, int] = {}
    for r in rows:
        by_status[r["status"]] = by_status.get(r["status"], 0) + 1
    return {"shard": core.shard, "rows": len(rows), "by_status": by_status, "truncated": len(rows) >= limit,
            "sample": rows[:INSPECT_ROWS], "user_properties": core.store.get_user_properties(request_id)}


__all__ = ["shard_stats", "inspect_vin", "inspect_request", "INSPECT_ROWS"]
