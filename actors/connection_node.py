"""ConnectionNode actor: one per Ray node; runs the MQTT listener and moves NodeCore's batches.

Strategy (after Ray Serve's proxy actor, STYLE.md section 4):

- ``__init__`` never blocks: it schedules the server start as a task. :meth:`ready` awaits it and re-raises
  a bind or config failure with host:port in the message. No signal handlers (an actor has no main thread).
- What it owns: the :class:`fanout.mqtt.aio.MQTTServer` (live connections and sessions) and the
  :class:`fanout.node.core.NodeCore` plugged into its broker. All protocol and fanout decisions are in those
  two; this class only ships batches:
  - events: one ``events`` call per dispatcher with everything queued, when the core says they are due
    (:mod:`fanout.node.event_batching`); one call in flight per dispatcher (ordered; while it runs, the next
    batch accumulates). Batches cross Ray as one pickled ``bytes`` (:mod:`fanout.records`);
  - deliveries: a big ``deliver`` batch reaches the sockets in parts of :data:`DELIVER_CHUNK`;
  - ingest rounds: one task at a time (:meth:`NodeCore.process_ingest`);
  - forwards to peers: one ``forward`` call per peer in flight, queued ones go with the next;
  - route announcements: diffs of the local filter set (and the MQTT 5 shared-group table when it changed),
    at most every 50 ms, to every peer.
- A dispatcher that answers with a new incarnation restarted with an empty state: the node resends the
  connections it holds for that shard (``sync_events``) in front of its queue.
"""
from __future__ import annotations

import asyncio
import gc
import os
import time
from typing import Any

import ray
import structlog

from fanout import log as fanout_log
from fanout import native
from fanout.node.core import NodeCore
from fanout.node.retained_writes import RetainedWrites
from fanout.records import Kick, pack_batch, unpack_batch

from . import channels
from .untraced import plain, unwrap_private_methods
from .channels import dispatcher_service, node_service
from .ray_args import chunked

log = structlog.get_logger(__name__)

# The cyclic GC's default thresholds (700, 10, 10) make a full collection walk every live object (tens of
# thousands of sessions, rows, connections) many times a second under load, stalling the event loop for
# 100+ ms. Hot-path objects are tuples and slotted instances without cycles; collect far less often.
GC_THRESHOLDS = (50_000, 50, 100)

ROUTE_PERIOD_S = 0.05
# A deliver batch bigger than this is handed to the sockets in parts of this size: ~15 µs per send, so
# the first PUBLISHes of a 2,000-send batch leave ~25 ms earlier than after the whole batch.
DELIVER_CHUNK = 256


class _DispatcherLink:
    """:class:`fanout.node.ingest_rounds.ShardLink` over the dispatchers' direct channels
    (:class:`actors.channels.DirectCalls`, a Ray call when a channel cannot carry the call).

    A call to a shard whose dispatcher is replaced (failover) fails at once instead of hanging on the dead
    actor: its tickets are rejected and the platform resends them to the new primary (idempotent).
    """

    def __init__(self, config: Any, handles: list[Any]) -> None:
        self.config = config
        self.calls = [channels.DirectCalls(config, h, dispatcher_service(k)) for k, h in enumerate(handles)]
        self.shards = len(handles)
        self._replaced: dict[int, asyncio.Future] = {}

    def replace(self, shard: int, handle: Any) -> None:
        """Failover: ``shard`` has a new primary; calls in flight to the old one fail now."""
        self.calls[shard].close()
        self.calls[shard] = channels.DirectCalls(self.config, handle, dispatcher_service(shard))
        fut = self._replaced.pop(shard, None)
        if fut is not None and not fut.done():
            fut.set_result(None)

    async def _call(self, shard: int, method: str, *args: Any) -> Any:
        fut = self._replaced.get(shard)
        if fut is None or fut.done():
            fut = self._replaced[shard] = asyncio.get_running_loop().create_future()
        call = asyncio.ensure_future(self.calls[shard].call(method, *args))
        await asyncio.wait((call, fut), return_when=asyncio.FIRST_COMPLETED)
        if not call.done():
            call.cancel()
            raise RuntimeError(f"dispatcher of shard {shard} replaced during the call")
        return call.result()

    def close(self) -> None:
        for c in self.calls:
            c.close()

    async def put_blobs(self, shard: int, items: list[tuple]) -> Any:
        return await self._call(shard, "put_blobs", items)

    async def has_data(self, shard: int, data_ids: list[str]) -> list[bool]:
        return await self._call(shard, "has_data", data_ids)

    async def requests_in_use(self, shard: int, request_ids: list[str]) -> list[bool]:
        return await self._call(shard, "requests_in_use", request_ids)

    async def trigger_conflicts(self, shard: int, items: list[tuple]) -> list[str | None]:
        return await self._call(shard, "trigger_conflicts", items)

    async def ingest(self, shard: int, items: list[tuple]) -> list[Any]:
        return await self._call(shard, "ingest", items)

    async def request_control(self, shard: int, ops: list[tuple[str, str]]) -> list[Any]:
        return await self._call(shard, "request_control", ops)

    async def topic_append(self, shard: int, items: list[tuple]) -> int:
        # in inline-sized chunks: a batch of a few hundred 1 KB messages would otherwise go through plasma
        return await self._call(shard, "topic_append", *chunked(pack_batch(items)))


