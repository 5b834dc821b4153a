"""The cluster's hot calls over direct channels (actors.channels) on one local Ray: ingest, events and
deliveries take the channels (Ray calls only as fallback), the same traffic works with
``cluster.direct_channels = false``, and a restarted dispatcher is reached again over a new channel."""
from __future__ import annotations

import asyncio
import contextlib

import pytest
import ray

from .fanout_harness import Vehicle, fanout_config, publish_batch, running_cluster, wait_until


def _handles(cluster) -> dict:
    return ray.get(cluster.controller.handles.remote(), timeout=30)


def _deliver_round(cluster, prefix: str, request_id: str) -> None:
    vins = [f"{prefix}{i:03d}" for i in range(6)]
    cars = [Vehicle(cluster.port, vin) for vin in vins]
    try:
        publish_batch(cluster.port, vins, request_id, data_id=f"{request_id}-blob", blob=b"payload")
        for car in cars:
            msg = car.next_message(20)
            assert msg.topic == f"agent/{car.client_id}/proxy/request/{request_id}"
        wait_until(lambda: cluster.inspect("request", request_id)["by_status"] == {"delivered": 6}, 20,
                   f"{request_id} delivered")
    finally:
        for car in cars:
            car.close()


@pytest.mark.parametrize("direct,tls", [(True, "auto"), (True, "on"), (False, "auto")],
                         ids=["channels", "channels-tls", "ray-calls"])
def test_ingest_events_and_deliveries_with_and_without_channels(ray_local, tmp_path, direct, tls):
    cfg = fanout_config(tmp_path).replace("cluster", direct_channels=direct, channel_tls=tls)
    with running_cluster(cfg) as cluster:
        _deliver_round(cluster, "CH" if direct else "RC", "ch-1")
        h = _handles(cluster)
        shards = ray.get([d.stats.remote() for d in h["dispatchers"]], timeout=30)
        nodes = [ray.get(n.stats.remote(), timeout=30) for n in h["nodes"].values()]
        if direct:
            # events, ingest and PUBACKs reached the dispatchers over their channels, deliveries the node over its
            assert sum(s["channel"]["requests"] for s in shards) > 0
            assert all(s["channel"]["refused"] == 0 for s in shards)
            assert nodes[0]["channel"]["requests"] > 0
            assert nodes[0]["channel_fallbacks"] == 0 and all(s["channel_fallbacks"] == 0 for s in shards)
            # "auto" on 127.0.0.1: plain TCP (the channels stay on this machine); "on": TLS, said by each callee
            callees = [*h["dispatchers"], *h["nodes"].values(), *[r for rs in h["replicas"] for r in rs.values()]]
            addresses = ray.get([c.channel_address.remote() for c in callees], timeout=30)
            assert [a[3] for a in addresses] == [tls == "on"] * len(callees), addresses
        else:
            assert all(s["channel"] is None for s in shards) and nodes[0]["channel"] is None


def test_a_restarted_dispatcher_is_reached_over_its_new_channel(ray_local, tmp_path):
    with running_cluster(fanout_config(tmp_path)) as cluster:
        _deliver_round(cluster, "RS", "rs-1")
        h = _handles(cluster)
        d0 = h["dispatchers"][0]
        before = ray.get(d0.channel_address.remote(), timeout=30)
        ray.kill(d0, no_restart=False)  # Ray restarts it (max_restarts=-1): a new process on a new port
        wait_until(lambda: ray.get(d0.channel_address.remote(), timeout=30) != before, 60, "restarted dispatcher")
        _deliver_round(cluster, "RT", "rs-2")


class _EchoCallee:
    """A callee with a direct channel that a test can stop while its actor stays up."""

    def __init__(self, config) -> None:
        from actors.channels import ServedChannel

        self.channel = ServedChannel(config, "echo/1", {"echo": self.echo})

    async def echo(self, x):
        return x

    async def channel_address(self):
        return await self.channel.address()

    async def stop_channel(self) -> None:
        await self.channel.close()

    async def channel_stats(self):
        return self.channel.stats()


_Echo = ray.remote(num_cpus=0)(_EchoCallee)


@contextlib.asynccontextmanager
async def _calls_to(actor_class, tmp_path):
    """A callee actor of ``actor_class`` and the driver's DirectCalls to it; both gone at the end."""
    from actors import channels

    cfg = fanout_config(tmp_path)
    callee = actor_class.remote(cfg)
    calls = channels.DirectCalls(cfg, callee, "echo/1")
    try:
        yield callee, calls
    finally:
        calls.close()
        ray.kill(callee)


async def test_calls_fall_back_to_ray_when_the_channel_breaks_and_keep_their_order(ray_local, tmp_path):
    async with _calls_to(_Echo, tmp_path) as (callee, calls):
        assert await calls.call("echo", 1) == 1
        assert (await callee.channel_stats.remote())["requests"] == 1 and calls.fallbacks == 0
        await callee.stop_channel.remote()  # the connection breaks; the actor lives on
        got = await asyncio.gather(*(calls.call("echo", i) for i in range(2, 40)))
        assert got == list(range(2, 40))  # every call answered, over Ray
        assert calls.fallbacks >= 1 and not calls.client.connected
        assert await calls.call("echo", "again") == "again"


class _ElsewhereCallee(_EchoCallee):
    """A callee whose channel listens on loopback of ANOTHER machine (what the default channel_host of 127.0.0.1
    gives on a cluster spanning machines): a caller here must not connect to its own loopback."""

    async def channel_address(self):
        host, port, _machine = await self.channel.address()
        return host, port, "192.0.2.7"  # TEST-NET-1: never contacted, only compared


_Elsewhere = ray.remote(num_cpus=0)(_ElsewhereCallee)


async def test_a_loopback_channel_on_another_machine_is_not_dialled_calls_go_over_ray(ray_local, tmp_path):
    async with _calls_to(_Elsewhere, tmp_path) as (callee, calls):
        assert [await calls.call("echo", i) for i in range(3)] == [0, 1, 2]
        assert calls.fallbacks == 3 and calls.client.connects == 0
        assert (await callee.channel_stats.remote())["requests"] == 0
