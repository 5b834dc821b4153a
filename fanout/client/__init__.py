"""Platform client: submit trigger batches to the sdv-fanout cluster and never lose an accepted one.

``FanoutClient`` (async) and ``SyncFanoutClient`` (blocking wrapper). See ``client.py`` for the
HOT/COLD strategy and ``outbox.py`` for what is durable.
"""
from fanout.client.backoff import RetryPolicy
from fanout.client.client import FanoutClient
from fanout.client.errors import (
    FanoutClosed,
    FanoutDeadLettered,
    FanoutError,
    FanoutRejected,
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
    "OutboxLocked",
    "SubmissionInvalid",
]
