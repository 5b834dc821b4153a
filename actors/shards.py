"""The Controller's shard table: placement of primaries and replicas, epochs, failover, the layout file.

Strategy:

- Placement: shard ``k``'s primary (its Dispatcher) on fanout node ``k % nodes``; its ``fanout.replicas``
  StoreReplicas on the following nodes, never on the primary's node when another node exists (on one
  machine they share it). ``min_replicas_to_ack`` = -1 resolves to 1 on several nodes, 0 on one (capped
  by ``replicas``).
- Layout: ``<data_dir>/layout.json`` records per shard the epoch, the primary's directory and address, and
  the replicas' ids, directories and addresses. It is rewritten after every change; a cluster restarted
  from its data directories reads it and reopens every shard where it was (a promoted replica's directory
  stays the primary's). Without a layout: ``shard-<k>`` and ``replica-<k>-<n>``.
- Failure detection (:meth:`ShardSet.watch_once`, every ``fanout.heartbeat_interval``): one
  ``check_health`` probe in flight per primary, per replica and per connection node. A primary silent for
  ``fanout.failover_timeout`` whose Ray node is silent too (its connection node does not answer) is failed
  over; a replica lost that way is replaced by a new one on another node (caught up by
  snapshot + log). An actor killed on a live node is restarted by Ray on its own data and caught up, which
  loses nothing and is cheaper than a failover: it is failed over only when silent ``RESTART_GRACE``
  timeouts.
- Failover (:meth:`ShardSet.failover`): kill the old primary without restart (fencing it; the replicas also
  reject its epoch once they saw the new one), ask every replica for its applied seq, promote the highest
  under ``epoch + 1`` (its store is closed, a new Dispatcher opens the same directory on that node), give
  it the other replicas, the connection nodes and every node the new handle (they resend their pending
  events and fail calls to the old primary, whose tickets the platform resends), then restore the replica
  count in the background.
"""
from __future__ import annotations

import asyncio
import json
import os
import time
from pathlib import Path
from typing import Any, Callable

import ray
import structlog
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

from .dispatcher import Dispatcher
from .names import fanout_ray_nodes
from .ray_observability import actor_options
from .shard_count import LAYOUT_FILE, read_layout
from .store_replica import StoreReplica, replica_dir

log = structlog.get_logger(__name__)

PROBE_TIMEOUT_S = 2.0
RESTART_GRACE = 4  # failover_timeouts a silent actor on a live node gets to be restarted by Ray
START_TIMEOUT_S = 120.0


class _Loc:
    """Where one copy of a shard lives: actor handle, directory, Ray node, address, probe state."""

    __slots__ = ("handle", "path", "ray_node_id", "address", "rid", "last_ok", "probe")

    def __init__(self, handle: Any, path: str, ray_node: dict[str, Any], rid: str = "primary") -> None:
        self.handle = handle
        self.path = path
        self.ray_node_id: str = ray_node["NodeID"]
        self.address: str | None = ray_node.get("NodeManagerAddress")
        self.rid = rid
        self.last_ok = time.monotonic()
        self.probe: asyncio.Task | None = None

    def layout(self) -> dict[str, Any]:
        return {"id": self.rid, "path": self.path, "address": self.address}


