"""LMDB shard store: key encodings, write batches, the shard store, replication logic.

Public API (see each module for its strategy):
- ``storage.keys``: ``shard_of``, ``ids_key``/``decode_ids_key``, ``vin_prefix``, ``reqs_key``/...
- ``storage.batch.WriteBatch``: the unit of mutation and of replication.
- ``storage.shard.ShardStore``: one LMDB environment per shard; ``apply`` + read verbs + snapshots.
- ``storage.replication_protocol``: both ends' rules: ``ReplicationLog``, ``ShardPrimary``, ``ReplicaApplier``,
  ``Ack``/``Need``/``Rejected``.
- ``storage.replica_shipper.Replicator``: the primary's asyncio pipeline shipping batches to its replicas.
- ``storage.batch_apply``: executes a batch's ops inside ``ShardStore.apply``'s transaction.
- ``storage.topics``: durable topics (``TopicSpec``, ``LogEntry``, ``partition_for``, keys, the ``receipts`` topic);
  ``storage.topic_apply`` applies their ops and appends the delivery receipts.
- ``storage.errors``: ``StoreError`` and subclasses.
"""
# The store's apply path runs compiled when `make` built it (fanout.native, a standard-library-only switch that
# imports nothing of the project); this must happen before any module of the package is imported.
from fanout import native as _native

_native.extend_path(__path__, "storage")  # noqa: F821 -- compiled modules (make native) before the sources

from storage.batch import WriteBatch  # noqa: E402
from storage.errors import (
    BatchFormatError,
    FencedError,
    SequenceError,
    SnapshotInvalidatedError,
    StoreClosedError,
    StoreError,
    StoreFullError,
)
from storage.keys import shard_of
from storage.reader import QueueRow
from storage.replication_protocol import Ack, Need, Rejected, ReplicaApplier, ReplicationLog, ShardPrimary, Shipment
from storage.shard import ApplyResult, ShardStore, shard_dir
from storage.snapshot import SnapshotInfo, SnapshotView

__all__ = [
    "Ack",
    "ApplyResult",
    "BatchFormatError",
    "FencedError",
    "Need",
    "QueueRow",
    "Rejected",
    "ReplicaApplier",
    "ReplicationLog",
    "SequenceError",
    "ShardPrimary",
    "ShardStore",
    "Shipment",
    "SnapshotInfo",
    "SnapshotInvalidatedError",
    "SnapshotView",
    "StoreClosedError",
    "StoreError",
    "StoreFullError",
    "WriteBatch",
    "shard_dir",
    "shard_of",
]