@ray.remote(num_cpus=0)
class ConnectionNode:
    """The MQTT node of one Ray node.

    Args:
        config: the loaded :class:`fanout.config.Config`.
        node_id: this node's fanout id (short, sent with every event batch).
        host: listener address.
        port: listener port (0 = any free port; :meth:`ready` reports the real one).
        dispatchers: dispatcher handles, index = shard.
        reuse_port: bind with SO_REUSEPORT (``mqtt.listeners_per_node`` > 1: several listeners of one
            machine share the port and the kernel spreads connections over them).
    """

    def __init__(self, config: Any, node_id: str, host: str, port: int, dispatchers: list[Any],
                 reuse_port: bool = False) -> None:
        fanout_log.ensure_configured()
        unwrap_private_methods(self)  # the actor's own hot calls skip Ray's tracing shim (actors.untraced)
        gc.set_threshold(*GC_THRESHOLDS)
        self.config = config
        self.node_id = node_id
        self.host = host
        self._port = port
        self._reuse_port = reuse_port
        self._dispatchers = list(dispatchers)
        self._tick_s = config.fanout.tick_ms / 1000.0
        self._link = _DispatcherLink(config, self._dispatchers)
        self.edge = NodeCore(config, node_id, self._link, on_pending=self._schedule_flush, hold_connacks=True)
        self.server: Any = None
        self._peers: dict[str, Any] = {}
        self._peer_calls: dict[str, channels.DirectCalls] = {}  # peer node id -> its forward channel
        # the dispatchers' deliver calls and the peers' forwards come over a direct channel (actors.channels)
        self._channel = channels.ServedChannel(config, node_service(node_id),
                                               {m: plain(self, m) for m in ("deliver", "forward")})
        self._events_busy: set[int] = set()
        self._forward_busy: set[str] = set()
        self._incarnations: dict[int, str] = {}
        self._ingest_task: asyncio.Task | None = None
        self._flush_handle: asyncio.Handle | None = None
        self._flush_at = 0.0  # loop time the scheduled flush runs at
        self._fanout_sys: dict[str, Any] = {}
        self._stopping = False
        self._retained_writes: RetainedWrites | None = None
        self._deliver_s = 0.0
        self._deliver_calls = 0
        self._event_calls = 0
        self._lag_max_s = 0.0
        self._loop = asyncio.get_event_loop()
        self._start_task = self._loop.create_task(self._start())
        self._route_task: asyncio.Task | None = None

    async def _start(self) -> None:
        from fanout.config import listener_settings, mqtt_settings
        from fanout.mqtt.aio import MQTTServer

        listeners = listener_settings(self.config)
        if listeners.enabled and self._port != self.config.mqtt.port:
            # another Ray node of this machine (tests) moved off the configured port: the configured
            # TLS/WebSocket ports belong to the node that holds the configured MQTT port
            log.warning("extra listeners off on this node: it does not hold mqtt.port", node_id=self.node_id,
                        port=self._port)
            listeners = None
        server = MQTTServer(mqtt_settings(self.config), host=self.host, port=self._port, hooks=self.edge,
                            reuse_port=self._reuse_port, listeners=listeners)
        self.edge.attach(server.broker)
        server.broker.sys.add_source(lambda: dict(self._fanout_sys))
        server.broker.sys.add_source(self.edge.appends.sys_values)  # this node's durable-topic appends
        server.broker.sys.add_source(self.edge.groups.sys_values)  # its consumer-group members (fanout.node.topic_groups)
        self._restore_retained(server.broker.retained)
        await server.start()  # RuntimeError naming host:port when the bind fails
        self.server = server
        self._route_task = self._loop.create_task(self._route_loop())
        log.info("connection node ready", node_id=self.node_id, host=self.host, port=server.port, pid=os.getpid(),
                 extra_listeners=server.extra_urls, native=native.STATUS)

    def _restore_retained(self, store: Any) -> None:
        """Load the retained messages every node persisted (see :mod:`storage.retained`), then track changes."""
        from storage.retained import RetainedFile, load_retained, retained_dir

        data_dir = self.config.storage.data_dir
        restored = load_retained(data_dir)
        for topic, (payload, qos) in restored.items():
            store.set(topic, payload, qos)
        store.track_changes()
        self._retained_writes = RetainedWrites(store, RetainedFile(retained_dir(data_dir) / f"{self.node_id}.lmdb"),
                                               self.node_id)
        if restored:
            log.info("retained messages restored", node_id=self.node_id, topics=len(restored))

    async def _persist_retained(self) -> None:
        """Write the retained changes since the last call (one fsynced transaction, off the event loop; after a
        write still running, also when its caller was cancelled: see fanout.node.retained_writes)."""
        if self._retained_writes is not None:
            await self._retained_writes.persist()

    # -- lifecycle -------------------------------------------------------------------------------------

    async def ready(self) -> dict[str, Any]:
        """Wait until the listener accepts connections.

        Returns:
            ``{node_id, host, port, ray_node_id, urls}`` with the real port; ``urls`` lists the extra
            listeners (``mqtts://H:P``, ``ws://H:P/mqtt``, ``wss://H:P/mqtt``).

        Raises:
            RuntimeError: the address cannot be bound; ConfigError: e.g. a non-loopback host without users.
        """
        try:
            await asyncio.shield(self._start_task)
        except Exception as exc:
            log.error("connection node failed to start", node_id=self.node_id, host=self.host, port=self._port,
                      error=str(exc))
            raise
        return {"node_id": self.node_id, "host": self.host, "port": self.server.port,
                "ray_node_id": ray.get_runtime_context().get_node_id(), "urls": self.server.extra_urls}

    async def reload_tls(self) -> bool:
        """Reload the TLS certificate files (the driver forwards its SIGHUP here; actors have no signal
        handlers). Open connections stay; returns False when TLS is off or the files failed to load."""
        return self.server.reload_tls() if self.server is not None else False

    async def channel_address(self) -> tuple[str, int, str, bool]:
        """Where this node's direct channel listens (``actors.channels``)."""
        return await self._channel.address()

    async def check_health(self) -> None:
        """Raises if the listener failed; returning proves the event loop runs."""
        if self._start_task.done() and self._start_task.exception() is not None:
            raise self._start_task.exception()  # type: ignore[misc]

    async def drain(self, timeout_s: float = 5.0) -> dict[str, Any]:
        """Stop accepting and close every connection gracefully (wills are not published)."""
        self._stopping = True
        if self._route_task is not None:
            self._route_task.cancel()
        if self.server is not None:
            await self.server.stop(drain=True, timeout=timeout_s)
        await self._persist_retained()
        await self._channel.close()
        self._link.close()
        return self.edge.stats()

    async def set_peers(self, peers: dict[str, Any]) -> None:
        """The other connection nodes (``{node_id: handle}``)."""
        self._peers = {n: h for n, h in peers.items() if n != self.node_id}
        self._peer_calls = channels.rewire(self._peer_calls, self._peers,
                                           lambda n, h: channels.DirectCalls(self.config, h, node_service(n)))
        self.edge.routes.set_peers(self._peers)

    # -- calls from dispatchers -------------------------------------------------------------------------------

    async def deliver(self, sends: list[tuple] | bytes, payloads: dict[str, bytes] | None = None,
                      kicks: list[tuple] | None = None, props: tuple | None = None) -> list[tuple]:
        """Deliver a dispatcher's batch; returns the :class:`fanout.records.DeliveryFailure` tuples.

        ``sends`` may be ``pack_batch(DeliverBatch)`` (what dispatchers send).
        """
        groups = None
        if isinstance(sends, bytes):
            sends, payloads, kicks, props, *groups_field = unpack_batch(sends)
            groups = groups_field[0] if groups_field else None  # consumer-group sends (fanout.topics.groups_records)
        payloads = payloads or {}
        kicks = kicks or []
        started = time.perf_counter()
        if len(sends) <= DELIVER_CHUNK or self.server is None:
            failures = self.edge.apply_deliveries(sends, payloads, kicks, props)
        else:  # the first PUBLISHes reach their sockets before the rest of the batch is encoded
            failures = self.edge.apply_deliveries(sends[:DELIVER_CHUNK], payloads, kicks, props)
            for i in range(DELIVER_CHUNK, len(sends), DELIVER_CHUNK):
                self.server.flush_now()
                failures += self.edge.apply_deliveries(sends[i:i + DELIVER_CHUNK], payloads, (), props)
        if groups:
            self.edge.deliver_groups(groups)
        self._deliver_s += time.perf_counter() - started
        self._deliver_calls += 1
        return failures

    async def resync(self, shard: int) -> int:
        """A dispatcher restarted: resend the connections this node holds for its shard.

        Returns:
            The number of connections resent.
        """
        n = len(self.edge.sync_events(shard))
        self._schedule_flush()
        return n

    async def set_dispatcher(self, shard: int, handle: Any) -> int:
        """Failover: ``shard`` has a new primary. Calls to the old one fail now (their tickets are rejected and
        resent by the platform) and this node resends its pending events (its connections of the shard).

        Returns:
            The number of connections resent.
        """
        self._dispatchers[shard] = handle
        self._link.replace(shard, handle)
        self._events_busy.discard(shard)
        self._incarnations.pop(shard, None)
        n = len(self.edge.sync_events(shard))
        self._schedule_flush()
        log.warning("shard primary replaced, pending events resent", shard=shard, connections=n)
        return n

    async def kick(self, client_ids: list[str]) -> int:
        """Close the live connections of these client ids (any generation)."""
        return self.edge.kick([Kick.build(cid, None) for cid in client_ids])

    # -- calls from peers and the controller --------------------------------------------------------------------

    async def update_routes(self, node_id: str, added: list[str], removed: list[str], reset: bool,
                            groups: dict[str, int] | None = None) -> None:
        """A peer's filter announcement (``groups``: its whole MQTT 5 shared-group table, None = unchanged)."""
        self.edge.routes.update(node_id, added, removed, reset, groups)

    async def forward(self, node_id: str, messages: list[tuple]) -> int:
        """Publishes from a peer's clients (:class:`fanout.records.Forward` tuples), delivered locally only."""
        if self.server is None:
            return 0
        return self.edge.apply_forwards(unpack_batch(messages))

    async def peer_down(self, node_id: str) -> None:
        """Forget a dead peer's routes."""
        self._peers.pop(node_id, None)
        calls = self._peer_calls.pop(node_id, None)
        if calls is not None:
            calls.close()
        self.edge.routes.remove_node(node_id)

    async def set_sys(self, values: dict[str, Any]) -> None:
        """Cluster-wide ``$SYS/fanout/...`` values, published with this node's ``$SYS`` tree."""
        self._fanout_sys = dict(values)

    async def sys_snapshot(self) -> dict[str, Any]:
        """This node's full ``$SYS`` snapshot ``{topic: value}``."""
        if self.server is None:
            return {}
        return self.server.broker.sys.snapshot(int(time.monotonic() * 1000))

    async def stats(self) -> dict[str, Any]:
        """Node counters for ``fanout status`` (``loop_lag_ms_max``: worst event-loop stall since the last call)."""
        port = self.server.port if self.server is not None else self._port
        lag, self._lag_max_s = self._lag_max_s, 0.0
        return {"node_id": self.node_id, "host": self.host, "port": port, **self.edge.stats(),
                "auth_failures": self.server.acl.auth_failures if self.server is not None else 0,
                **self._connack_holds(),
                "deliver_calls": self._deliver_calls, "event_calls": self._event_calls,
                "deliver_ms_avg": round(1000 * self._deliver_s / max(1, self._deliver_calls), 2),
                "loop_lag_ms_max": round(1000 * lag, 1),  # since the previous stats() call
                "channel": self._channel.stats(),
                "channel_fallbacks": sum(c.fallbacks for c in (*self._link.calls, *self._peer_calls.values()))}

    def _connack_holds(self) -> dict[str, int]:
        """Vehicle CONNACKs waiting for their registration now, and those the 5 s bound let out unregistered
        (non-zero means a dispatcher did not answer: see fanout.mqtt.connack_hold)."""
        holds = self.server.broker.state.holds if self.server is not None else None
        return {"connacks_held": len(holds) if holds is not None else 0,
                "connacks_released_late": holds.released_late if holds is not None else 0}

    async def generation_of(self, client_id: str) -> int | None:
        return self.edge.generation_of(client_id)

    # -- shipping batches -------------------------------------------------------------------------------------

    def _schedule_flush(self, delay_s: float | None = None) -> None:
        """Flush after ``delay_s`` (default: one tick); an earlier request replaces a later one, so new
        work (an ingest ticket, a forward) never waits behind an events wait."""
        if self._stopping:
            return
        delay = self._tick_s if delay_s is None else delay_s
        at = self._loop.time() + delay
        if self._flush_handle is not None:
            if self._flush_at <= at:
                return
            self._flush_handle.cancel()
        self._flush_at = at
        if delay > 0:
            self._flush_handle = self._loop.call_later(delay, self._flush)
        else:
            self._flush_handle = self._loop.call_soon(self._flush)

    def _flush(self) -> None:
        self._flush_handle = None
        edge = self.edge
        loop = self._loop
        now = loop.time()
        wait = edge.events_wait(now)
        if wait == 0.0:
            for shard, events in edge.take_events(self._events_busy, now).items():
                self._events_busy.add(shard)
                self._event_calls += 1
                loop.create_task(self._send_events(shard, events))
        elif wait is not None:
            self._schedule_flush(wait)  # not worth a call yet: come back when they are due
        if edge.has_tickets() and (self._ingest_task is None or self._ingest_task.done()):
            self._ingest_task = loop.create_task(self._run_ingest())
        if edge.appends.has_work():  # one topic_append call per shard in flight (fanout.node.topic_appends)
            for batch in edge.appends.take():
                loop.create_task(self._run_append(batch))
        if edge.routes.has_forwards():
            for node, messages in edge.routes.take_forwards(self._forward_busy).items():
                calls = self._peer_calls.get(node)
                if calls is not None:
                    self._forward_busy.add(node)
                    loop.create_task(self._send_forwards(node, calls, messages))

    async def _send_events(self, shard: int, events: list[tuple]) -> None:
        try:
            incarnation = await self._link.calls[shard].call("events", self.node_id, pack_batch(events))
            previous = self._incarnations.get(shard)
            self._incarnations[shard] = incarnation
            if previous is not None and previous != incarnation:
                n = len(self.edge.sync_events(shard))
                log.warning("dispatcher restarted, resending connections", shard=shard, connections=n)
        except Exception as exc:
            # Beyond Ray's retries (dispatcher gone for good): the batch is lost; resend what we know.
            log.error("events call failed", shard=shard, events=len(events), error=str(exc)[:300])
            self._incarnations.pop(shard, None)
            self.edge.sync_events(shard)
        finally:
            # Registered (or the dispatcher is gone: the sync resends them): the CONNACKs waiting for
            # this call go out either way (fanout.mqtt.connack_hold).
            self.edge.events_done(shard)
            self._events_busy.discard(shard)
            if self.edge.has_events():
                self._schedule_flush()

    async def _run_ingest(self) -> None:
        try:
            await self.edge.process_ingest()
        except Exception:
            log.exception("ingest round failed", node_id=self.node_id)

    async def _run_append(self, batch: Any) -> None:
        try:
            await self.edge.append(batch)
        except Exception:
            log.exception("durable topic append round failed", node_id=self.node_id, shard=batch.shard)
        finally:
            if self.edge.appends.has_work():
                self._schedule_flush(0.0)  # what queued during the call is the next batch already: no tick wait

    async def set_topics(self, specs: list[Any]) -> bool:
        """The cluster's durable topics (``storage.topics.TopicSpec``), pushed by the controller."""
        changed = self.edge.set_durable_topics(specs)
        if changed:
            log.info("durable topics updated", node_id=self.node_id, topics=sorted(s.name for s in specs))
        return changed

    async def _send_forwards(self, node: str, calls: channels.DirectCalls, messages: list[tuple]) -> None:
        try:
            # packed: Ray's msgpack would turn the MQTT 5 Properties (a NamedTuple) into a plain list
            await calls.call("forward", self.node_id, pack_batch(messages))
        except Exception as exc:
            log.warning("forward to peer failed", peer=node, messages=len(messages), error=str(exc)[:200])
        finally:
            self._forward_busy.discard(node)
            if self.edge.routes.has_forwards():
                self._schedule_flush()

    async def _route_loop(self) -> None:
        while not self._stopping:
            before = time.monotonic()
            await asyncio.sleep(ROUTE_PERIOD_S)
            lag = time.monotonic() - before - ROUTE_PERIOD_S  # event-loop lag, for stats
            self._lag_max_s = max(self._lag_max_s, lag)
            await self._persist_retained()
            try:
                ann = self.edge.route_announcement(int(time.monotonic() * 1000))
                if ann is not None:
                    for handle in self._peers.values():
                        handle.update_routes.remote(self.node_id, *ann)
            except Exception:
                log.exception("route announcement failed", node_id=self.node_id)


__all__ = ["ConnectionNode"]
