"""Ray glue of the direct channels (:mod:`fanout.channel`): the cluster's secret, the listen address, a client.

- The secret is 32 random bytes kept in the GCS key-value store of the Ray cluster (namespace
  :data:`actors.names.NAMESPACE`): the first actor that asks creates it (``overwrite=False``: concurrent
  first askers end up with the same value), every later one reads it; it lives as long as the Ray cluster,
  and a restarted actor reads the same one. Reaching the GCS already takes the cluster's Ray token.
- The callee starts a :class:`fanout.channel.ChannelServer` on ``cluster.channel_host`` (``node``: the Ray
  node's IP, for clusters spanning machines) port 0, and answers ``channel_address()`` over Ray; the caller's
  :class:`fanout.channel.ChannelClient` resolves the address through that Ray call at each (re)connect, so a
  restarted callee (new process, new port) is found again.
- TLS (``cluster.channel_tls``; ``auto``: when the listen address is not a loopback one, i.e. the channels
  cross machines): one key and self-signed certificate per Ray cluster, kept next to the secret and made the
  same way (:mod:`fanout.channel.tls`). The callee says in ``channel_address()`` whether it speaks TLS, so
  callers follow it whatever their own machine's address.
- ``cluster.direct_channels = false`` keeps every call on Ray (the A/B switch of the benchmarks).
"""
from __future__ import annotations

import asyncio
import ipaddress
import secrets
import time
from typing import Any, Awaitable, Callable, Mapping

import structlog

from fanout.channel import ChannelClient, ChannelError, ChannelServer, tls

from .names import NAMESPACE

log = structlog.get_logger(__name__)
FALLBACK_LOG_INTERVAL_S = 5.0
# after a channel failure, calls go straight to Ray this long before the channel is tried again: a callee that
# is restarting (or whose channel cannot start) would otherwise cost a resolve + a failed connect per call
CHANNEL_RETRY_S = 1.0

_SECRET_KEY = b"channel-secret"
_IDENTITY_KEY = b"channel-tls-identity"
_secret: bytes | None = None
_identity: bytes | None = None
_client_tls: Any = None


def _cluster_value(key: bytes, make: Callable[[], bytes]) -> bytes | None:
    """The value of ``key`` in the Ray cluster's GCS, stored first if absent (``overwrite=False``: concurrent
    first askers all end up with the one value stored). Blocking."""
    from ray.experimental import internal_kv

    value = internal_kv._internal_kv_get(key, namespace=NAMESPACE)
    if not value:
        internal_kv._internal_kv_put(key, make(), overwrite=False, namespace=NAMESPACE)
        value = internal_kv._internal_kv_get(key, namespace=NAMESPACE)
    return bytes(value) if value else None


def channel_secret() -> bytes:
    """The Ray cluster's channel secret (created on first use). Blocking: one GCS call, then cached."""
    global _secret
    if _secret is None:
        value = _cluster_value(_SECRET_KEY, lambda: secrets.token_bytes(32))
        if not value or len(value) < 32:
            raise RuntimeError("the cluster's channel secret could not be read from the GCS")
        _secret = value
    return _secret


def channel_identity() -> bytes:
    """The Ray cluster's channel TLS key and certificate, PEM (created on first use). Blocking, then cached."""
    global _identity
    if _identity is None:
        value = _cluster_value(_IDENTITY_KEY, tls.new_identity)
        if not value:
            raise RuntimeError("the cluster's channel TLS identity could not be read from the GCS")
        _identity = value
    return _identity


def channel_tls(config: Any, host: str) -> bool:
    """Whether a channel listening on ``host`` speaks TLS (``cluster.channel_tls``)."""
    mode = config.cluster.channel_tls
    return mode == "on" or (mode == "auto" and not _is_loopback(host))


def _client_context() -> Any:
    global _client_tls
    if _client_tls is None:
        _client_tls = tls.client_context(channel_identity())
    return _client_tls


def channels_enabled(config: Any) -> bool:
    return bool(config.cluster.direct_channels)


def listen_host(config: Any) -> str:
    host = config.cluster.channel_host
    return _this_machine() if host == "node" else host


def _is_loopback(host: str) -> bool:
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:  # a host name
        return host == "localhost"


def _this_machine() -> str:
    import ray

    return ray.util.get_node_ip_address()


def client_for(config: Any, service: str, handle: Any) -> ChannelClient:
    """A client of the channel ``service`` served by the actor ``handle`` (resolved via ``channel_address``)."""

    async def resolve() -> tuple[Any, ...]:
        host, port, machine, *rest = await handle.channel_address.remote()
        if _is_loopback(host) and machine != _this_machine():
            # e.g. the default 127.0.0.1 on a cluster spanning machines: our own loopback is not the callee's
            raise ChannelError(f"channel {service} listens on {host} of machine {machine}, not this one "
                               f"({_this_machine()}): set cluster.channel_host = \"node\" on clusters spanning "
                               "machines; calls go over Ray meanwhile")
        if rest and rest[0]:  # the callee speaks TLS
            return host, port, await asyncio.get_running_loop().run_in_executor(None, _client_context)
        return host, port

    return ChannelClient(channel_secret(), service, resolve, max_frame=config.cluster.channel_max_frame_bytes)


