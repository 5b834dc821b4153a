# Over 500 lines: one actor shell per shard whose every call site (ingest, events, requests, topics, consumer groups) is a few lines; the logic lives in fanout/dispatcher and fanout/topics.
"""Dispatcher actor: owns one LMDB shard and the dispatch state of its VINs (a thin shell over DispatcherCore).

Strategy:

- What it owns: the ``ShardStore`` at ``<data_dir>/shard-<k>`` (its only writer), a
  :class:`fanout.dispatcher.core.DispatcherCore` (per-VIN presence, in-flight row, takeover registry), and the
  handles of the connection nodes it delivers to.
- One writer: every mutation is a ``WriteBatch`` applied on a single-thread executor, so an fsync never
  blocks the event loop and batches are applied in the order they were submitted (the order the
  replication layer will ship them in). Batches that queue up while a commit runs are concatenated into
  the next one (group commit: an fsync costs ~1 ms idle but 100+ ms on a busy disk, so per-batch commits
  would serialise ingests behind delete batches). Reads run in the loop (LMDB readers never wait).
- New batches: the core's :class:`fanout.dispatcher.ingest_batch.IngestJob` says what to write in which
  order (a big trigger's head first, dispatched and shipped at once); the caller is answered after every
  part is durable. The new rows are dispatched in the core's slices, the loop running between them.
- The tick: inputs (``events``, ``ingest``) only update state and set a wake flag. The tick task then
  waits ``fanout.tick`` (coalescing everything that arrives meanwhile), drains the plan, writes all acked
  rows' deletes in ONE batch (while one delete batch is being written, the next accumulates) and ships
  sends with ONE ``deliver`` call per node (a backlog above :data:`MAX_SENDS_PER_CALL` is split so the
  first part lands sooner); at most :data:`MAX_CALLS_PER_NODE` calls are in flight per node and the rest
  waits for the next call. Idle, it sleeps on an event: no polling.
- ``max_restarts=-1``: a restarted dispatcher reopens its shard (nothing acknowledged is lost, it is in
  LMDB) with an empty in-memory state; its ``incarnation`` changes, and each node then resends the
  connections it holds for this shard (``NodeCore.sync_events``). ``max_task_retries`` is safe because
  every method is idempotent: ingest by (request_id, vin), acks by row key, connects by generation.
"""
from __future__ import annotations

import asyncio
import gc
import os
import time
import uuid
from pathlib import Path
from typing import Any

import ray
import structlog

from fanout import log as fanout_log
from fanout.dispatcher.core import DispatcherCore
from fanout.dispatcher.topic_groups import group_bounds
from fanout.records import pack_batch, unpack_batch
from fanout.request_control import TOPIC_ACK, TOPIC_INFO
from fanout.topics.log_calls import TopicCatalog
from storage import ShardStore, WriteBatch
from storage.batch import DELETE_BLOB, DELETE_BLOB_IF

from .ray_args import joined
from .names import NAMESPACE
from . import channels
from .untraced import plain, unwrap_private_methods
from .writer_thread import WriterThread
from .channels import dispatcher_service, node_service
from .primary_link import PrimaryLink

log = structlog.get_logger(__name__)

# The cyclic GC's default thresholds (700, 10, 10) make a full collection walk every live object (tens of
# thousands of sessions, rows, connections) many times a second under load, stalling the event loop for
# 100+ ms. Hot-path objects are tuples and slotted instances without cycles; collect far less often.
GC_THRESHOLDS = (50_000, 50, 100)

MAX_CALLS_PER_NODE = 4
TOPIC_GROUP_POLL_S = 0.01  # how soon a consumer group member hears of an append (fanout.dispatcher.topic_groups)
MAX_SENDS_PER_CALL = 2000  # a bigger backlog goes out in several pipelined calls: the first lands sooner


def _now_ms() -> int:
    return time.time_ns() // 1_000_000


