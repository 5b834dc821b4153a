"""The Dispatcher's replication hook: every committed WriteBatch goes to the shard's replicas before its
callers are answered.

Strategy: the Dispatcher calls :meth:`PrimaryLink.apply_local` on its writer thread instead of
``ShardStore.apply`` and :meth:`PrimaryLink.settle_after_replication` where it used to answer the callers of
a commit; everything else (log, pumps, ack set, fencing) is :class:`storage.replica_shipper.Replicator`. With
``fanout.replicas = 0`` the hook is a pass-through (no log, no serialisation), so an unreplicated cluster
pays nothing. A Dispatcher restarted by Ray asks the Controller for its replicas in :meth:`recover`; until
then its writes wait (``expect_replicas``), so nothing is acknowledged unreplicated.
"""
from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Any

import structlog

from storage import ShardStore, WriteBatch
from storage.errors import FencedError
from storage.replication_protocol import ReplicationLog, ShardPrimary, Shipment
from storage.replica_shipper import Replicator

from . import channels
from .store_replica import ChannelReplicaTransport, RayReplicaTransport

log = structlog.get_logger(__name__)


@dataclass(frozen=True, slots=True)
class Applied:
    """A local commit: its counters (as ``ApplyResult``), seq and what to ship (None: not replicated)."""

    counts: dict[str, int]
    seq: int
    shipment: Shipment | None


class PrimaryLink:
    """Replication of one Dispatcher's shard.

    Args:
        config: the loaded config (``fanout.replicas``, ``fanout.replica_timeout``, ``storage.replication_log*``).
        store: the shard's store (the Dispatcher's).
        replication: from the Controller: ``{"epoch": int, "min_acks": int, "path": str}``; None or
            ``fanout.replicas == 0``: no replication.
    """

    def __init__(self, config: Any, store: ShardStore, replication: dict[str, Any] | None) -> None:
        self.config = config
        self.store = store
        self.replicator: Replicator | None = None
        self._transports: dict[str, Any] = {}  # replica id -> its transport, kept across set_replicas
        if replication is None or config.fanout.replicas == 0:
            return
        st = config.storage
        epoch = int(replication.get("epoch") or max(1, store.epoch))
        plog = ReplicationLog(store.applied_seq, max_entries=st.replication_log_entries,
                              max_bytes=st.replication_log_size_bytes)
        self.replicator = Replicator(ShardPrimary(store, epoch, plog), min_acks=int(replication.get("min_acks", 0)),
                                     timeout_s=config.fanout.replica_timeout_ms / 1000.0, expect_replicas=True,
                                     loop=asyncio.get_event_loop())

    @property
    def epoch(self) -> int:
        return self.replicator.epoch if self.replicator is not None else self.store.epoch

    def ship(self, batch: WriteBatch) -> tuple[int, bytes] | None:
        """On the event-loop thread, just before :meth:`apply_local` of the same batch (and no other apply in
        flight): hand it to the replicas first (:meth:`Replicator.ship`); None without replication.

        Raises:
            FencedError: a replica deposed this primary.
        """
        return None if self.replicator is None else self.replicator.ship(batch)

    def apply_local(self, batch: WriteBatch, shipped: tuple[int, bytes] | None = None) -> Applied:
        """Commit ``batch`` on the primary (writer thread); ``shipped`` is what :meth:`ship` returned for it."""
        if self.replicator is None:
            r = self.store.apply(batch)
            return Applied(r.counts, r.seq, None)
        if shipped is not None:
            shipment = self.replicator.apply_shipped(batch, *shipped)
        else:
            shipment = self.replicator.apply_local(batch)
        return Applied(shipment.result.counts, shipment.seq, shipment)

    def settle_after_replication(self, applied: Applied, waiters: list[asyncio.Future]) -> None:
        """Answer the callers of a commit once it is replicated (event-loop thread, called in seq order)."""
        if self.replicator is None or applied.shipment is None:
            _resolve(waiters, applied.counts, None)
            return
        acked = self.replicator.shipped(applied.shipment)
        acked.add_done_callback(lambda f: _resolve(waiters, applied.counts, f.exception()))

    def set_replicas(self, epoch: int, replicas: dict[str, Any], min_acks: int) -> dict[str, Any]:
        """Adopt the Controller's replica set for ``epoch``.

        Raises:
            FencedError: ``epoch`` is not this primary's (a newer primary exists).
        """
        if self.replicator is None:
            return self.status()
        if epoch != self.replicator.epoch:
            raise FencedError(f"shard {self.store.shard_id}: primary at epoch {self.replicator.epoch}, the controller "
                              f"is at epoch {epoch}", epoch=self.replicator.epoch, known_epoch=epoch)
        self._transports = channels.rewire(self._transports, replicas, self._transport)
        self.replicator.set_replicas(dict(self._transports), min_acks)
        return self.status()

    def _transport(self, rid: str, handle: Any) -> Any:
        if channels.channels_enabled(self.config):
            return ChannelReplicaTransport(self.config, handle, self.store.shard_id, rid)
        return _RayOnly(handle)

    async def recover(self, controller: Any, shard: int) -> None:
        """After a Ray restart: fetch this shard's replicas from the Controller."""
        if self.replicator is None:
            return
        try:
            info = await controller.replication_of.remote(shard)
            self.set_replicas(info["epoch"], info["replicas"], info["min_acks"])
        except Exception as exc:
            log.error("restarted primary could not get its replicas", shard=shard, error=str(exc)[:300])

    def status(self) -> dict[str, Any]:
        if self.replicator is None:
            return {"epoch": self.store.epoch, "applied_seq": self.store.applied_seq, "replicas": [],
                    "replicated": False}
        return {**self.replicator.status(), "replicated": True}

    def close(self) -> None:
        if self.replicator is not None:
            self.replicator.close()
        self._transports = channels.rewire(self._transports, {}, self._transport)


class _RayOnly(RayReplicaTransport):
    """``cluster.direct_channels = false``: every replica call is a Ray call."""

    def close(self) -> None:
        pass


def _resolve(waiters: list[asyncio.Future], counts: dict[str, int], exc: BaseException | None) -> None:
    for w in waiters:
        if w.done():
            continue
        if exc is None:
            w.set_result(counts)
        else:
            w.set_exception(exc)


__all__ = ["PrimaryLink", "Applied"]
