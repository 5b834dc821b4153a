"""The records of the dispatch state machine (:mod:`fanout.dispatcher.machine`): the rows it reads, the
actions it emits, the per-VIN state it keeps and its counters."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol

NodeId = str


@dataclass(frozen=True, slots=True)
class Row:
    """One pending fanout row of the ``ids`` table; a VIN's rows go oldest first by (ts_ms, request_id)."""

    key: bytes  # store key: order-preserving encoding of (vin, ts_ms, request_id)
    vin: str
    ts_ms: int  # ingest time
    request_id: str  # last level of the delivery topic
    data_id: str  # the blob to deliver


class PendingRows(Protocol):
    """Read access to the pending rows of the dispatcher's shard.

    A source may also offer ``next_row_skipping(vin, skip) -> Row | None`` (the oldest row whose key is
    not in ``skip``); the machine then asks once per send instead of once per skipped key (Rule 4).
    """

    def next_row(self, vin: str, after: bytes | None = None) -> Row | None:
        """The oldest pending row of ``vin`` whose key is greater than ``after`` (all rows if None)."""
        ...


# Send and Delete are made once per delivery: plain slotted dataclasses (hashable, treated as immutable)
# build ~4x faster than frozen ones, whose __init__ goes through object.__setattr__ per field.
@dataclass(slots=True, unsafe_hash=True)
class Send:
    """Deliver ``row`` to ``vin`` on connection ``(node, generation)`` as QoS 1. The node drops it if that
    connection is gone (the dispatcher learns of it from the node's own disconnect/connect events)."""

    vin: str
    node: NodeId
    generation: int
    row: Row
    dup: bool = False  # DUP=1: this row may have reached the vehicle before (see VinDispatcher.maybe_send)


@dataclass(slots=True, unsafe_hash=True)
class Delete:
    """Delete row ``key`` of ``vin`` (``storage.keys.decode_ids_key`` gives vin, ts_ms, request_id)."""

    vin: str
    key: bytes
    discarded: bool = False  # not delivered: dropped undeliverable (its blob is gone), not acknowledged
    expired: bool = False  # not delivered: its request's ttl passed before it was sent


Action = Send | Delete


@dataclass(slots=True)
class DeliveryPlan:
    """The actions of one tick: one ``deliver`` call per node, one write batch of deletes."""

    sends: dict[NodeId, list[Send]] = field(default_factory=dict)
    deletes: list[Delete] = field(default_factory=list)

    def __bool__(self) -> bool:
        return bool(self.sends or self.deletes)


@dataclass(slots=True)
class InFlight:
    """The row sent to a vehicle and not acknowledged yet."""

    key: bytes  # store key of the row
    row: Row | None = None  # None when only the key is known (resumed session)
    sent_ms: int | None = None  # time of the drain that handed it to the node; None before, or resumed


@dataclass(slots=True)
class VehicleState:
    """What the dispatcher knows of one VIN."""

    node: NodeId | None = None  # node of the live connection; None when disconnected
    generation: int = -1  # newest connection seen, live or closed (-1: none); fences stale events
    subscribed: bool = False  # a filter matching the delivery topic (the node checks the filter)
    inflight: InFlight | None = None  # the unacked row, if any
    resumed_inflight: bool = False  # inflight came from a resumed session; the node redelivers it
    deleting: set[bytes] | None = None  # acked keys whose Delete is not confirmed yet (Rule 4)
    attempted: bytes | None = None  # key of the row last handed to a node for this VIN; b"" once acknowledged
    attempted_on: Send | None = None  # the send that handed it out: its connection's session may hold it
    read_nothing: bool = False  # the last read for a send found no row: heartbeats skip the store (Rule 7)


@dataclass(frozen=True, slots=True)
class DispatchStats:
    """Counters for ``$SYS/fanout/...`` and ``fanout status``."""

    vehicles: int  # VINs with state: connected, or something pending (Rule 6)
    fenced: int  # VINs whose state was dropped, remembered by the generation of their last connection
    connected: int  # VINs with a live connection
    inflight: int  # VINs with an unacked row (sent or resumed)
    pending_sends: int  # sends queued, not drained yet
    pending_deletes: int  # deletes not confirmed by ``on_deleted`` yet
    sent: int  # sends emitted since start
    delivered: int  # PUBACKs that deleted a row not already being deleted
    stale_events: int  # events ignored: older generation, or a connection not seen
    oldest_inflight_age_ms: int | None  # oldest drained in-flight row (``stats(now_ms)`` only)


__all__ = ["Row", "PendingRows", "Send", "Delete", "Action", "DeliveryPlan", "InFlight", "VehicleState",
           "DispatchStats", "NodeId"]