@ray.remote(num_cpus=0, max_restarts=-1, max_task_retries=3)
class Dispatcher:
    """One shard's dispatcher.

    Args:
        config: the loaded :class:`fanout.config.Config`.
        shard: this shard's index.
        shards: the pool size.
        data_dir: root of the shard directories.
        controller: name of the Controller actor (namespace ``sdv-fanout``); a restarted dispatcher asks it
            for the connection nodes and asks each node to resend its connections of this shard.
    """

    def __init__(self, config: Any, shard: int, shards: int, data_dir: str, controller: str | None = None,
                 replication: dict[str, Any] | None = None) -> None:
        fanout_log.ensure_configured()
        unwrap_private_methods(self)  # the actor's own hot calls skip Ray's tracing shim (actors.untraced)
        gc.set_threshold(*GC_THRESHOLDS)
        self.config = config
        self.shard = shard
        self.incarnation = uuid.uuid4().hex[:12]
        st = config.storage
        path = Path((replication or {}).get("path") or Path(data_dir) / f"shard-{shard}")  # a promoted replica's dir
        self.store = ShardStore(path, shard, map_size_bytes=st.map_size_bytes,
                                max_map_size_bytes=st.max_map_size_bytes, sync=st.sync)
        self.core = DispatcherCore(self.store, shard, shards, group_bounds=group_bounds(config))
        if channels.channels_enabled(config):
            channels.channel_secret()  # one blocking GCS read, here rather than on the event loop later
        self.repl = PrimaryLink(config, self.store, replication)  # replication of every committed WriteBatch
        self.topics = TopicCatalog(self.store, shard, shards)  # durable topics held here (fanout.topics.log_calls)
        self._writer = WriterThread(f"shard-{shard}-writer")
        self._tick_s = config.fanout.tick_ms / 1000.0
        self._nodes: dict[str, Any] = {}
        self._calls: dict[str, int] = {}
        self._calls_in = 0
        self._calls_out = 0
        self._deliver_s = 0.0
        self._deleting = False
        self._queued_writes: list[tuple[WriteBatch, asyncio.Future]] = []
        self._writing = False
        self._closed = False
        self._wake = asyncio.Event()
        self._controller = controller
        self._node_calls: dict[str, channels.DirectCalls] = {}  # node id -> its deliver channel
        # the nodes' hot calls to this shard (events, appends, ingest) come over a direct channel (actors.channels)
        self._channel = channels.ServedChannel(config, dispatcher_service(shard), {
            m: plain(self, m) for m in ("events", "topic_append", "put_blobs", "has_data", "requests_in_use",
                                          "trigger_conflicts", "ingest", "request_control")})
        loop = asyncio.get_event_loop()
        self._task = loop.create_task(self._run())
        self._groups_joined = asyncio.Event()  # set while some consumer group has a member here
        self._group_polls = 0
        self._groups_task = loop.create_task(self._topic_groups_loop())
        self._committing = False
        self._recovery: asyncio.Task | None = None
        if ray.get_runtime_context().was_current_actor_reconstructed:
            self._recovery = loop.create_task(self._recover())
        log.info("dispatcher started", shard=shard, shards=shards, path=str(path), incarnation=self.incarnation,
                 applied_seq=self.store.applied_seq, pid=os.getpid())

    # -- lifecycle ---------------------------------------------------------------------------------------

    async def ready(self) -> dict[str, Any]:
        """Returns ``{shard, incarnation, applied_seq}`` once the store is open."""
        return {"shard": self.shard, "incarnation": self.incarnation, "applied_seq": self.store.applied_seq}

    async def channel_address(self) -> tuple[str, int, str, bool]:
        """Where this dispatcher's direct channel listens (``actors.channels``)."""
        return await self._channel.address()

    async def check_health(self) -> None:
        """Raises if the tick task died (Ray then restarts the actor)."""
        if self._task.done() and not self._closed:
            raise RuntimeError(f"dispatcher {self.shard} tick task ended: {self._task.exception()!r}")

    async def _recover(self) -> None:
        """After a restart: get the node handles from the controller, ask every node to resync this shard."""
        if not self._controller:
            log.warning("restarted dispatcher has no controller to recover from", shard=self.shard)
            return
        for attempt in range(30):
            try:
                controller = ray.get_actor(self._controller, namespace=NAMESPACE)
                nodes = (await controller.handles.remote())["nodes"]
                break
            except Exception as exc:
                log.warning("dispatcher recovery: controller not reachable yet", shard=self.shard, error=str(exc)[:200])
                await asyncio.sleep(min(5.0, 0.2 * (attempt + 1)))
        else:
            return
        self._adopt_nodes(nodes)
        await self.repl.recover(controller, self.shard)
        await asyncio.gather(*(h.resync.remote(self.shard) for h in self._nodes.values()), return_exceptions=True)
        log.warning("dispatcher restarted and resynced", shard=self.shard, nodes=sorted(self._nodes),
                    incarnation=self.incarnation)
        self._kick()

    async def set_nodes(self, nodes: dict[str, Any]) -> None:
        """The connection nodes (``{node_id: handle}``); a node missing from the new map is down."""
        for gone in set(self._nodes) - set(nodes):
            self.core.node_down(gone)
        self._adopt_nodes(nodes)
        self._kick()

    def _adopt_nodes(self, nodes: dict[str, Any]) -> None:
        """Take ``nodes`` as the node set; a node's deliver channel is kept while its actor is the same."""
        self._node_calls = channels.rewire(self._node_calls, nodes,
                                           lambda node, h: channels.DirectCalls(self.config, h, node_service(node)))
        self._nodes = dict(nodes)

    async def node_down(self, node_id: str) -> None:
        """A node died or restarted: forget every connection it had."""
        self.core.node_down(node_id)
        self._kick()

    async def set_replicas(self, epoch: int, replicas: dict[str, Any], min_acks: int) -> dict[str, Any]:
        """The shard's replicas (``{replica_id: StoreReplica handle}``); see :class:`actors.primary_link.PrimaryLink`."""
        return self.repl.set_replicas(epoch, replicas, min_acks)

    async def replication_status(self) -> dict[str, Any]:
        """Epoch, applied seq and per-replica acked seq/lag/in-sync (``fanout status``)."""
        return self.repl.status()

    async def close(self) -> None:
        """Stop the tick, finish pending writes, close the store."""
        self._closed = True
        self.repl.close()
        await self._channel.close()
        for calls in self._node_calls.values():
            calls.close()
        self._task.cancel()
        self._groups_task.cancel()
        await self._writer.run(lambda: None)  # drain queued writes
        self._writer.shutdown()
        self.store.close()

    # -- inputs ---------------------------------------------------------------------------------------------

    async def put_blobs(self, items: list[tuple]) -> list[None]:
        """Store :class:`fanout.records.BlobItem` tuples durably; returns after the commit."""
        batch = self.core.blob_batch(items)
        await self._write(batch)
        self.core.blobs_stored(items)
        return [None] * len(items)

    async def has_data(self, data_ids: list[str]) -> list[bool]:
        """Whether each data id has a blob on this shard."""
        return self.core.has_data(data_ids)

    async def requests_in_use(self, request_ids: list[str]) -> list[bool]:
        """Whether this shard holds rows of each request id (the ingest conflict check)."""
        return self.core.requests_in_use(request_ids)

    async def trigger_conflicts(self, items: list[tuple]) -> list[str | None]:
        """Per :class:`fanout.records.IngestItem`: None, or why its request id may not queue its VINs."""
        return self.core.trigger_conflicts(items)

    async def ingest(self, items: list[tuple]) -> list[Any]:
        """Durably enqueue :class:`fanout.records.IngestItem` tuples, then dispatch the new rows.

        Returns:
            Per item ``{"vins": n}`` or an error string (unknown data id: nothing written for it).
        """
        job = self.core.ingest_job(items)
        for part in job.parts():
            if not part.batch:
                continue
            t0 = time.perf_counter()
            counts = await self._write(part.batch)
            t1 = time.perf_counter()
            ready = await self._dispatch_new(part.vin_lists)
            if part.head:
                self._tick()  # ship the head's sends now: building the rest's batch holds the loop
            log.debug("ingest part applied", shard=self.shard, head=part.head, triggers=len(items), counts=counts,
                      ready=ready, write_ms=round(1000 * (t1 - t0), 1),
                      dispatch_ms=round(1000 * (time.perf_counter() - t1), 1))
        return job.results()

    async def _dispatch_new(self, vin_lists: list[list[str]]) -> int:
        """"New batch" trigger for durable rows, in the core's slices; the loop runs between the slices of
        a big list, so the tick ships the first sends while the rest is read. Returns how many were ready."""
        ready = 0
        for n, give_way in self.core.dispatch_slices(vin_lists):
            ready += n
            self._kick()
            if give_way:
                await asyncio.sleep(0)
        return ready

    async def events(self, node_id: str, events: list[tuple] | bytes) -> str:
        """Apply one node's event batch (a list, or ``fanout.records.pack_batch`` of it).

        Returns:
            This dispatcher's incarnation (a change tells the node to resend its connections).
        """
        self._calls_in += 1
        self.core.apply_events(node_id, unpack_batch(events))
        if not self._groups_joined.is_set() and self.core.topic_groups.active:  # members join by events only
            self._groups_joined.set()
        self._kick()
        return self.incarnation

    async def deliveries_done(self, node_id: str, failures: list[tuple]) -> None:
        """Failures reported for an earlier ``deliver`` batch (also applied internally on each reply)."""
        self.core.delivery_failures(node_id, failures)
        self._kick()

    async def apply_batch(self, batch_bytes: bytes) -> dict[str, Any]:
        """Apply a WriteBatch built elsewhere (a GC plan, metrics) through this shard's single writer.

        Returns:
            ``{"applied_seq": n, "counts": {...}}``.
        """
        batch = WriteBatch.from_bytes(batch_bytes)
        counts = await self._write(batch)
        if any(op[0] in (DELETE_BLOB, DELETE_BLOB_IF) for op in batch.ops):  # blobs gone: drop data caches
            self.core.forget_data()
        return {"applied_seq": self.store.applied_seq, "counts": counts}

    async def export_snapshot(self, out_dir: str) -> dict[str, Any]:
        """Export this shard for the Spark jobs (``storage.jobs.export.export_shard``, imported lazily): one
        read transaction, off the event loop, concurrent with the writer.

        Returns:
            The ``ExportInfo`` as a dict (watermark ``applied_seq``, rows per table).

        Raises:
            RuntimeError: the export module is not available yet.
        """
        try:
            from storage.jobs import export
        except ImportError as exc:
            raise RuntimeError("storage.jobs.export is not available in this build") from exc
        loop = asyncio.get_running_loop()
        info = await loop.run_in_executor(None, export.export_shard, self.store, out_dir)
        return info.as_dict() if hasattr(info, "as_dict") else dict(info)

    # -- request lifecycle ------------------------------------------------------------------------------------

    async def request_status(self, request_id: str) -> dict[str, Any] | None:
        """This shard's counters of ``request_id`` with its rows in flight, or None if it has none here."""
        return self.core.request_status(request_id)

    async def list_requests(self, limit: int = 1000) -> list[dict[str, Any]]:
        """This shard's requests (by request id, at most ``limit``) with their counters."""
        return self.core.list_requests(limit)

    async def request_states(self, limit: int = 100_000) -> list[tuple[str, int, int, int]]:
        """``(request_id, pending, cancelled, expired)`` of this shard's requests (``fanout_requests{state}``)."""
        return self.store.request_states(limit)

    async def cancel_request(self, request_id: str) -> dict[str, Any] | None:
        """Cancel ``request_id`` on this shard: nothing more of it is sent, its pending rows are settled as
        cancelled (durable and replicated when this returns). Idempotent. Returns the status after it."""
        batch = self.core.begin_cancel(request_id, _now_ms())
        try:
            await self._write(batch)
        finally:
            self.core.end_cancel(request_id)
            self._kick()
        return self.core.request_status(request_id)

    async def request_control(self, ops: list[tuple[str, str]]) -> list[dict[str, Any] | None]:
        """Per ``(verb, request_id)`` of :mod:`fanout.request_control` (a platform's status or cancel over MQTT):
        the status after the verb (the node asks for a cancel only of a request some shard knows)."""
        return [self.core.topic_groups.topic_info(rid) if verb == TOPIC_INFO else await (
                    self.cancel_request(rid) if verb == "cancel" else self._topic_ack(rid) if verb == TOPIC_ACK
                    else self.request_status(rid)) for verb, rid in ops]

    async def _topic_ack(self, op: str) -> dict[str, Any] | None:
        """An explicit consumer-group commit (``client.ack``): written by the shard of its partition."""
        batch, answer = self.core.topic_groups.explicit_commit(op, _now_ms())
        if batch is None:
            return answer
        await self._write(batch)
        return self.core.topic_groups.explicit_committed(op)

    async def expire_sweep(self) -> dict[str, Any]:
        """Settle for good the pending rows of the requests whose ttl has passed (the GC cycle calls it).

        Returns:
            ``{"requests": [request ids swept], "rows": n}``.
        """
        self.core.lifecycle.forget_done()  # once per GC cycle: the User Properties of finished requests
        taken = self.core.lifecycle.sweep_batch(_now_ms())
        if taken is None:
            return {"requests": [], "rows": 0}
        batch, lapsed = taken
        counts = await self._write(batch)
        self.core.lifecycle.swept(lapsed)
        return {"requests": lapsed, "rows": counts.get("expired_rows", 0)}

    # -- durable topics (logic in fanout.topics.log_calls; ONE WriteBatch per call) ----------------------------

    async def topic_append(self, items: list[tuple] | bytes, *more: bytes) -> int:
        """Append one node's :class:`fanout.topics.records.AppendItem` tuples (or ``pack_batch`` of them, possibly
        in :func:`actors.ray_args.chunked` pieces) in one WriteBatch; returns once it is durable and replicated
        (the node then acknowledges the publishers).

        Raises:
            ValueError: an item for a topic or partition this shard does not hold (nothing is written).
        """
        items = unpack_batch(joined((items, *more)) if more else items)
        await self._write(self.topics.append_batch(items, _now_ms()))
        return len(items)

    async def topic_read(self, requests: list[tuple]) -> list[tuple]:
        """One :class:`fanout.topics.records.ReadResult` per :class:`fanout.topics.records.ReadRequest`."""
        return self.topics.read(requests)

    async def topic_commit(self, items: list[tuple]) -> int:
        """Commit :class:`fanout.topics.records.CommitItem` tuples in one WriteBatch (durable, replicated)."""
        if items:
            await self._write(self.topics.commit_batch(items, _now_ms()))
        return len(items)

    async def topic_info(self, names: list[str] | None = None) -> dict[str, Any]:
        """Per topic: its spec, the bounds of the partitions held here and each group's committed offsets."""
        return self.topics.info(names)

    async def create_topic(self, spec: Any) -> dict[str, Any]:
        """Create (or update the retention of) a durable topic in this shard's store (idempotent).

        Raises:
            ValueError: an invalid spec, or another partition count than the existing topic's.
        """
        await self._write(self.topics.create_batch(spec, _now_ms()))
        self.topics.refresh()
        return self.topics.info([spec.name])

    async def topic_specs(self) -> list[Any]:
        """The ``storage.topics.TopicSpec`` of every topic of this shard's catalog."""
        return list(self.topics.refresh().values())

    # -- introspection ----------------------------------------------------------------------------------------

    async def stats(self) -> dict[str, Any]:
        """Shard counters (pending rows, in flight, delivered, applied_seq, ...)."""
        out = self.core.stats()
        out["incarnation"] = self.incarnation
        out["calls_in_flight"] = sum(self._calls.values())
        out["event_calls"] = self._calls_in
        out["deliver_calls"] = self._calls_out
        out["deliver_call_ms_avg"] = round(1000 * self._deliver_s / max(1, self._calls_out), 2)
        out["channel"] = self._channel.stats()
        out["channel_fallbacks"] = sum(c.fallbacks for c in self._node_calls.values())
        out["group_polls"] = self._group_polls  # consumer-group log polls (none while no group has a member here)
        return out

    async def metrics(self) -> list[dict[str, Any]]:
        """Every row of this shard's ``metrics`` table (``$SYS`` values are upserted on shard 0)."""
        return self.store.get_metrics_all()

    async def inspect_vin(self, vin: str) -> dict[str, Any]:
        return self.core.inspect_vin(vin)

    async def inspect_request(self, request_id: str) -> dict[str, Any]:
        return self.core.inspect_request(request_id)

    async def inspect_data(self, data_id: str) -> dict[str, Any] | None:
        return self.core.inspect_data(data_id)

    # -- the tick ----------------------------------------------------------------------------------------------

    def _kick(self) -> None:
        if self.core.has_work:
            self._wake.set()

    async def _write(self, batch: WriteBatch) -> dict[str, int]:
        """Apply ``batch`` durably (group commit) and return the counters of its commit."""
        loop = asyncio.get_running_loop()
        done: asyncio.Future = loop.create_future()
        self._queued_writes.append((batch, done))
        if not self._writing:
            self._writing = True
            loop.create_task(self._write_loop())
        return await done

    async def _write_loop(self) -> None:
        """Group commit: every batch queued while a commit runs goes into the next one.

        The batches are concatenated in arrival order into ONE WriteBatch (one transaction, one
        ``applied_seq``, one fsync), so a burst of ingests and delete batches costs one commit latency,
        not one each; the combined batch is still the unit replication ships.
        """
        try:
            while self._queued_writes:
                group, self._queued_writes = self._queued_writes, []
                merged = group[0][0] if len(group) == 1 else WriteBatch([op for b, _ in group for op in b.ops])
                try:
                    # Shipped from this thread first: the replicas apply it while the writer thread does.
                    result = await self._writer.run(self.repl.apply_local, merged, self.repl.ship(merged))
                except Exception as exc:
                    if len(group) == 1:
                        group[0][1].set_exception(exc)
                        continue
                    log.warning("group commit failed, applying its batches one by one", shard=self.shard,
                                batches=len(group), error=repr(exc))
                    for batch, done in group:  # only the faulty batch fails
                        try:
                            r = await self._writer.run(self.repl.apply_local, batch, self.repl.ship(batch))
                            self.core.applied(r.counts)
                            self.repl.settle_after_replication(r, [done])
                        except Exception as one:
                            done.set_exception(one)
                    continue
                self.core.applied(result.counts)
                # Callers are answered once the replicas hold the batch; the next group applies meanwhile.
                self.repl.settle_after_replication(result, [done for _batch, done in group])
        finally:
            self._writing = False

    async def _run(self) -> None:
        while True:
            await self._wake.wait()
            self._wake.clear()
            if self._tick_s > 0:
                await asyncio.sleep(self._tick_s)
            try:
                self._tick()
            except Exception:
                log.exception("dispatcher tick failed", shard=self.shard)

    def _tick(self) -> None:
        core = self.core
        now = _now_ms()
        core.drain(now)
        if not self._deleting:
            taken = core.take_deletes(now)
            if taken is not None:
                self._deleting = True
                asyncio.get_running_loop().create_task(self._write_deletes(*taken))
        self._topic_group_commits(now)
        for node in core.nodes_with_output():
            if self._calls.get(node, 0) >= MAX_CALLS_PER_NODE:
                continue  # pipelined into the next call
            handle = self._nodes.get(node)
            if handle is None:
                continue  # not wired yet (restart recovery in progress): the sends wait
            batch = core.take_node_batch(node, MAX_SENDS_PER_CALL)
            self._calls[node] = self._calls.get(node, 0) + 1
            self._calls_out += 1
            asyncio.get_running_loop().create_task(self._deliver(node, handle, batch))

    async def _write_deletes(self, batch: WriteBatch, deletes: list) -> None:
        try:
            await self._write(batch)
            self.core.deletes_applied(deletes)
        except Exception:
            log.exception("dispatcher delete batch failed", shard=self.shard, rows=len(deletes))
            self.core.requeue_deletes(deletes)  # retried with the next batch
        finally:
            self._deleting = False
            self._kick()

    async def _deliver(self, node: str, handle: Any, batch: tuple) -> None:
        """One ``deliver`` call of a :class:`fanout.records.DeliverBatch` wire tuple to ``node``."""
        sends = batch[0]
        started = time.perf_counter()
        try:
            failures = await self._node_calls[node].call("deliver", pack_batch(batch))
            self._deliver_s += time.perf_counter() - started
            if failures:
                self.core.delivery_failures(node, failures)
        except ray.exceptions.RayActorError as exc:
            log.warning("connection node unreachable", node=node, shard=self.shard, error=str(exc)[:200])
            self.core.node_down(node)
        except Exception:
            log.exception("deliver call failed", node=node, shard=self.shard, sends=len(sends))
            self.core.call_failed(node, sends)
            self.core.topic_groups.call_failed(batch[4] if len(batch) > 4 else [])
        finally:
            self._calls[node] -= 1
            self._kick()

    # -- consumer groups of durable topics (fanout.dispatcher.topic_groups) -------------------------------------

    async def _topic_groups_loop(self) -> None:
        """While some group has a member here, tick every TOPIC_GROUP_POLL_S: appends reach the log through
        this shard's writer from anywhere, and the tick is where the groups learn of them. Without a member
        it sleeps until :meth:`events` brings one: a 100 Hz timer costs 10-14 ms of CPU per second here
        (idle and under load alike), for nothing when no group consumes."""
        groups = self.core.topic_groups
        while not self._closed:
            if not groups.active:
                self._groups_joined.clear()
                await self._groups_joined.wait()
                continue
            await asyncio.sleep(TOPIC_GROUP_POLL_S)
            self._group_polls += 1
            if groups.active:
                self._wake.set()

    def _topic_group_commits(self, now_ms: int) -> None:
        """The tick's group commits: one WriteBatch, one ``topic_commit`` per moved group partition."""
        if self._committing:
            return
        taken = self.core.topic_groups.commit_batch(now_ms)
        if taken is not None:
            self._committing = True
            asyncio.get_running_loop().create_task(self._write_topic_commits(*taken))

    async def _write_topic_commits(self, batch: WriteBatch, items: list) -> None:
        try:
            await self._write(batch)
        except Exception:
            log.exception("consumer group commit failed", shard=self.shard, commits=len(items))
            self.core.topic_groups.commits_failed(items)
        finally:
            self._committing = False
            self._kick()


__all__ = ["Dispatcher", "MAX_CALLS_PER_NODE"]