class DirectCalls:
    """Calls to one actor over its direct channel; a call the channel cannot carry (callee restarting or gone,
    over ``max_frame``) is made as the Ray call it replaces, so the caller sees Ray's semantics then: retries of a
    restarting actor (``max_task_retries``), ``RayActorError`` for a dead one. Callees are idempotent under
    retries already (DESIGN: retried work must be idempotent), and a channel call that broke may have run.

    Args:
        config: the loaded config (``cluster.direct_channels``; off: every call is a Ray call).
        handle: the callee's actor handle.
        service: the callee's channel service name.
    """

    def __init__(self, config: Any, handle: Any, service: str) -> None:
        self.handle = handle
        self.service = service
        self.client = client_for(config, service, handle) if channels_enabled(config) else None
        self.fallbacks = 0  # calls made over Ray while channels are on
        self._logged = 0.0
        self._retry_at = 0.0
        self._on_ray = 0  # calls on Ray now

    async def call(self, method: str, *args: Any) -> Any:
        # While a call is on Ray, later calls go there too: one caller's calls keep their order (Ray starts an
        # actor's calls from one caller in submission order, the channel in arrival order, not the two together).
        if self.client is not None and not self._on_ray and (self.client.connected or
                                                              time.monotonic() >= self._retry_at):
            try:
                return await self.client.call(method, *args)
            except ChannelError as exc:
                self.fallbacks += 1
                now = time.monotonic()
                if not self.client.connected:
                    self._retry_at = now + CHANNEL_RETRY_S
                if now - self._logged > FALLBACK_LOG_INTERVAL_S:
                    self._logged = now
                    log.warning("direct channel call failed, made as a Ray call", service=self.service,
                                method=method, error=str(exc)[:200], fallbacks=self.fallbacks)
        elif self.client is not None:
            self.fallbacks += 1  # within CHANNEL_RETRY_S of a failure, or behind a call on Ray
        self._on_ray += 1
        try:
            return await getattr(self.handle, method).remote(*args)
        finally:
            self._on_ray -= 1

    def close(self) -> None:
        if self.client is not None:
            self.client.close()


class ServedChannel:
    """The callee's end: a :class:`fanout.channel.ChannelServer` started as a task (an actor's ``__init__``
    must not block), and its address for :func:`client_for`'s ``resolve``."""

    def __init__(self, config: Any, service: str, handlers: Mapping[str, Callable[..., Awaitable[Any]]]) -> None:
        self.service = service
        self.server: ChannelServer | None = None
        self._task = None
        if channels_enabled(config):
            self._task = asyncio.get_event_loop().create_task(self._start(config, handlers))

    async def _start(self, config: Any, handlers: Mapping[str, Callable[..., Awaitable[Any]]]) -> None:
        loop = asyncio.get_running_loop()
        secret = await loop.run_in_executor(None, channel_secret)
        host = listen_host(config)
        ctx = None
        if channel_tls(config, host):
            ctx = await loop.run_in_executor(None, lambda: tls.server_context(channel_identity()))
        server = ChannelServer(secret, self.service, handlers, max_frame=config.cluster.channel_max_frame_bytes,
                               ssl=ctx)
        await server.start(host, 0)
        self.server = server

    async def address(self) -> tuple[str, int, str, bool]:
        """``(host, port, machine, tls)``: where it listens, the Ray node IP of its machine (a loopback ``host``
        is reachable from that machine only) and whether it speaks TLS. Raises if channels are off or the
        server failed to start."""
        if self._task is None:
            raise RuntimeError(f"channel {self.service}: direct channels are off")
        await self._task
        return (*self.server.address, _this_machine(), self.server.ssl is not None)

    def stats(self) -> dict[str, int] | None:
        return self.server.figures() if self.server is not None else None

    async def close(self) -> None:
        if self.server is not None:
            await self.server.close()


def rewire(current: dict[str, Any], handles: Mapping[str, Any], make: Callable[[str, Any], Any]) -> dict[str, Any]:
    """The callers of ``handles`` (key -> actor handle): a caller in ``current`` whose actor is the same is kept
    (its open channel with it), any other is closed and made anew by ``make(key, handle)``; callers of keys
    no longer named are closed. Callers have ``handle`` and ``close()``."""
    out = {}
    for key, handle in handles.items():
        caller = current.get(key)
        if caller is not None and caller.handle._ray_actor_id == handle._ray_actor_id:
            out[key] = caller
            continue
        if caller is not None:
            caller.close()
        out[key] = make(key, handle)
    for key in set(current) - set(handles):
        current[key].close()
    return out


def dispatcher_service(shard: int) -> str:
    return f"dispatcher/{shard}"


def node_service(node_id: str) -> str:
    return f"node/{node_id}"


__all__ = ["rewire", "dispatcher_service", "node_service", "channel_secret", "channel_identity", "channel_tls",
           "channels_enabled", "listen_host", "client_for", "DirectCalls", "ServedChannel"]
