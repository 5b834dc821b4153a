"""StoreReplica actor: one replica of one shard's LMDB store, fed by the shard's primary (the Dispatcher).

Strategy:

- It owns ``<data_dir>/replica-<shard>-<n>`` (its only writer) and a
  :class:`storage.replication_protocol.ReplicaApplier` that decides every shipped batch by the replica rules
  (lower epoch rejected, duplicates re-acked, gaps answered with ``Need``). Applies run on a single-thread executor in arrival order, so the event loop
  keeps answering ``status``/``check_health`` while a big batch commits.
- ``max_restarts=-1``: killed, it restarts on its node, reopens its store and the primary's pump catches
  it up (log, or snapshot + log). Calls are not retried by Ray (``max_task_retries=0``): the pump
  re-probes with ``hello`` and resends, which the rules make idempotent.
- Snapshots arrive in chunks (:class:`RayReplicaTransport.send_snapshot` reads the primary's ``env.copy``
  directory and ships ``SNAPSHOT_CHUNK_BYTES`` per call, so no single object exceeds the object store),
  are written next to the store and installed atomically.
- :meth:`promote` closes the store for the Controller, which then starts the shard's new Dispatcher on
  this node over the same directory and kills this actor.
- With ``cluster.direct_channels`` (default) the primary's ``hello`` and ``apply_many`` come over a direct
  channel (:mod:`actors.channels`, service ``replica/<shard>/<replica_id>``), started in ``__init__`` like the
  MQTT server of a connection node: a Ray call costs ~1.8 ms of CPU on the two sides, a channel call ~50 µs,
  and a durable append pays one of these per commit. Snapshots stay on Ray calls (rare and large).
"""
from __future__ import annotations

import asyncio
import os
import shutil
from pathlib import Path
from typing import Any

import ray
import structlog

from fanout import log as fanout_log
from storage import ShardStore
from storage.errors import StoreError
from storage.replication_protocol import LogEntry, Rejected, ReplicaApplier, ReplicaReply, table_digests
from storage.snapshot import SnapshotInfo

from . import channels
from .untraced import plain, unwrap_private_methods
from .writer_thread import WriterThread
from .ray_args import INLINE_ARG_BYTES, joined_entries, split_entries

log = structlog.get_logger(__name__)

SNAPSHOT_CHUNK_BYTES = 8 << 20


def replica_dir(data_dir: str | os.PathLike[str], shard: int, n: int) -> Path:
    """Directory of replica ``n`` of ``shard`` (``<data_dir>/replica-<shard>-<n>``)."""
    return Path(data_dir) / f"replica-{shard}-{n}"


def open_store(config: Any, path: str | os.PathLike[str], shard: int) -> ShardStore:
    st = config.storage
    return ShardStore(path, shard, map_size_bytes=st.map_size_bytes, max_map_size_bytes=st.max_map_size_bytes,
                      sync=st.sync)


INLINE_APPLY_BYTES = 256 << 10  # an apply_many up to this size runs on the actor's loop thread (see apply_many)