class ShardSet:
    """Primaries and replicas of every shard (owned by the Controller).

    Args:
        config: the loaded config.
        data_dir: shard root.
        controller_name: the Controller's actor name (given to Dispatchers for recovery).
        nodes: returns the alive connection nodes ``{node_id: handle}`` (for wiring a new primary).
    """

    def __init__(self, config: Any, data_dir: str, controller_name: str | None,
                 nodes: Callable[[], dict[str, Any]], node_handles: Callable[[], dict[str, Any]]) -> None:
        self.config = config
        self.data_dir = data_dir
        self.controller_name = controller_name
        self._nodes = nodes
        self._node_handles = node_handles  # {ray_node_id: ConnectionNode}: probed to tell node death from process death
        self._node_probes: dict[str, _Loc] = {}
        self._last_round = 0.0
        self.primaries: list[_Loc] = []
        self.replicas: list[dict[str, _Loc]] = []
        self.epochs: list[int] = []
        self.min_acks = 0
        self.failovers: list[dict[str, Any]] = []
        self._busy: set[int] = set()
        self._next_rid: list[int] = []
        self._shards = 0

    @property
    def dispatchers(self) -> list[Any]:
        return [p.handle for p in self.primaries]

    # -- start ---------------------------------------------------------------------------------------------

    async def start(self, ray_nodes: list[dict[str, Any]], shards: int) -> None:
        """Create (or reopen from the layout) every shard's replicas and primary; wire replication."""
        cfg = self.config
        n = len(ray_nodes)
        want = cfg.fanout.replicas
        self.min_acks = min(want, cfg.fanout.min_replicas_to_ack if cfg.fanout.min_replicas_to_ack >= 0
                            else (1 if n > 1 else 0))
        layout = self._read_layout(shards)
        self._shards = shards
        for k in range(shards):
            lay = layout[k] if layout else None
            prim_node = self._node_for(lay["primary"] if lay else None, ray_nodes, ray_nodes[k % n])
            reps: dict[str, _Loc] = {}
            rep_specs = lay["replicas"] if lay else [
                {"id": f"r{i}", "path": str(replica_dir(self.data_dir, k, i)), "address": None} for i in range(want)]
            others = [rn for rn in ray_nodes if rn["NodeID"] != prim_node["NodeID"]] or [prim_node]
            for i, spec in enumerate(rep_specs):
                rn = self._node_for(spec, others, others[(k + i) % len(others)])
                handle = StoreReplica.options(**self._on_node(rn["NodeID"])).remote(
                    cfg, k, spec["id"], spec["path"])
                reps[spec["id"]] = _Loc(handle, spec["path"], rn, spec["id"])
            self.replicas.append(reps)
            self._next_rid.append(1 + max([int(r[1:]) for r in reps if r[1:].isdigit()], default=-1))
            self.epochs.append(int(lay["epoch"]) if lay else 1)
            path = lay["primary"]["path"] if lay else str(Path(self.data_dir) / f"shard-{k}")
            handle = Dispatcher.options(**self._on_node(prim_node["NodeID"])).remote(
                cfg, k, shards, self.data_dir, self.controller_name, self._replication(k, path))
            self.primaries.append(_Loc(handle, path, prim_node))
        await asyncio.gather(*(p.handle.ready.remote() for p in self.primaries))
        await asyncio.gather(*(r.handle.ready.remote() for reps in self.replicas for r in reps.values()))
        await asyncio.gather(*(self._wire(k) for k in range(shards)))
        self._save_layout()
        log.info("shards started", shards=shards, replicas=want, min_acks=self.min_acks, epochs=self.epochs,
                 from_layout=bool(layout))

    def _replication(self, k: int, path: str) -> dict[str, Any]:
        return {"path": path, "epoch": self.epochs[k], "min_acks": self.min_acks}

    async def _wire(self, k: int) -> None:
        await self.primaries[k].handle.set_replicas.remote(
            self.epochs[k], {rid: r.handle for rid, r in self.replicas[k].items()}, self.min_acks)

    def _on_node(self, ray_node_id: str) -> dict[str, Any]:
        """``.options()`` of a store actor pinned to a Ray node (without Ray's task events unless configured)."""
        return {"scheduling_strategy": NodeAffinitySchedulingStrategy(ray_node_id, soft=False),
                **actor_options(self.config)}

    @staticmethod
    def _node_for(spec: dict[str, Any] | None, candidates: list[dict[str, Any]],
                  default: dict[str, Any]) -> dict[str, Any]:
        """The default node if it matches the recorded address (or none is recorded), else one that does."""
        want = spec.get("address") if spec else None
        if want is None or default.get("NodeManagerAddress") == want:
            return default
        return next((rn for rn in candidates if rn.get("NodeManagerAddress") == want), default)

    # -- the layout file --------------------------------------------------------------------------------------

    def _read_layout(self, shards: int) -> list[dict[str, Any]] | None:
        layout = read_layout(self.data_dir)
        if layout is not None and len(layout) != shards:
            raise RuntimeError(f"{Path(self.data_dir) / LAYOUT_FILE} describes {len(layout)} shards, fanout.dispatchers "
                               f"asks for {shards} (set it to 0 to take the stored count; VINs do not move between "
                               "shards)")
        return layout

    def _save_layout(self) -> None:
        data = {"shards": [{"epoch": self.epochs[k], "primary": self.primaries[k].layout(),
                            "replicas": [r.layout() for r in self.replicas[k].values()]}
                           for k in range(len(self.primaries))]}
        p = Path(self.data_dir) / LAYOUT_FILE
        tmp = p.with_suffix(".tmp")
        tmp.write_text(json.dumps(data, indent=1))
        os.replace(tmp, p)  # atomic: a crash leaves the old or the new layout, never half of one

    # -- status --------------------------------------------------------------------------------------------------

    def replication_of(self, k: int) -> dict[str, Any]:
        return {"epoch": self.epochs[k], "min_acks": self.min_acks,
                "replicas": {rid: r.handle for rid, r in self.replicas[k].items()}}

    async def status(self, node_of: Callable[[str], str | None]) -> list[dict[str, Any]]:
        """Per shard: primary (node, path), epoch, applied seq, replicas with acked seq, lag and in-sync."""
        stats = await asyncio.gather(*(asyncio.wait_for(p.handle.replication_status.remote(), PROBE_TIMEOUT_S)
                                       for p in self.primaries), return_exceptions=True)
        out = []
        for k, (p, st) in enumerate(zip(self.primaries, stats)):
            row: dict[str, Any] = {"shard": k, "epoch": self.epochs[k], "primary": {
                "node": node_of(p.ray_node_id), "path": p.path, "alive": not isinstance(st, BaseException)},
                "failing_over": k in self._busy}
            by_id = {} if isinstance(st, BaseException) else {r["id"]: r for r in st["replicas"]}
            if not isinstance(st, BaseException):
                row.update(applied_seq=st["applied_seq"], min_acks=st.get("min_acks", self.min_acks),
                           waiting_writes=st.get("waiting_writes", 0))
            row["replicas"] = [{"id": rid, "node": node_of(r.ray_node_id), "path": r.path,
                                "acked_seq": by_id.get(rid, {}).get("acked_seq"), "lag": by_id.get(rid, {}).get("lag"),
                                "in_sync": by_id.get(rid, {}).get("in_sync", False)}
                               for rid, r in self.replicas[k].items()]
            out.append(row)
        return out

    # -- failure detection ---------------------------------------------------------------------------------------

    def _down(self, loc: _Loc, now: float, timeout: float) -> bool:
        """Whether ``loc`` counts as lost: silent past ``timeout`` on a Ray node whose
        connection node is silent too (the node died). Silent on a live node means its process died and Ray
        is restarting it on its data (cheaper than a failover and loses nothing): wait up to
        ``RESTART_GRACE`` timeouts before giving up on it."""
        _probe(loc)
        silent = now - loc.last_ok
        if silent <= timeout:
            return False
        node = self._node_probes.get(loc.ray_node_id)
        return node is None or now - node.last_ok > timeout or silent > RESTART_GRACE * timeout

    def _probe_nodes(self) -> None:
        for ray_node_id, handle in self._node_handles().items():
            loc = self._node_probes.get(ray_node_id)
            if loc is None or loc.handle is not handle:
                loc = self._node_probes[ray_node_id] = _Loc(handle, "", {"NodeID": ray_node_id}, "node")
            _probe(loc)

    async def watch_once(self) -> None:
        """One round of probes; fail over lost primaries, replace lost replicas."""
        timeout = self.config.fanout.failover_timeout_ms / 1000.0
        now = time.monotonic()
        if now - self._last_round > timeout / 2:
            # Not probing for a while (start-up, a stalled controller): silence since then says nothing.
            for loc in [*self.primaries, *(r for reps in self.replicas for r in reps.values()),
                        *self._node_probes.values()]:
                loc.last_ok = max(loc.last_ok, now)
        self._last_round = now
        self._probe_nodes()
        for k in range(len(self.primaries)):
            if k in self._busy:
                continue
            p = self.primaries[k]
            if self._down(p, now, timeout):
                self._busy.add(k)
                asyncio.get_running_loop().create_task(self._guarded(k, self.failover(k, reason=_why(p, now))))
                continue
            for rid, r in list(self.replicas[k].items()):
                if self._down(r, now, timeout):
                    self._busy.add(k)
                    asyncio.get_running_loop().create_task(self._guarded(k, self.replace_replica(k, rid)))
                    break

    async def _guarded(self, k: int, coro: Any) -> None:
        try:
            await coro
        except Exception:
            log.exception("shard recovery failed, will retry", shard=k)
            await asyncio.sleep(1.0)
        finally:
            self._busy.discard(k)
            now = time.monotonic()
            self.primaries[k].last_ok = max(self.primaries[k].last_ok, now - 0.5 * self.config.fanout.failover_timeout_ms / 1000)

    # -- failover ------------------------------------------------------------------------------------------------

    async def failover(self, k: int, reason: str = "") -> dict[str, Any] | None:
        """Promote shard ``k``'s most advanced replica under a new epoch (see the module docstring).

        Returns:
            ``{shard, epoch, replica, applied_seq, seconds}``, or None when no replica answers (retried later).
        """
        started = time.monotonic()
        old = self.primaries[k]
        log.error("shard primary down, failing over", shard=k, epoch=self.epochs[k], reason=reason)
        try:
            ray.kill(old.handle, no_restart=True)  # fence: no Ray restart of the deposed primary
        except Exception:
            pass
        reps = list(self.replicas[k].values())
        infos = await asyncio.gather(*(asyncio.wait_for(r.handle.ready.remote(), PROBE_TIMEOUT_S) for r in reps),
                                     return_exceptions=True)
        alive = [(r, i) for r, i in zip(reps, infos) if not isinstance(i, BaseException)]
        if not alive:
            log.error("no replica of the shard answers: cannot fail over yet", shard=k)
            raise RuntimeError(f"shard {k}: no live replica to promote")
        best, info = max(alive, key=lambda ri: (ri[1]["applied_seq"], ri[1]["epoch"]))
        epoch = max([self.epochs[k]] + [i["epoch"] for _, i in alive]) + 1
        # The replacement replica starts while the promotion runs: with min_replicas_to_ack >= 1 and no other
        # replica left, the new primary's first writes wait for it.
        missing = self.config.fanout.replicas - (len(reps) - 1)
        spawn = (asyncio.ensure_future(self._spawn_replica(k, {old.ray_node_id, best.ray_node_id}))
                 if missing > 0 else None)
        closed = await best.handle.promote.remote()
        ray.kill(best.handle, no_restart=True)
        ray_node = {"NodeID": best.ray_node_id, "NodeManagerAddress": best.address}
        handle = Dispatcher.options(**self._on_node(best.ray_node_id)).remote(
            self.config, k, self._shards, self.data_dir, self.controller_name,
            {"path": closed["path"], "epoch": epoch, "min_acks": self.min_acks})
        await asyncio.wait_for(handle.ready.remote(), START_TIMEOUT_S)
        self.primaries[k] = _Loc(handle, closed["path"], ray_node)
        self.epochs[k] = epoch
        del self.replicas[k][best.rid]
        self._save_layout()
        await self._wire(k)  # the remaining replicas (none: writes wait for the spawned one)
        nodes = self._nodes()
        await handle.set_nodes.remote(nodes)
        # Nodes first: the new primary can resend what is pending (sends need no write) while the new replica
        # starts. A node on the dead Ray node never answers: bounded.
        await asyncio.wait([asyncio.ensure_future(h.set_dispatcher.remote(k, handle)) for h in nodes.values()],
                           timeout=PROBE_TIMEOUT_S)
        if spawn is not None:
            loc = await spawn
            if loc is not None:
                self.replicas[k][loc.rid] = loc
                self._save_layout()
                await self._wire(k)
        result = {"shard": k, "epoch": epoch, "replica": best.rid, "applied_seq": closed["applied_seq"],
                  "seconds": round(time.monotonic() - started, 3), "reason": reason}
        self.failovers.append(result)
        log.warning("shard failed over", **result)
        asyncio.get_running_loop().create_task(self._restore_count(k, prefer_not={old.ray_node_id}))
        return result

    async def replace_replica(self, k: int, rid: str) -> None:
        """Drop a silent replica (killed without restart) and start a new one elsewhere."""
        old = self.replicas[k].pop(rid, None)
        if old is None:
            return
        log.error("replica down, replacing it", shard=k, replica=rid, path=old.path)
        try:
            ray.kill(old.handle, no_restart=True)
        except Exception:
            pass
        await self._wire(k)
        await self._restore_count(k, prefer_not={old.ray_node_id})

    async def _restore_count(self, k: int, prefer_not: set[str] | None = None) -> None:
        """Start new replicas (fresh directories, caught up by snapshot + log) up to ``fanout.replicas``."""
        while len(self.replicas[k]) < self.config.fanout.replicas:
            used = {self.primaries[k].ray_node_id} | {r.ray_node_id for r in self.replicas[k].values()}
            loc = await self._spawn_replica(k, used | set(prefer_not or ()))
            if loc is None:
                return
            self.replicas[k][loc.rid] = loc
            self._save_layout()
            await self._wire(k)
            log.info("replica added", shard=k, replica=loc.rid, path=loc.path)

    async def _spawn_replica(self, k: int, prefer_not: set[str]) -> _Loc | None:
        """A new, started StoreReplica of shard ``k`` (not wired): on a node outside ``prefer_not`` if there is
        one, never on a silent node (Ray may still list a dead node: its GCS health check is slower)."""
        avoid: set[str] = set()
        timeout = self.config.fanout.failover_timeout_ms / 1000.0
        for _attempt in range(5):  # bounded
            now = time.monotonic()
            silent = {rid for rid, loc in self._node_probes.items() if now - loc.last_ok > timeout}
            nodes = [n for n in fanout_ray_nodes() if n["NodeID"] not in avoid | silent]
            rn = next((n for n in nodes if n["NodeID"] not in prefer_not), None) or next(iter(nodes), None)
            if rn is None:
                log.error("no node for a new replica", shard=k)
                return None
            i = self._next_rid[k]
            self._next_rid[k] += 1
            rid, path = f"r{i}", str(replica_dir(self.data_dir, k, i))
            handle = StoreReplica.options(**self._on_node(rn["NodeID"])).remote(self.config, k, rid, path)
            try:
                await asyncio.wait_for(handle.ready.remote(), START_TIMEOUT_S)
            except Exception as exc:
                log.warning("new replica did not start, trying another node", shard=k, node=rn["NodeID"],
                            error=str(exc)[:200])
                avoid.add(rn["NodeID"])
                try:
                    ray.kill(handle, no_restart=True)
                except Exception:
                    pass
                continue
            return _Loc(handle, path, rn, rid)
        return None

    async def close(self) -> None:
        """Close every store (primaries first: they stop shipping), then kill the actors."""
        await asyncio.gather(*(p.handle.close.remote() for p in self.primaries), return_exceptions=True)
        await asyncio.gather(*(r.handle.close.remote() for reps in self.replicas for r in reps.values()),
                             return_exceptions=True)
        for h in [*self.dispatchers, *(r.handle for reps in self.replicas for r in reps.values())]:
            try:
                ray.kill(h, no_restart=True)
            except Exception:
                pass
        self.primaries, self.replicas = [], []


def _probe(loc: _Loc) -> None:
    """Advance ``loc``'s health probe (one in flight); an answer updates ``last_ok``.

    Errors only mean "not ok": a call in flight when the process died raises ``ActorDiedError`` even though Ray
    is restarting the actor, so no error is taken as death; silence (``last_ok``) decides.
    """
    t = loc.probe
    if t is not None and t.done():
        loc.probe = None
        if not t.cancelled() and t.exception() is None:
            loc.last_ok = time.monotonic()
    if loc.probe is None:
        loc.probe = asyncio.ensure_future(_health(loc.handle))


async def _health(handle: Any) -> None:
    await asyncio.wait_for(handle.check_health.remote(), PROBE_TIMEOUT_S)  # a hung call must not stop probing


def _why(loc: _Loc, now: float) -> str:
    return f"no heartbeat for {now - loc.last_ok:.1f}s"


__all__ = ["ShardSet", "LAYOUT_FILE"]
