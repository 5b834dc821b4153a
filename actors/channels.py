"""Ray glue of the direct channels (:mod:`fanout.channel`): the cluster's secret, the listen address, a client.

- The secret is 32 random bytes kept in the GCS key-value store of the Ray cluster (namespace
  :data:`actors.names.NAMESPACE`): the first actor that asks creates it (``overwrite=False``: concurrent
  first askers end up with the same value), every later one reads it; it lives as long as the Ray cluster,
  and a restarted actor reads the same one. Reaching the GCS already takes the cluster's Ray token.
- The callee starts a :class:`fanout.channel.ChannelServer` on ``cluster.channel_host`` (``node``: the Ray
  node's IP, for clusters spanning machines) port 0, and answers ``channel_address()`` over Ray; the caller's
  :class:`fanout.channel.ChannelClient` resolves the address through that Ray call at each (re)connect, so a
  restarted callee (new process, new port) is found again.
- ``cluster.direct_channels = false`` keeps every call on Ray (the A/B switch of the benchmarks).
"""
from __future__ import annotations

import secrets
from typing import Any

from fanout.channel import ChannelClient

from .names import NAMESPACE

_SECRET_KEY = b"channel-secret"
_secret: bytes | None = None


def channel_secret() -> bytes:
    """The Ray cluster's channel secret (created on first use). Blocking: one GCS call, then cached."""
    global _secret
    if _secret is None:
        from ray.experimental import internal_kv

        internal_kv._internal_kv_put(_SECRET_KEY, secrets.token_bytes(32), overwrite=False, namespace=NAMESPACE)
        value = internal_kv._internal_kv_get(_SECRET_KEY, namespace=NAMESPACE)
        if not value or len(value) < 32:
            raise RuntimeError("the cluster's channel secret could not be read from the GCS")
        _secret = bytes(value)
    return _secret


def channels_enabled(config: Any) -> bool:
    return bool(config.cluster.direct_channels)


def listen_host(config: Any) -> str:
    host = config.cluster.channel_host
    if host == "node":
        import ray

        return ray.util.get_node_ip_address()
    return host


def client_for(config: Any, service: str, handle: Any) -> ChannelClient:
    """A client of the channel ``service`` served by the actor ``handle`` (resolved via ``channel_address``)."""

    async def resolve() -> tuple[str, int]:
        host, port = await handle.channel_address.remote()
        return host, port

    return ChannelClient(channel_secret(), service, resolve, max_frame=config.cluster.channel_max_frame_bytes)


__all__ = ["channel_secret", "channels_enabled", "listen_host", "client_for"]