@ray.remote(num_cpus=0, max_restarts=-1, max_task_retries=0)
class StoreReplica:
    """Replica ``replica_id`` of shard ``shard`` stored at ``path``."""

    def __init__(self, config: Any, shard: int, replica_id: str, path: str) -> None:
        fanout_log.ensure_configured()
        unwrap_private_methods(self)  # the actor's own hot calls skip Ray's tracing shim (actors.untraced)
        self.shard = shard
        self.replica_id = replica_id
        self.path = path
        self.applier: ReplicaApplier | None = ReplicaApplier(open_store(config, path, shard))
        self._writer = WriterThread(f"replica-{shard}-writer")
        self._incoming: dict[str, Path] = {}
        self._channel = channels.ServedChannel(config, replica_service(shard, replica_id),
                                               {m: plain(self, m) for m in ("hello", "apply_many")})
        log.info("store replica started", shard=shard, replica=replica_id, path=path,
                 applied_seq=self.applier.applied_seq, epoch=self.applier.epoch, pid=os.getpid())

    async def channel_address(self) -> tuple[str, int, str, bool]:
        """Where this replica's direct channel listens (raises if channels are off or it failed to start)."""
        return await self._channel.address()

    def _live(self) -> ReplicaApplier:
        if self.applier is None:
            raise StoreError(f"replica {self.replica_id} of shard {self.shard} was promoted")
        return self.applier

    async def _run(self, fn: Any, *args: Any) -> Any:
        return await self._writer.run(fn, *args)

    async def ready(self) -> dict[str, Any]:
        """``{shard, replica_id, path, applied_seq, epoch, ray_node_id, pid}``."""
        a = self._live()
        return {"shard": self.shard, "replica_id": self.replica_id, "path": self.path, "applied_seq": a.applied_seq,
                "epoch": a.epoch, "ray_node_id": ray.get_runtime_context().get_node_id(), "pid": os.getpid()}

    async def check_health(self) -> None:
        return None

    async def hello(self, epoch: int) -> ReplicaReply:
        return await self._run(self._live().hello, epoch)

    async def apply_many(self, epoch: int, entries: list[LogEntry] | list[tuple[int, int]], *chunks: bytes) -> ReplicaReply:
        """Apply log entries: ``entries`` as ``(seq, data)``, or with ``chunks`` as ``(seq, number of chunks)``
        (:meth:`RayReplicaTransport.apply_many` sends them so, in inline-sized arguments)."""
        if chunks:
            try:
                entries = joined_entries(entries, chunks)  # type: ignore[arg-type]
            except ValueError as exc:  # not ValueError: the primary's pump reads that as "replica ahead"
                raise StoreError(f"replica {self.replica_id}: malformed apply_many: {exc}") from exc
        elif not self._writer.pending and sum(len(e[1]) for e in entries) <= INLINE_APPLY_BYTES:
            # On the loop thread: the round trip to the writer thread costs ~20 µs of CPU and ~25 µs of wall
            # time (actors.writer_thread), a sizeable part of a small batch's apply; the loop waits for the
            # fsync instead, and the pump has no second call in flight to this replica meanwhile. With no
            # job on the writer thread nothing else writes the store, so the order holds.
            return self._live().apply_many(epoch, entries)  # type: ignore[arg-type]
        return await self._run(self._live().apply_many, epoch, entries)

    async def snapshot_chunk(self, token: str, name: str, offset: int, data: bytes) -> None:
        """Write one chunk of an incoming snapshot file (``<path>.incoming-<token>/<name>`` at ``offset``)."""
        d = self._incoming.setdefault(token, Path(f"{self.path}.incoming-{token}"))
        d.mkdir(parents=True, exist_ok=True)
        if "/" in name or name.startswith("."):
            raise ValueError(f"bad snapshot file name {name!r}")

        def write() -> None:
            with open(d / name, "r+b" if (d / name).exists() else "wb") as f:
                f.seek(offset)
                f.write(data)
                if not data or len(data) < SNAPSHOT_CHUNK_BYTES:
                    f.flush()
                    os.fsync(f.fileno())

        await self._run(write)

    async def install_snapshot(self, epoch: int, token: str) -> ReplicaReply:
        """Replace the store by the received snapshot (keeping the higher epoch); ``Ack(its applied_seq)``."""
        a = self._live()
        d = self._incoming.pop(token, None)
        if d is None:
            raise StoreError(f"no snapshot {token} received")
        try:
            hello = await self._run(a.hello, epoch)
            if isinstance(hello, Rejected):
                return hello  # a deposed primary's snapshot
            return await self._run(a.install_snapshot, d)
        finally:
            shutil.rmtree(d, ignore_errors=True)

    async def promote(self) -> dict[str, Any]:
        """Close the store so the shard's new primary can open it; no more applies here.

        Returns:
            ``{path, applied_seq, epoch}`` at close.
        """
        a = self._live()
        info = {"path": self.path, "applied_seq": a.applied_seq, "epoch": a.epoch}
        await self._run(a.store.close)
        self.applier = None
        log.warning("replica promoted: store closed for the new primary", shard=self.shard, replica=self.replica_id,
                    **info)
        return info

    async def digests(self) -> dict[str, str]:
        """Per-table digests (see :func:`storage.replication_protocol.table_digests`)."""
        return await self._run(table_digests, self._live().store)

    async def status(self) -> dict[str, Any]:
        a = self.applier
        return {"replica_id": self.replica_id, "shard": self.shard, "path": self.path,
                "applied_seq": a.applied_seq if a else None, "epoch": a.epoch if a else None, "promoted": a is None,
                "channel": self._channel.stats()}

    async def close(self) -> None:
        await self._channel.close()
        if self.applier is not None:
            await self._run(self.applier.store.close)
            self.applier = None
        self._writer.shutdown()


