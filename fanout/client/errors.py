"""Exceptions of the platform client (``fanout.client``).

Strategy: a caller distinguishes three situations and nothing else:

- the submission was never accepted (:class:`SubmissionInvalid` for a bad argument, an ``OSError``
  when the outbox cannot be written): ``submit`` raises and nothing was stored;
- the submission was accepted but ended in the dead-letter store (:class:`FanoutDeadLettered`, or its
  subclass :class:`FanoutRejected` when the cluster named the bad field): ``handle.acked()`` raises;
- the client went away before the PUBACKs arrived (:class:`FanoutClosed`): the submission is still in
  the outbox and is sent by the next client that opens the same outbox directory.
"""
from __future__ import annotations

from typing import Any


class FanoutError(Exception):
    """Base class of every exception raised by ``fanout.client``."""


class SubmissionInvalid(FanoutError, ValueError):
    """An argument of ``submit`` cannot be sent; the message names it (``vins[3]: ...``).

    Attributes:
        field: the argument (with index) that is wrong, e.g. ``"vins[3]"`` or ``"data_id"``.
    """

    def __init__(self, field: str, reason: str) -> None:
        super().__init__(f"{field}: {reason}")
        self.field = field
        self.reason = reason


class OutboxLocked(FanoutError):
    """Another live process holds the outbox directory (one client per outbox)."""


class FanoutUnavailable(FanoutError):
    """A request status or cancel got no answer (not connected in time, or a shard did not answer)."""


class FanoutClosed(FanoutError):
    """The client closed before the submission was acknowledged; it stays in the outbox."""


class FanoutDeadLettered(FanoutError):
    """The submission failed ``max_attempts`` times (or was rejected) and is now a dead letter.

    Attributes:
        seq: outbox sequence number of the submission (``fanout outbox replay --seq``).
        request_id: the submission's request id.
        attempts: failed attempts recorded.
        last_error: the last error, as stored with the dead letter.
    """

    def __init__(self, seq: int, request_id: str, attempts: int, last_error: str) -> None:
        super().__init__(f"submission {request_id!r} (seq {seq}) dead-lettered after {attempts} attempt(s): {last_error}")
        self.seq = seq
        self.request_id = request_id
        self.attempts = attempts
        self.last_error = last_error


class FanoutRejected(FanoutDeadLettered):
    """The cluster published an error for this request on ``$SDV-FANOUT/errors/<client_id>``.

    Attributes:
        error: the error code sent by the cluster (``"invalid_trigger"``, ...).
        field: the field the cluster named (``"ids[17]"``), or ``""`` when it named none.
        reason: the cluster's human readable reason.
        detail: the whole decoded error message.
    """

    def __init__(self, seq: int, request_id: str, attempts: int, detail: dict[str, Any]) -> None:
        self.error = str(detail.get("error", "error"))
        self.field = str(detail.get("field", "") or "")
        self.reason = str(detail.get("reason", "") or "")
        self.detail = detail
        super().__init__(seq, request_id, attempts, describe_cluster_error(detail))


def describe_cluster_error(detail: dict[str, Any]) -> str:
    """One line for a cluster error message: ``invalid_trigger: ids[17]: not a VIN``.

    Args:
        detail: the decoded JSON error published by the cluster.

    Returns:
        The error code, the field (when named) and the reason joined by ``": "``.
    """
    parts = [str(detail.get("error", "error"))]
    if detail.get("field"):
        parts.append(str(detail["field"]))
    if detail.get("reason"):
        parts.append(str(detail["reason"]))
    return ": ".join(parts)


__all__ = [
    "FanoutError",
    "SubmissionInvalid",
    "OutboxLocked",
    "FanoutClosed",
    "FanoutDeadLettered",
    "FanoutRejected",
    "describe_cluster_error",
]
