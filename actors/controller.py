# Over 500 lines: the one Controller actor class (placement, status, housekeeping, GC and HTTP hooks); the shard table lives in actors/shards.py.
"""Controller actor: places and wires the fanout actors, aggregates status, runs periodic housekeeping.

Strategy:

- One per cluster, named ``fanout-controller`` in namespace ``sdv-fanout`` (``fanout status`` and
  ``fanout inspect`` find it by name). It creates the dispatcher pool (``fanout.dispatchers``; 0 = the data
  directory's count, else one per ``1 + fanout.replicas`` CPUs left by the listeners, see
  :mod:`actors.shard_count`; shard ``k`` pinned to fanout node ``k % nodes`` because its LMDB directory
  lives there) and one ConnectionNode per alive Ray node that has the ``fanout_node`` resource (pinned
  with ``NodeAffinitySchedulingStrategy``). The first node binds the configured port, the others port 0
  unless configured otherwise (several Ray nodes may share one machine, as in tests).
- Wiring: nodes get the dispatcher handles at construction, dispatchers get the node map and nodes
  their peers once every node is ready. The controller is on no hot path.
- Housekeeping loop (every ``mqtt.sys_interval``): collect shard stats, push the cluster-wide
  ``$SYS/fanout/...`` values to every node (published with each node's ``$SYS`` tree), and upsert every
  ``$SYS`` value (``$SYS/fanout/...`` as is, each node's ``$SYS/broker/...`` as ``<topic>@<node_id>``)
  into the ``metrics`` table of shard 0 with one WriteBatch applied by dispatcher 0. Also a health check
  of the nodes: a node that stopped answering is announced down to dispatchers and peers.
- Shards (:class:`actors.shards.ShardSet`): placement of each shard's primary (Dispatcher) and StoreReplicas,
  epochs, the layout file, and failover. A watch loop probes them every ``fanout.heartbeat_interval``.
- GC: :meth:`run_gc` runs one ``storage.jobs.cycle`` (every ``fanout.gc_interval`` from the housekeeping
  loop, and on ``fanout gc --live``): each dispatcher exports its shard, the Spark plan runs in this
  process, and the plan's WriteBatches go to each shard's primary with ``apply_batch`` (see :func:`gc_target`).
- HTTP (``[http]``, port 0 = off): the service class handed in by ``cluster.runtime`` (``cluster.http``;
  ``actors/`` may not import it) is started as a task in ``__init__`` on this actor's loop and awaited by
  :meth:`ready` (as Ray Serve's proxy actor does); it calls :meth:`status`, :meth:`metrics_snapshot` and
  :meth:`inspect` in process, and the request lifecycle (:mod:`actors.requests`). A scrape costs one round of stats calls (as ``fanout status``), nothing is
  added to the probe or housekeeping loops.
"""
from __future__ import annotations

import asyncio
import time
from typing import Any, Callable

import ray
import structlog
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

from fanout import log as fanout_log
from fanout.topics.settings import make_spec
from storage import WriteBatch

from .connection_node import ConnectionNode
from .names import NODE_RESOURCE, fanout_ray_nodes, remote_error_text
from .ray_observability import actor_options
from .requests import RequestDesk
from .shard_count import choose_shard_count
from .shards import ShardSet
from .topics import TopicDesk

log = structlog.get_logger(__name__)

HEALTH_PERIOD_S = 2.0
HEALTH_TIMEOUT_S = 10.0
RECHECK_TIMEOUT_S = 2.0  # a node declared down is probed again each housekeeping round with this timeout
NODE_START_TIMEOUT_S = 120.0
STATUS_TIMEOUT_S = 5.0