class RayReplicaTransport:
    """:class:`storage.replica_shipper.ReplicaTransport` over a ``StoreReplica`` handle."""

    def __init__(self, handle: Any) -> None:
        self.handle = handle

    async def hello(self, epoch: int) -> ReplicaReply:
        return await self.handle.hello.remote(epoch)

    async def apply_many(self, epoch: int, entries: list[LogEntry]) -> ReplicaReply:
        if sum(len(data) for _seq, data in entries) <= INLINE_ARG_BYTES:
            return await self.handle.apply_many.remote(epoch, entries)
        # a batch of appends is often just over Ray's inline limit: chunks travel with the call, not via plasma
        index, chunks = split_entries(entries)
        return await self.handle.apply_many.remote(epoch, index, *chunks)

    async def send_snapshot(self, epoch: int, info: SnapshotInfo) -> ReplicaReply:
        """Ship every file of the snapshot directory in ``SNAPSHOT_CHUNK_BYTES`` calls, then install it."""
        import uuid

        token = uuid.uuid4().hex[:12]
        loop = asyncio.get_running_loop()
        for p in sorted(Path(info.path).iterdir()):
            if not p.is_file() or p.name == "lock.mdb":
                continue
            size = p.stat().st_size
            offset = 0
            while True:
                data = await loop.run_in_executor(None, _read_chunk, p, offset)
                await self.handle.snapshot_chunk.remote(token, p.name, offset, data)
                offset += len(data)
                if offset >= size or not data:
                    break
        return await self.handle.install_snapshot.remote(epoch, token)


class ChannelReplicaTransport:
    """:class:`storage.replica_shipper.ReplicaTransport` over the replica's direct channel; snapshots, and a
    call too large for one channel frame, go over Ray (:class:`RayReplicaTransport`)."""

    def __init__(self, config: Any, handle: Any, shard: int, replica_id: str) -> None:
        self.handle = handle
        self.ray = RayReplicaTransport(handle)
        self.client = channels.client_for(config, replica_service(shard, replica_id), handle)
        self._frame_room = config.cluster.channel_max_frame_bytes - (1 << 20)  # pickling overhead of the entries

    async def hello(self, epoch: int) -> ReplicaReply:
        return await self.client.call("hello", epoch)

    async def apply_many(self, epoch: int, entries: list[LogEntry]) -> ReplicaReply:
        if sum(len(data) for _seq, data in entries) > self._frame_room:
            return await self.ray.apply_many(epoch, entries)
        return await self.client.call("apply_many", epoch, entries)

    async def send_snapshot(self, epoch: int, info: SnapshotInfo) -> ReplicaReply:
        return await self.ray.send_snapshot(epoch, info)

    def close(self) -> None:
        self.client.close()


def replica_service(shard: int, replica_id: str) -> str:
    return f"replica/{shard}/{replica_id}"


def _read_chunk(path: Path, offset: int) -> bytes:
    with open(path, "rb") as f:
        f.seek(offset)
        return f.read(SNAPSHOT_CHUNK_BYTES)


__all__ = ["StoreReplica", "RayReplicaTransport", "replica_dir", "open_store"]
