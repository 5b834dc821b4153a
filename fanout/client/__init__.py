"""Platform client: submit trigger batches to the sdv-fanout cluster and never lose an accepted one.

``FanoutClient`` (async) and ``SyncFanoutClient`` (blocking wrapper). See ``client.py`` for the
HOT/COLD strategy and ``outbox.py`` for the durable store.

What survives a crash (docs/client.md):

- HOT (``durability="hybrid"`` while connected and the outbox is empty; ``handle.mode == "hot"``):
  ``submit()`` returns once the submission is in the in-memory ring. Until ``handle.acked()``
  returns it exists only in process memory: ring contents and unacknowledged in-flight submissions
  are lost on a process crash (kill -9, OOM, power loss). On a lost connection or a clean ``close()``
  they are moved to the outbox first, so only a crash of the process loses them.
- COLD (``durability="hybrid"`` while disconnected, when the ring is full, or while a failed item
  waits for its retry; ``handle.mode == "cold"``): ``submit()`` returns only after the submission is
  committed and fsynced in the LMDB outbox. It survives a process crash and an OS crash or power
  loss (as far as the disk honours fsync) and is sent when a client opens the same ``outbox_dir``.
- ``durability="always"``: every submission takes the COLD path, so every submission whose
  ``submit()`` returned survives a crash.
- Acknowledged submissions (``handle.acked()`` returned) are the cluster's responsibility.
- Redelivery: after a crash or a connection loss a submission may be sent twice (QoS 1: the PUBACK
  was lost, or the process died between the PUBACK and the removal from the outbox). Every trigger
  chunk carries the same ``request_id`` and the cluster's idempotency key is ``(request_id, vin)``.
- Dead letters stay in the outbox directory for ``dead_letter_retain_days`` (30) across restarts;
  ``replay_dead_letters()`` / ``fanout outbox replay`` sends them again.
- A ``submit()`` that raised was not accepted and nothing was stored.
"""
from fanout.client.backoff import RetryPolicy
from fanout.client.client import FanoutClient
from fanout.client.errors import (
    FanoutClosed,
    FanoutDeadLettered,
    FanoutError,
    FanoutRejected,
    FanoutUnavailable,
    OutboxLocked,
    SubmissionInvalid,
)
from fanout.client.handle import ClientStatus, SubmitHandle
from fanout.client.outbox import DEFAULT_OUTBOX_DIR, DeadLetter, Outbox, OutboxStatus
from fanout.client.sync import SyncFanoutClient, SyncSubmitHandle

__all__ = [
    "FanoutClient",
    "SyncFanoutClient",
    "SubmitHandle",
    "SyncSubmitHandle",
    "ClientStatus",
    "RetryPolicy",
    "Outbox",
    "OutboxStatus",
    "DeadLetter",
    "DEFAULT_OUTBOX_DIR",
    "FanoutError",
    "FanoutRejected",
    "FanoutDeadLettered",
    "FanoutClosed",
    "FanoutUnavailable",
    "OutboxLocked",
    "SubmissionInvalid",
]
