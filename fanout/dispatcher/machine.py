"""Per-shard dispatch state machine: one fanout message in flight per vehicle.

Pure: no I/O, no clock, no Ray. Inputs are the events a ConnectionNode reports (connect, subscribe,
heartbeat, PUBACK, disconnect) and new batches; outputs are actions (``Send``, ``Delete``) that are both
returned by each input and queued until the dispatcher core calls ``drain_actions(now_ms)``, which groups
sends per node so the actor makes one ``deliver(batch)`` call per node per tick. Rows are read through the
``PendingRows`` protocol (the LMDB shard store in production, via :class:`fanout.dispatcher.rows.TickRows`).

Strategy (after emqx-plugin-sdv's dispatcher):
  Rule 1 - only three triggers send: a new batch, a heartbeat (``ecp/<VIN>/heartbeat`` or ``/online``)
           and a PUBACK of the current connection. Each calls ``maybe_send``, which is idempotent: a no-op
           while a row is in flight or the vehicle is not connected and subscribed. Connect and subscribe
           never send: "a reconnect with a persistent session gets nothing until a heartbeat".
  Rule 2 - every connection has a generation (:mod:`fanout.generations`): the newest connection of a VIN
           is the last one that connected (by counter on one node, by arrival across nodes). An event of
           any other generation is stale and ignored, except that a stale PUBACK still deletes its row (the
           vehicle did receive it). A disconnect clears presence and in-flight state.
  Rule 3 - a session resumed with the unacked fanout message still in it (``on_connect`` with
           ``inflight_row_key``) is in flight: the node redelivers it with DUP=1 itself, so heartbeats do
           not send it again.
  Rule 4 - a ``Delete`` is applied by the actor after the tick and may lag (replication), so the keys
           being deleted are remembered per VIN and skipped when reading the next row (``after=key``)
           until the actor confirms them with ``on_deleted``. Without this an acked row whose delete has
           not landed yet would be sent a second time.
  Rule 5 - a queued ``Send`` whose VIN has moved on (disconnected, reconnected, other row) before the
           drain is dropped at drain time; the row stays in the store and is sent again later.
  Rule 6 - the state of a VIN lives while it is connected or something is pending for it: a row in
           flight, a delete not confirmed yet, or a row handed to a node and not acknowledged (its resend
           carries DUP=1). Then it is dropped, so client ids that come and go cost nothing for good. What
           must outlive it is the generation of its last connection (a late connect of a connection
           already closed is stale): kept in a bounded first-in-first-out map of :data:`FENCE_SIZE`
           entries; an entry evicted only loses the fence against events older than the last
           :data:`FENCE_SIZE` closed connections of the shard.
  Rule 7 - a VIN whose last read for a send found no row is marked ``read_nothing``: its heartbeats send
           nothing without reading the store (most heartbeats of a fleet find nothing; each read was an
           LMDB cursor seek). Rows only appear through a new batch, whose ``on_batch`` clears the mark
           before it reads; a batch that finds the VIN not ready (offline, unsubscribed, a row in flight)
           leaves it, so every change of readiness clears it too: connect, disconnect, subscribe, a failed
           send. A read from a transaction older than a batch's commit can set it wrongly, but that
           batch's ``on_batch`` comes after the commit, and so after that read.
"""
from __future__ import annotations

from collections.abc import Iterable

from fanout.dispatcher.state import (
    Action, Delete, DeliveryPlan, DispatchStats, InFlight, NodeId, PendingRows, Row, Send, VehicleState,
)
from fanout.generations import incarnation_of, newer

FENCE_SIZE = 16_384  # generations of recently closed connections kept after their VIN's state is dropped
SENT_NOTHING_PENDING = b""  # ``attempted`` once its row is acknowledged: sent since the start, none out


