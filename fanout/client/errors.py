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
    """The cluster refused this request: an MQTT 5 negative PUBACK (``detail["reason_code"]``), or on
    MQTT 3.1.1 an error published on ``$SDV-FANOUT/errors/<client_id>``.

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


#: The error the cluster gives a request it could not take now (a dispatcher call failed, the store is
#: full): the request is retried, not dead-lettered (fanout.node.ingest_rounds).
TRANSIENT_ERROR = "unavailable"


def negative_ack_detail(code: int, reason: str | None, request_id: str) -> dict[str, Any]:
    """The error detail of an MQTT 5 negative PUBACK, shaped like an errors-topic message.

    The cluster's Reason String is ``error: field: reason`` (or ``error: reason``) as
    :func:`describe_cluster_error` writes it; a server that sent none leaves the reason code's name.

    Args:
        code: the PUBACK reason code (>= 0x80).
        reason: its Reason String, or None.
        request_id: the request of the refused message.
    """
    detail: dict[str, Any] = {"request_id": request_id, "reason_code": code}
    parts = (reason or "").split(": ", 2)
    if not parts[0]:
        detail["error"] = _REASON_NAMES.get(code, f"refused_0x{code:02x}")
    elif len(parts) == 3:
        detail.update(error=parts[0], field=parts[1], reason=parts[2])
    elif len(parts) == 2:
        detail.update(error=parts[0], reason=parts[1])
    else:
        detail["error"] = parts[0]
    return detail


#: Names of the MQTT 5 PUBACK reason codes a server may refuse a publish with (spec table 3-4).
_REASON_NAMES = {0x80: "unspecified_error", 0x83: "implementation_specific_error", 0x87: "not_authorized",
                 0x90: "topic_name_invalid", 0x91: "packet_identifier_in_use", 0x97: "quota_exceeded",
                 0x99: "payload_format_invalid"}


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
    "negative_ack_detail",
    "TRANSIENT_ERROR",
    "describe_cluster_error",
]