def gc_target(dispatchers: list[Any]) -> Any:
    """A ``storage.jobs.cycle.GcTarget`` over the dispatchers (shard k = dispatcher k).

    Its calls block on ``ray.get``: use it off the event loop (``run_gc`` runs the cycle in a thread).
    """
    from storage.jobs.cycle import FunctionTarget

    return FunctionTarget(
        range(len(dispatchers)),
        export=lambda k, out: ray.get(dispatchers[k].export_snapshot.remote(out)),
        applied_seq=lambda k: ray.get(dispatchers[k].ready.remote())["applied_seq"],
        apply=lambda k, batch: ray.get(dispatchers[k].apply_batch.remote(batch.to_bytes()))["counts"],
    )


def _log_gc_failure(task: asyncio.Task) -> None:
    """Done-callback of a scheduled GC cycle: log its failure (the next interval tries again)."""
    if not task.cancelled() and task.exception() is not None:
        log.error("scheduled gc cycle failed", error=remote_error_text(task.exception()))


@ray.remote(num_cpus=0)
class Controller:
    """The cluster's controller.

    Args:
        config: the loaded :class:`fanout.config.Config` (``storage.data_dir`` is the shard root).
        http_service: ``cluster.http.HttpService`` (called as ``http_service(config, self)``), started
            unless ``http.port`` is 0; None = no HTTP listener.
    """

    def __init__(self, config: Any, http_service: Callable[[Any, Any], Any] | None = None) -> None:
        fanout_log.ensure_configured()
        self.config = config
        self.data_dir = str(config.storage.data_dir)
        self.shards: ShardSet | None = None
        self.shard_count: dict[str, Any] = {}
        """Where the shard count came from (:func:`actors.shard_count.choose_shard_count`), for status."""
        self._watch_task: asyncio.Task | None = None
        self.nodes: dict[str, Any] = {}
        self.node_info: dict[str, dict[str, Any]] = {}
        self.down: set[str] = set()
        self._loop_task: asyncio.Task | None = None
        self._last_sys: dict[str, Any] = {}
        self._started = False
        self._addresses: set[str | None] = set()
        self._ray_node_ids: dict[str, str] = {}
        self._next_node = 0
        self._gc_running = False
        self._gc_figures: dict[str, Any] = {"ok": 0, "failed": 0, "seconds_sum": 0.0, "deleted": 0, "last_stage_s": {}}
        self.requests = RequestDesk(lambda: self.dispatchers)
        self.topics = TopicDesk(config, lambda: self.dispatchers, self._alive_nodes)
        self.http = http_service(config, self) if http_service is not None and config.http.port else None
        self._http_task = asyncio.get_event_loop().create_task(self.http.start()) if self.http is not None else None

    async def ready(self) -> dict[str, Any]:
        """Wait for the HTTP listener (if any); ``{"http": url or None}``.

        Raises:
            RuntimeError: the HTTP address cannot be bound; ConfigError: e.g. non-loopback without users.
        """
        if self._http_task is None:
            return {"http": None}
        try:
            return {"http": await asyncio.shield(self._http_task)}
        except Exception as exc:
            log.error("http listener failed to start", host=self.config.http.host, port=self.config.http.port,
                      error=str(exc))
            raise

    async def start(self) -> dict[str, Any]:
        """Create and wire the dispatchers and connection nodes; return when every listener is up.

        Returns:
            ``{"nodes": [{node_id, host, port, ray_node_id}], "shards": n}``.

        Raises:
            RuntimeError: no Ray node has the ``fanout_node`` resource, or a listener cannot start.
        """
        if self._started:
            return self._info()
        await self.ready()  # a taken HTTP port fails the start before any actor is placed
        cfg = self.config
        ray_nodes = fanout_ray_nodes()
        if not ray_nodes:
            raise RuntimeError("no alive Ray node has the 'fanout_node' resource (start Ray with "
                               "--resources='{\"fanout_node\": 1}')")
        shards, self.shard_count = choose_shard_count(
            cfg.fanout.dispatchers, self.data_dir, ray.cluster_resources().get("CPU", 1),
            len(ray_nodes) * cfg.mqtt.listeners_per_node, cfg.fanout.replicas)
        log.info("shard count chosen", shards=shards, **self.shard_count)
        self.shards = ShardSet(cfg, self.data_dir, ray.get_runtime_context().get_actor_name(), self._alive_nodes,
                               lambda: {rid: self.nodes[n] for rid, n in self._ray_node_ids.items() if n in self.nodes})
        await self.shards.start(ray_nodes, shards)
        # The first listener of each Ray node binds the configured port (or any free one); the other
        # listeners of that node (mqtt.listeners_per_node) then share the port it got.
        first = dict(self._place_node(rn) for rn in ray_nodes)
        results = await self._await_listeners(first)
        handles = dict(first)
        extra = dict(self._place_node(rn, port=info["port"]) for rn, info in zip(ray_nodes, results)
                     for _ in range(cfg.mqtt.listeners_per_node - 1))
        if extra:
            try:
                results += await self._await_listeners(extra)
            except BaseException:
                for h in handles.values():
                    ray.kill(h)
                raise
            handles.update(extra)
        self.nodes = handles
        self.node_info = {r["node_id"]: r for r in results}  # type: ignore[index]
        await asyncio.gather(*(d.set_nodes.remote(self.nodes) for d in self.dispatchers))
        await asyncio.gather(*(h.set_peers.remote(self.nodes) for h in self.nodes.values()))
        await self.topics.start()  # the config's [[topics]] in every store, the list on every node
        self._started = True
        self._loop_task = asyncio.get_running_loop().create_task(self._housekeeping())
        self._watch_task = asyncio.get_running_loop().create_task(self._watch())
        info = self._info()
        log.info("fanout cluster started", nodes=info["nodes"], shards=shards)
        return info

    def _place_node(self, ray_node: dict[str, Any], port: int | None = None) -> tuple[str, Any]:
        """Create one ConnectionNode (listener) on ``ray_node`` (not started: await its ``ready``).

        ``port`` None places the node's first listener: the configured port once per machine (other
        Ray nodes on the same machine, as in tests, take any free port). A port places a further
        listener of that node, sharing the first one's port.
        """
        cfg = self.config
        per_node = cfg.mqtt.listeners_per_node
        node_id = f"n{self._next_node}"
        self._next_node += 1
        if port is None:
            address = ray_node.get("NodeManagerAddress")
            port = cfg.mqtt.port if address not in self._addresses else 0
            self._addresses.add(address)
            self._ray_node_ids[ray_node["NodeID"]] = node_id
        handle = ConnectionNode.options(
            **actor_options(cfg),
            # a share of the node's one fanout_node unit, rounded down (Ray keeps 4 decimals)
            resources={NODE_RESOURCE: 1.0 if per_node == 1 else int(10_000 / per_node) / 10_000},
            scheduling_strategy=NodeAffinitySchedulingStrategy(ray_node["NodeID"], soft=False),
        ).remote(cfg, node_id, cfg.mqtt.host, port, self.dispatchers, reuse_port=per_node > 1)
        return node_id, handle

    async def _await_listeners(self, handles: dict[str, Any]) -> list[dict[str, Any]]:
        """Wait for every listener's ``ready``; on a failure kill them all and raise RuntimeError."""
        try:
            results = await asyncio.wait_for(
                asyncio.gather(*(h.ready.remote() for h in handles.values()), return_exceptions=True),
                NODE_START_TIMEOUT_S)
        except asyncio.TimeoutError:
            for h in handles.values():
                ray.kill(h)
            raise RuntimeError(
                f"connection nodes not started within {NODE_START_TIMEOUT_S:.0f}s: is another fanout cluster "
                "holding the 'fanout_node' resource of these Ray nodes?") from None
        errors = [r for r in results if isinstance(r, BaseException)]
        if errors:
            for h in handles.values():
                ray.kill(h)
            raise RuntimeError(remote_error_text(errors[0]))
        return results  # type: ignore[return-value]

    async def _add_new_nodes(self) -> None:
        """Give Ray nodes that joined after start (``ray up`` workers) a ConnectionNode."""
        new = [rn for rn in fanout_ray_nodes() if rn["NodeID"] not in self._ray_node_ids]
        for rn in new:
            placed = dict([self._place_node(rn)])
            try:
                infos = await self._await_listeners(placed)
                more = dict(self._place_node(rn, port=infos[0]["port"])
                            for _ in range(self.config.mqtt.listeners_per_node - 1))
                infos += await self._await_listeners(more) if more else []
                placed.update(more)
            except Exception as exc:
                log.error("connection node failed to start", ray_node_id=rn["NodeID"], error=remote_error_text(exc))
                for h in placed.values():
                    ray.kill(h)
                continue
            for info in infos:
                self.nodes[info["node_id"]] = placed[info["node_id"]]
                self.node_info[info["node_id"]] = info
                log.info("connection node added", **info)
            await asyncio.gather(*(d.set_nodes.remote(self.nodes) for d in self.dispatchers))
            await asyncio.gather(*(h.set_peers.remote(self.nodes) for h in self.nodes.values()))
            await self.topics.push({i["node_id"]: placed[i["node_id"]] for i in infos})

    @property
    def dispatchers(self) -> list[Any]:
        """Current primary (Dispatcher) handle of each shard; changes on failover."""
        return self.shards.dispatchers if self.shards is not None else []

    def _alive_nodes(self) -> dict[str, Any]:
        return {n: h for n, h in self.nodes.items() if n not in self.down}

    def _node_of(self, ray_node_id: str) -> str | None:
        return self._ray_node_ids.get(ray_node_id)

    async def _watch(self) -> None:
        """Probe primaries and replicas; fail over or replace what stays silent (see ``ShardSet.watch_once``)."""
        period = self.config.fanout.heartbeat_interval_ms / 1000.0
        while True:
            await asyncio.sleep(period)
            try:
                if self.shards is not None:
                    await self.shards.watch_once()
            except Exception:
                log.exception("shard watch failed")

    async def replication_of(self, shard: int) -> dict[str, Any]:
        """``{epoch, min_acks, replicas: {id: handle}}`` of a shard (a restarted Dispatcher asks)."""
        return self.shards.replication_of(shard)

    async def failover(self, shard: int) -> dict[str, Any] | None:
        """Fail shard ``shard`` over now (operators, tests); see ``ShardSet.failover``."""
        return await self.shards.failover(shard, reason="requested")

    async def replication(self) -> list[dict[str, Any]]:
        """Per shard: primary, replicas, epoch, applied seq, lag (part of :meth:`status`)."""
        return await self.shards.status(self._node_of) if self.shards is not None else []

    def _info(self) -> dict[str, Any]:
        return {"nodes": [self.node_info[n] for n in sorted(self.node_info)], "shards": len(self.dispatchers),
                "http": self.http.url if self.http is not None else None}

    async def info(self) -> dict[str, Any]:
        """Nodes (with their real ports) and the shard count."""
        return self._info()

    async def handles(self) -> dict[str, Any]:
        """``{"dispatchers": [...], "nodes": {node_id: handle}}`` (tests, benchmarks, tools)."""
        replicas = [{rid: r.handle for rid, r in reps.items()} for reps in self.shards.replicas] if self.shards else []
        return {"dispatchers": list(self.dispatchers), "nodes": dict(self.nodes), "replicas": replicas,
                "ray_nodes": {p: n for p, n in self._ray_node_ids.items()},
                "primary_ray_nodes": [p.ray_node_id for p in self.shards.primaries] if self.shards else [],
                "failovers": list(self.shards.failovers) if self.shards else []}

    async def check_health(self) -> None:
        return None

    async def shutdown(self) -> None:
        """Drain every node, close every store, then kill the actors (the controller stays)."""
        for task in (self._loop_task, self._watch_task):
            if task is not None:
                task.cancel()
        if self.http is not None:
            await self.http.stop()
        alive = self._alive_nodes()
        if alive:
            await asyncio.wait([asyncio.ensure_future(h.drain.remote()) for h in alive.values()], timeout=10.0)
        if self.shards is not None:
            await asyncio.wait_for(self.shards.close(), 30.0)
        for h in self.nodes.values():
            try:
                ray.kill(h, no_restart=True)
            except Exception:
                pass
        self.nodes, self.shards, self._started = {}, None, False
        log.info("fanout cluster stopped")

    # -- status and inspect ------------------------------------------------------------------------------

    async def status(self) -> dict[str, Any]:
        """Cluster status: nodes, shards and totals (the ``fanout status`` JSON)."""
        node_ids = sorted(self.nodes)
        # Bounded: a node or primary on a dead Ray node never answers (status must still work then).
        node_stats = await asyncio.gather(*(asyncio.wait_for(self.nodes[n].stats.remote(), STATUS_TIMEOUT_S)
                                            for n in node_ids), return_exceptions=True)
        shard_stats = await asyncio.gather(*(asyncio.wait_for(d.stats.remote(), STATUS_TIMEOUT_S)
                                             for d in self.dispatchers), return_exceptions=True)
        nodes = []
        for n, st in zip(node_ids, node_stats):
            if isinstance(st, BaseException):
                info = self.node_info.get(n, {})
                nodes.append({"node_id": n, "host": info.get("host"), "port": info.get("port"), "alive": False,
                              "error": str(st)[:200]})
            else:
                nodes.append({**st, "url": f"mqtt://{st['host']}:{st['port']}", "alive": n not in self.down})
        shards = []
        for k, st in enumerate(shard_stats):
            shards.append({"shard": k, "alive": False, "error": str(st)[:200]} if isinstance(st, BaseException)
                          else {**st, "alive": True})
        ok = [s for s in shards if s["alive"]]
        totals = {
            "nodes": len(nodes), "shards": len(shards),
            "connections": sum(n.get("connections", 0) for n in nodes),
            "pending_rows": sum(s["pending_rows"] for s in ok),
            "in_flight": sum(s["in_flight"] for s in ok),
            "delivered": sum(s["delivered"] for s in ok),
            "data_blobs": max((s["data_blobs"] for s in ok), default=0),
            "vehicles_connected": sum(s["connected"] for s in ok),
        }
        return {"nodes": nodes, "shards": shards, "totals": totals, "data_dir": self.data_dir,
                "shard_count": {"shards": len(shards), **self.shard_count},
                "replication": await self.replication(), "topics": await self._topics_or_error()}

    # -- durable topics (actors.topics) ------------------------------------------------------------------------

    async def _topics_or_error(self) -> Any:
        try:
            return await asyncio.wait_for(self.topics.list(), STATUS_TIMEOUT_S)
        except Exception as exc:  # a shard down: status still answers
            return {"error": str(exc)[:200]}

    async def create_topic(self, name: str, topic_filter: str, partitions: int = 0, retention: str = "7d",
                           retention_bytes: str = "1GiB") -> dict[str, Any]:
        """``fanout topics create``: a durable topic in every store, then on every node. Raises ConfigError or
        ValueError for an invalid one."""
        return await self.topics.create(make_spec(name, topic_filter, partitions, retention, retention_bytes))

    async def list_topics(self) -> list[dict[str, Any]]:
        return await self.topics.list()

    async def show_topic(self, name: str) -> dict[str, Any] | None:
        return await self.topics.show(name)

    async def topic_info(self, names: list[str] | None = None) -> dict[str, Any]:
        return await self.topics.info(names)

    async def topic_read(self, requests: list[tuple]) -> list[tuple]:
        return await self.topics.read(requests)

    async def topic_commit(self, items: list[tuple]) -> int:
        return await self.topics.commit(items)

    async def metrics_snapshot(self) -> dict[str, Any]:
        """What ``/metrics`` renders (``cluster.http.metrics``): the :meth:`status` JSON, every live node's
        ``$SYS`` tree (``{node_id: {topic: value}}``) and the GC cycle figures."""
        node_ids = sorted(self._alive_nodes())
        status, *trees = await asyncio.gather(
            self.status(), *(asyncio.wait_for(self.nodes[n].sys_snapshot.remote(), STATUS_TIMEOUT_S) for n in node_ids),
            return_exceptions=True)
        if isinstance(status, BaseException):
            raise status
        return {"status": status, "gc": {**self._gc_figures, "last_stage_s": dict(self._gc_figures["last_stage_s"])},
                "sys": {n: t for n, t in zip(node_ids, trees) if not isinstance(t, BaseException)}}

    async def inspect(self, kind: str, ident: str) -> dict[str, Any]:
        """``fanout inspect vin|data|request ID`` (see :meth:`actors.requests.RequestDesk.inspect`)."""
        return await self.requests.inspect(kind, ident)

    # -- request lifecycle (actors.requests; the HTTP routes and ``fanout requests`` call these) --------------

    async def request_status(self, request_id: str) -> dict[str, Any] | None:
        return await self.requests.request_status(request_id)

    async def list_requests(self, limit: int = 100) -> list[dict[str, Any]]:
        return await self.requests.list_requests(limit)

    async def cancel_request(self, request_id: str) -> dict[str, Any] | None:
        return await self.requests.cancel_request(request_id)

    async def request_states(self) -> dict[str, int]:
        return await self.requests.request_states()

    # -- housekeeping ----------------------------------------------------------------------------------------

    async def run_gc(self, now: bool = False) -> dict[str, Any]:
        """One GC cycle through the dispatchers (``storage.jobs.cycle.run_gc_cycle`` over :func:`gc_target`).

        Args:
            now: requested by an operator (``fanout gc --live``) rather than by the schedule (logged).

        Returns:
            ``GcSummary.as_dict()``, or ``{"status": "running"}`` when a cycle is already under way.
        """
        from storage.jobs.cycle import run_gc_cycle

        if self._gc_running:
            return {"status": "running", "now": now}
        self._gc_running = True
        figures = self._gc_figures
        try:
            swept = await self.requests.expire_sweep()  # lapsed ttls first: cheap, and not Spark's to plan
            target = gc_target(self.dispatchers)
            summary = await asyncio.get_running_loop().run_in_executor(
                None, lambda: run_gc_cycle(target, config=self.config))
        except BaseException:
            figures["failed"] += 1
            raise
        finally:
            self._gc_running = False
        figures["ok"] += 1
        figures["seconds_sum"] += summary.stage_s.get("total", 0.0)
        figures["deleted"] += summary.deleted
        figures["last_stage_s"] = dict(summary.stage_s)
        log.info("gc cycle done", now=now, plan_id=summary.plan_id, deleted=summary.deleted,
                 expired_rows=swept["rows"])
        return {**summary.as_dict(), "expired": swept}

    async def sys_values(self) -> dict[str, Any]:
        """The last cluster-wide ``$SYS/fanout/...`` values pushed to the nodes."""
        return dict(self._last_sys)

    async def publish_sys(self) -> dict[str, Any]:
        """Collect stats, push ``$SYS/fanout/...`` to every node and upsert every ``$SYS`` value in ``metrics``.

        Returns:
            The ``$SYS/fanout/...`` values.
        """
        stats = await asyncio.gather(*(asyncio.wait_for(d.stats.remote(), STATUS_TIMEOUT_S) for d in self.dispatchers),
                                     return_exceptions=True)
        ok = [s for s in stats if not isinstance(s, BaseException)]
        values = {
            "$SYS/fanout/pending": sum(s["pending_rows"] for s in ok),
            "$SYS/fanout/inflight": sum(s["in_flight"] for s in ok),
            "$SYS/fanout/delivered": sum(s["delivered"] for s in ok),
            "$SYS/fanout/data_blobs": max((s["data_blobs"] for s in ok), default=0),
            "$SYS/fanout/vehicles/connected": sum(s["connected"] for s in ok),
            "$SYS/fanout/shards": len(self.dispatchers),
        }
        try:
            values.update(await asyncio.wait_for(self.topics.sys_values(), STATUS_TIMEOUT_S))
        except Exception as exc:
            log.warning("durable topic $SYS values not collected", error=str(exc)[:200])
        self._last_sys = values
        node_ids = sorted(self._alive_nodes())
        await asyncio.gather(*(asyncio.wait_for(self.nodes[n].set_sys.remote(values), STATUS_TIMEOUT_S)
                               for n in node_ids), return_exceptions=True)
        snaps = await asyncio.gather(*(asyncio.wait_for(self.nodes[n].sys_snapshot.remote(), STATUS_TIMEOUT_S)
                                       for n in node_ids), return_exceptions=True)
        now_ms = time.time_ns() // 1_000_000
        batch = WriteBatch()
        for topic, value in values.items():
            batch.put_metric(topic, value, now_ms)
        for n, snap in zip(node_ids, snaps):
            if isinstance(snap, BaseException):
                continue
            for topic, value in snap.items():
                if not topic.startswith("$SYS/fanout/"):
                    batch.put_metric(f"{topic}@{n}", value, now_ms)
        if self.dispatchers:
            await asyncio.wait_for(self.dispatchers[0].apply_batch.remote(batch.to_bytes()), STATUS_TIMEOUT_S)
        return values

    async def _housekeeping(self) -> None:
        sys_s = self.config.mqtt.sys_interval_ms / 1000.0
        next_sys = time.monotonic()
        gc_s = self.config.fanout.gc_interval_ms / 1000.0
        next_gc = time.monotonic() + gc_s
        while True:
            await asyncio.sleep(HEALTH_PERIOD_S if sys_s <= 0 else min(HEALTH_PERIOD_S, sys_s))
            try:
                await self._check_nodes()
                await self._add_new_nodes()
                if sys_s > 0 and time.monotonic() >= next_sys:
                    next_sys = time.monotonic() + sys_s
                    await self.publish_sys()
                if gc_s > 0 and time.monotonic() >= next_gc and not self._gc_running:
                    next_gc = time.monotonic() + gc_s
                    asyncio.get_running_loop().create_task(self.run_gc()).add_done_callback(_log_gc_failure)
            except Exception:
                log.exception("controller housekeeping failed")

    async def _check_nodes(self) -> None:
        for node_id, handle in list(self.nodes.items()):
            if node_id in self.down:
                await self._recheck_down_node(node_id, handle)
                continue
            try:
                await asyncio.wait_for(handle.check_health.remote(), HEALTH_TIMEOUT_S)
            except Exception as exc:
                log.error("connection node down", node_id=node_id, error=str(exc)[:200])
                self.down.add(node_id)
                for d in self.dispatchers:
                    d.node_down.remote(node_id)
                for other, h in self.nodes.items():
                    if other != node_id:
                        h.peer_down.remote(node_id)


    async def _recheck_down_node(self, node_id: str, handle: Any) -> None:
        """A node declared down that answers again (it stalled past HEALTH_TIMEOUT_S: CPU starvation, a
        long pause) is taken back: peers relearn it, and it resends its connections to every shard so
        the dispatchers, which forgot them, deliver to its vehicles again."""
        try:
            await asyncio.wait_for(handle.check_health.remote(), RECHECK_TIMEOUT_S)
        except Exception:
            return  # still down (or dead for good: a Ray node loss is handled by failover)
        self.down.discard(node_id)
        alive = self._alive_nodes()
        await asyncio.gather(*(h.set_peers.remote(alive) for h in alive.values()), return_exceptions=True)
        resent = await asyncio.gather(*(handle.resync.remote(k) for k in range(len(self.dispatchers))),
                                      return_exceptions=True)
        log.warning("connection node back", node_id=node_id,
                    connections_resent=sum(n for n in resent if isinstance(n, int)))


__all__ = ["Controller", "gc_target"]