class VinDispatcher:
    """Dispatch state of one shard: per-VIN presence, in-flight row and pending actions.

    Every input returns the actions it produced; the same actions are queued for ``drain_actions``.
    """

    def __init__(self, rows: PendingRows, started_ms: int = 0) -> None:
        """Args:
        rows: source of pending rows of this shard.
        started_ms: start of this dispatcher; rows older than it may have been sent by a predecessor.
        """
        self._started_ms = started_ms
        self._rows = rows
        self._skipping = getattr(rows, "next_row_skipping", None)
        self._vins: dict[str, VehicleState] = {}
        self._fence: dict[str, int] = {}  # VIN -> generation of its last connection, once its state is dropped
        self._sends: list[Send] = []
        self._deletes: list[Delete] = []
        self._connected = 0
        self._inflight = 0
        self._pending_deletes = 0
        self._sent = 0
        self._delivered = 0
        self._stale = 0

    # ---- inputs -------------------------------------------------------------------------------------
    def on_batch(self, vins: Iterable[str]) -> list[Action]:
        """New rows were durably queued for ``vins`` (trigger: new batch).

        A VIN with a row in flight is left alone: its new row is read after the PUBACK.
        """
        actions: list[Action] = []
        states = self._vins
        for vin in vins:
            vs = states.get(vin)
            if vs is not None:
                vs.read_nothing = False  # Rule 7: it has a row now
                if vs.node is not None and vs.subscribed and vs.inflight is None:
                    actions.extend(self.maybe_send(vin))
        return actions

    def on_connect(
        self,
        vin: str,
        node: NodeId,
        generation: int,
        session_present: bool,
        inflight_row_key: bytes | None = None,
        *,
        subscribed: bool = False,
    ) -> list[Action]:
        """A connection of ``vin`` was accepted on ``node``. Never sends (Rule 1).

        Args:
            vin: the client id.
            node: the connection node.
            generation: the connection's generation (:mod:`fanout.generations`).
            session_present: a persistent session was resumed.
            inflight_row_key: key of the unacked fanout message in the resumed session, which the node
                redelivers with DUP=1 (ignored unless ``session_present``).
            subscribed: the resumed session already holds a filter matching the delivery topic.

        Returns:
            Always empty.
        """
        vs = self._state(vin)
        if vs.generation >= 0 and not newer(generation, vs.generation):
            # Stale: a newer connection of the same node (or the disconnect of this one) was already seen.
            # Equal is a retried duplicate. A connect from another node process always takes over.
            self._stale += 1
            self._forget_if_idle(vin, vs)
            return []
        if vs.node is None:
            self._connected += 1
        # A takeover may replace a live connection without its disconnect: that connection's in-flight
        # row is no longer ours to wait for (the session, if resumed, tells us what is pending).
        self._clear_inflight(vs)
        vs.node = node
        vs.generation = generation
        vs.subscribed = subscribed and session_present
        vs.read_nothing = False
        if session_present and inflight_row_key is not None:
            self._set_inflight(vs, InFlight(key=inflight_row_key))
            vs.resumed_inflight = True
        return []

    def on_subscribe(self, vin: str, generation: int, subscribed: bool, at_us: int | None = None) -> list[Action]:
        """The connection's subscriptions changed: does it now match its delivery topic?

        Not a trigger for rows written before the subscription (a late subscriber waits for its
        heartbeat, as the contract says). But a row written after it (``ts_ms`` against ``at_us``, the
        node's wall clock when it granted the subscription) is sent now: events and ingest reach the
        dispatcher by separate calls, so a batch the platform published after the vehicle's SUBACK can
        arrive before the subscription does, and that vehicle is owed realtime delivery.

        An unsubscribe keeps the in-flight row: its PUBACK may still come.
        """
        vs = self._live(vin, generation)
        if vs is None:
            return []
        vs.read_nothing = False
        was, vs.subscribed = vs.subscribed, subscribed
        if subscribed and not was and at_us is not None and vs.inflight is None:
            row = self._next_row(vin, vs.deleting)
            if row is not None and row.ts_ms * 1000 >= at_us:
                return self.maybe_send(vin)
        return []

    def on_heartbeat(self, vin: str, generation: int) -> list[Action]:
        """``ecp/<VIN>/heartbeat`` or ``ecp/<VIN>/online`` (trigger). A no-op during a resumed in-flight
        row: the node is redelivering it (Rule 3)."""
        if self._live(vin, generation) is None:
            return []
        return self.maybe_send(vin)

    def on_puback(self, vin: str, generation: int, row_key: bytes) -> list[Action]:
        """The vehicle acknowledged ``row_key`` (trigger): delete it, then send the next row.

        The row is deleted even when the dispatcher does not track it (an ack after a dispatcher restart,
        or after a disconnect of the same generation was processed first): the vehicle has it.

        This runs once per delivery, so the common case (the live connection acks its in-flight row) is
        inlined: one state look-up, one ``Delete``, one next-row read and one ``Send``.
        """
        vs = self._vins.get(vin)
        if vs is None:
            vs = self._state(vin)
        delete = self._delete_of(vs, vin, row_key)
        if vs.attempted == row_key:
            vs.attempted, vs.attempted_on = SENT_NOTHING_PENDING, None  # acknowledged: nothing of it is pending
        if vs.node is None or generation != vs.generation:
            # Stale ack: e.g. the vehicle acked just before its connection dropped and the disconnect was
            # processed first. Only the delete counts; a newer connection's in-flight copy of the same row
            # will be acked on its own, and it is no trigger for a newer connection.
            self._stale += 1
            return [delete]
        inflight = vs.inflight
        if inflight is not None:
            if inflight.key != row_key:
                return [delete]  # an ack of another key (untracked): the tracked row's ack is still due
            self._inflight -= 1  # _clear_inflight, inlined
            vs.inflight = None
            vs.resumed_inflight = False
        send = self._send_next(vin, vs) if vs.subscribed else None
        return [delete] if send is None else [delete, send]

    def on_disconnect(self, vin: str, generation: int) -> list[Action]:
        """The connection ``generation`` of ``vin`` closed: clear presence and in-flight state.

        A disconnect of another connection is ignored (the vehicle already reconnected, possibly on
        another node), except a newer one of the same node process whose connect was not seen yet: that
        generation is recorded so that the late connect is ignored as well.
        """
        vs = self._vins.get(vin)
        known = vs.generation if vs is not None else self._fence.get(vin, -1)
        live = vs is not None and generation == known and vs.node is not None
        unseen = (known < 0 or incarnation_of(generation) == incarnation_of(known)) and generation > known
        if not (live or unseen):
            self._stale += 1
            return []
        if vs is None:
            self._remember(vin, generation)
            return []
        self._go_offline(vs)
        vs.generation = generation
        self._forget_if_idle(vin, vs)
        return []

    def on_node_down(self, node: NodeId) -> list[Action]:
        """A connection node died (or stalled and was declared down): every VIN connected there is
        disconnected. O(vehicles). The generations are forgotten too, so that if the node comes back
        and resends its live connections (``EV_SYNC``, same generations) they are taken, not fenced
        as duplicates; its late events for those generations count as stale until then."""
        for vin, vs in list(self._vins.items()):
            if vs.node == node:
                self._go_offline(vs)
                vs.generation = -1
                self._forget_if_idle(vin, vs)
        return []

    def on_deleted(self, deletes: Iterable[Delete]) -> None:
        """The actor applied these deletes durably: stop skipping their keys (Rule 4)."""
        for delete in deletes:
            vs = self._vins.get(delete.vin)
            if vs is not None and vs.deleting and delete.key in vs.deleting:
                vs.deleting.discard(delete.key)
                self._pending_deletes -= 1
                if not vs.deleting:
                    vs.deleting = None
                    self._forget_if_idle(delete.vin, vs)

    def on_send_failed(self, vin: str, generation: int, row_key: bytes, *, unsubscribed: bool = False) -> list[Action]:
        """The node did not hand the in-flight row to the connection (not subscribed, queue full, call failed).

        The row stays pending; the next trigger sends it again. Never sends by itself (a failing send
        must not loop).
        """
        vs = self._vins.get(vin)
        if vs is None or vs.generation != generation or vs.node is None:
            self._stale += 1
            return []
        if unsubscribed:
            vs.subscribed = False
        vs.read_nothing = False
        if vs.inflight is not None and vs.inflight.key == row_key:
            self._clear_inflight(vs)
        return []

    def discard_inflight(self, vin: str, generation: int, row_key: bytes) -> bool:
        """Discard ``row_key`` if it is the row in flight to connection ``generation`` of ``vin`` (else the
        report is stale: counted, nothing done); the next row is sent."""
        vs = self._vins.get(vin)
        if vs is None or vs.generation != generation or vs.inflight is None or vs.inflight.key != row_key:
            self._stale += 1
            return False
        self.discard_row(vin, row_key)
        return True

    def discard_row(self, vin: str, row_key: bytes, *, expired: bool = False) -> list[Action]:
        """Drop a row that cannot be delivered (its blob was garbage-collected, or ``expired``: its request's
        ttl passed), then send the next."""
        actions: list[Action] = [self._delete(vin, row_key, delivered=False, expired=expired)]
        vs = self._vins[vin]  # _delete made sure it exists
        if vs.attempted == row_key:
            vs.attempted, vs.attempted_on = SENT_NOTHING_PENDING, None
        if vs.inflight is not None and vs.inflight.key == row_key:
            self._clear_inflight(vs)
            actions.extend(self.maybe_send(vin))
        return actions

    def maybe_send(self, vin: str) -> list[Action]:
        """Send the oldest pending row of ``vin`` if it is connected, subscribed and has none in flight.

        Idempotent: a second call while a row is in flight does nothing.

        Returns:
            ``[Send]`` or empty.
        """
        vs = self._vins.get(vin)
        if vs is None or vs.node is None or not vs.subscribed or vs.inflight is not None or vs.read_nothing:
            return []
        send = self._send_next(vin, vs)
        return [] if send is None else [send]

    def _send_next(self, vin: str, vs: VehicleState) -> Send | None:
        """Queue the send of the oldest pending row of ``vin`` (connected, subscribed, nothing in flight)."""
        row = self._next_row(vin, vs.deleting)
        if row is None:
            vs.read_nothing = True  # Rule 7
            return None
        self._inflight += 1  # _set_inflight, inlined (nothing is in flight here)
        vs.inflight = InFlight(row.key, row)
        vs.resumed_inflight = False
        # DUP=1 when this row may have reached the vehicle before: it is the row this dispatcher handed
        # to a node last (the vehicle dropped before its PUBACK), or, for the first send to a VIN since
        # this dispatcher started (a restart, or a promoted replica after failover), a row older than
        # the start: one in flight per VIN means only the oldest row can have been out under the
        # predecessor. (``attempted`` is set when a send leaves, in ``drain_actions``; a state dropped by
        # Rule 6 forgets that it sent, so a row older than the start may get DUP=1 once more after a
        # reconnect: a spurious DUP=1 is allowed, a missing one is not.)
        attempted = vs.attempted
        dup = row.key == attempted or (attempted is None and row.ts_ms < self._started_ms)
        node = vs.node
        assert node is not None  # every caller checks: connected
        send = Send(vin, node, vs.generation, row, dup)
        self._sends.append(send)
        self._sent += 1
        return send

    def ready_vins(self, vins: Iterable[str]) -> list[str]:
        """The VINs a new batch can send to now: connected, subscribed, nothing in flight (no reads)."""
        states = self._vins
        out = []
        for vin in vins:
            vs = states.get(vin)
            if vs is not None and vs.node is not None and vs.subscribed and vs.inflight is None:
                out.append(vin)
        return out

    # ---- outputs ------------------------------------------------------------------------------------
    @property
    def has_actions(self) -> bool:
        """Sends or deletes are queued for ``drain_actions``."""
        return bool(self._sends or self._deletes)

    def drain_actions(self, now_ms: int) -> DeliveryPlan:
        """Take the queued actions, sends grouped per node.

        The actor delivers each node's list in one call, applies the deletes in one write batch and then
        calls ``on_deleted(plan.deletes)``.

        Args:
            now_ms: current time, recorded as the send time of the drained rows.
        """
        plan = DeliveryPlan(deletes=self._deletes)
        for send in self._sends:
            vs = self._vins.get(send.vin)
            if vs is None:
                continue  # Rule 5 (and Rule 6: it went offline with nothing pending, its state is gone)
            inflight = vs.inflight
            if inflight is None or inflight.key != send.row.key or vs.generation != send.generation:
                # Rule 5: disconnected, reconnected or acked-elsewhere in the same tick; row still pending.
                continue
            inflight.sent_ms = now_ms
            vs.attempted = send.row.key
            vs.attempted_on = send
            plan.sends.setdefault(send.node, []).append(send)
        self._sends = []
        self._deletes = []
        return plan

    def inflight_keys(self) -> list[bytes]:
        """Keys of the rows in flight (sent or resumed, not acknowledged), one per vehicle; O(vehicles)."""
        return [vs.inflight.key for vs in self._vins.values() if vs.inflight is not None]

    def session_holder(self, vin: str) -> tuple[NodeId, int] | None:
        """The connection ``(node, generation)`` whose session may still hold the row last handed out for
        ``vin`` (not acknowledged yet), or None. When the VIN connects on another node, that session's copy
        is stale: its row is dispatched to the new connection (sent again with DUP=1)."""
        vs = self._vins.get(vin)
        send = None if vs is None else vs.attempted_on
        return None if send is None else (send.node, send.generation)

    def vehicle(self, vin: str) -> VehicleState | None:
        """The state of ``vin`` (for ``fanout inspect vin`` and tests); do not mutate."""
        return self._vins.get(vin)

    def stats(self, now_ms: int | None = None) -> DispatchStats:
        """Counters; ``oldest_inflight_age_ms`` scans the vehicles and needs ``now_ms``."""
        oldest: int | None = None
        if now_ms is not None:
            times = [f.sent_ms for f in (vs.inflight for vs in self._vins.values()) if f and f.sent_ms is not None]
            oldest = now_ms - min(times) if times else None
        return DispatchStats(
            vehicles=len(self._vins),
            fenced=len(self._fence),
            connected=self._connected,
            inflight=self._inflight,
            pending_sends=len(self._sends),
            pending_deletes=self._pending_deletes,
            sent=self._sent,
            delivered=self._delivered,
            stale_events=self._stale,
            oldest_inflight_age_ms=oldest,
        )

    # ---- internals ----------------------------------------------------------------------------------
    def _state(self, vin: str) -> VehicleState:
        vs = self._vins.get(vin)
        if vs is None:
            vs = self._vins[vin] = VehicleState(generation=self._fence.pop(vin, -1))
        return vs

    def _forget_if_idle(self, vin: str, vs: VehicleState) -> None:
        """Rule 6: drop the state of a VIN that is offline with nothing pending; remember its generation."""
        if vs.node is None and vs.inflight is None and vs.deleting is None and not vs.attempted:
            del self._vins[vin]
            if vs.generation >= 0:
                self._remember(vin, vs.generation)

    def _remember(self, vin: str, generation: int) -> None:
        fence = self._fence
        fence.pop(vin, None)  # re-inserted last: eviction goes oldest first
        fence[vin] = generation
        if len(fence) > FENCE_SIZE:
            del fence[next(iter(fence))]

    def _live(self, vin: str, generation: int) -> VehicleState | None:
        """The state if ``generation`` is the live connection; otherwise count a stale event."""
        vs = self._vins.get(vin)
        if vs is None or vs.node is None or vs.generation != generation:
            # Older generation (superseded) or newer one whose connect has not arrived: nothing to act on.
            self._stale += 1
            return None
        return vs

    def _next_row(self, vin: str, deleting: set[bytes] | None) -> Row | None:
        if self._skipping is not None:
            return self._skipping(vin, deleting)
        row = self._rows.next_row(vin)
        # Rule 4: skip rows acked whose delete has not landed; at most len(deleting) extra reads.
        while row is not None and deleting and row.key in deleting:
            row = self._rows.next_row(vin, after=row.key)
        return row

    def _delete(self, vin: str, key: bytes, *, delivered: bool = True, expired: bool = False) -> Delete:
        return self._delete_of(self._state(vin), vin, key, delivered, expired)

    def _delete_of(self, vs: VehicleState, vin: str, key: bytes, delivered: bool = True,
                   expired: bool = False) -> Delete:
        deleting = vs.deleting
        if deleting is None:
            deleting = vs.deleting = set()
        if key not in deleting:
            deleting.add(key)
            self._pending_deletes += 1
            self._delivered += delivered
        delete = Delete(vin, key, not delivered and not expired, expired)
        self._deletes.append(delete)
        return delete

    def _set_inflight(self, vs: VehicleState, inflight: InFlight) -> None:
        if vs.inflight is None:
            self._inflight += 1
        vs.inflight = inflight
        vs.resumed_inflight = False

    def _clear_inflight(self, vs: VehicleState) -> None:
        if vs.inflight is not None:
            self._inflight -= 1
        vs.inflight = None
        vs.resumed_inflight = False

    def _go_offline(self, vs: VehicleState) -> None:
        if vs.node is not None:
            self._connected -= 1
        vs.node = None
        vs.subscribed = False
        vs.read_nothing = False
        self._clear_inflight(vs)


__all__ = ["VinDispatcher", "FENCE_SIZE", "Row", "PendingRows", "Send", "Delete", "Action", "DeliveryPlan",
           "InFlight", "VehicleState", "DispatchStats"]
