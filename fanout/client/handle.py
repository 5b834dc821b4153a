"""What ``submit`` returns (a handle) and what ``status`` returns (a snapshot).

Strategy: a handle is a thin wrapper over one ``asyncio.Future`` resolved by the client when the
last PUBACK of the submission arrives, or failed with a :class:`FanoutDeadLettered` /
:class:`FanoutRejected` / :class:`FanoutClosed`. Failures are marked as retrieved when set, so a
caller that never awaits a handle does not get "exception was never retrieved" noise.
"""
from __future__ import annotations

import asyncio
from dataclasses import dataclass

from fanout.client.submission import Submission

HOT = "hot"
COLD = "cold"


class SubmitHandle:
    """Tracks one accepted submission until its PUBACKs arrive.

    Attributes:
        seq: client-wide sequence number (also the outbox key).
        request_id: the submission's request id.
        data_id: the blob id.
        vins: number of VINs.
        mode: ``"hot"`` (accepted in memory) or ``"cold"`` (accepted fsynced in the outbox).
    """

    __slots__ = ("seq", "request_id", "data_id", "vins", "mode", "_future", "_sub", "_final")

    def __init__(self, sub: Submission, future: asyncio.Future[None], mode: str) -> None:
        self.seq = sub.seq
        self.request_id = sub.request_id
        self.data_id = sub.data_id
        self.vins = len(sub.vins)
        self.mode = mode
        self._future = future
        # the submission being sent (for progress); None while it waits in the outbox, so a large
        # COLD backlog is not also held in memory
        self._sub: Submission | None = sub
        self._final = (0, 0)

    async def acked(self, timeout: float | None = None) -> None:
        """Wait until every PUBACK of this submission arrived.

        Args:
            timeout: seconds, or None to wait as long as it takes (across reconnects).

        Raises:
            FanoutRejected: the cluster published an error for this request (names the field).
            FanoutDeadLettered: it failed ``max_attempts`` times and is now a dead letter.
            FanoutClosed: the client closed first; the submission stays in the outbox.
            asyncio.TimeoutError: ``timeout`` elapsed (the submission is still being sent).
        """
        await asyncio.wait_for(asyncio.shield(self._future), timeout)

    def done(self) -> bool:
        """True once acknowledged or failed."""
        return self._future.done()

    def progress(self) -> tuple[int, int]:
        """``(acknowledged, total)`` PUBLISH packets of the current attempt (blob + trigger chunks);
        ``(0, 0)`` while it waits to be sent."""
        if self._sub is None:
            return self._final
        return self._sub.acked_msgs, self._sub.total_msgs

    def _resolve(self) -> None:
        if self._sub is not None:
            self._final = (self._sub.acked_msgs, self._sub.total_msgs)
            self._sub = None
        if not self._future.done():
            self._future.set_result(None)

    def _fail(self, exc: BaseException) -> None:
        self._sub = None
        if not self._future.done():
            self._future.set_exception(exc)
            self._future.exception()

    def __repr__(self) -> str:
        state = "done" if self.done() else "pending"
        return f"<SubmitHandle seq={self.seq} request_id={self.request_id!r} vins={self.vins} mode={self.mode} {state}>"


@dataclass(frozen=True, slots=True)
class ClientStatus:
    """A snapshot of the client for dashboards and ``fanout outbox status``.

    Attributes:
        client_id: MQTT client id (errors arrive on ``$SDV-FANOUT/errors/<client_id>``).
        mode: ``"hot"`` or ``"cold"``.
        durability: ``"hybrid"`` or ``"always"``.
        connected: an MQTT connection is up.
        ring_depth: submissions waiting in memory.
        ring_capacity: the ring's bound.
        in_flight: submissions published and not yet fully acknowledged.
        outbox_depth: submissions in the durable outbox (including those in flight from it).
        retrying: outbox items waiting for a backoff to expire.
        suspects: items unacknowledged at a connection loss, being re-sent one at a time.
        oldest_age_s: age of the oldest unacknowledged submission, or None.
        dead_letters: items in the dead-letter store.
        submitted: submissions accepted by this process.
        acked: submissions fully acknowledged in this process.
        last_error: the last connection or publish error, or "".
        mqtt_version: the protocol of the current (or last) connection, ``"5"`` or ``"3.1.1"``.
        connects: MQTT connections made so far (1 + reconnects).
    """

    client_id: str
    mode: str
    durability: str
    connected: bool
    ring_depth: int
    ring_capacity: int
    in_flight: int
    outbox_depth: int
    retrying: int
    suspects: int
    oldest_age_s: float | None
    dead_letters: int
    submitted: int
    acked: int
    last_error: str
    mqtt_version: str = ""
    connects: int = 0
