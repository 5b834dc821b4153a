"""The client's state machine with an in-memory transport: order across random connection losses,
poison isolation, HOT/COLD switches (real LMDB outbox in tmp_path, no sockets)."""
from __future__ import annotations

import asyncio
import json
from collections import Counter
from itertools import count
from pathlib import Path
from typing import Any, Callable

import pytest

import fanout.client.pump as pump_mod
from fanout.client import FanoutClient, FanoutDeadLettered, FanoutRejected
from fanout.client.transport import ConnectFailed, PublishFailed


class FakeNet:
    """The 'broker': processes each connection's PUBLISHes in order, may drop connections."""

    def __init__(self) -> None:
        self.up = True
        self.delivered: list[tuple[str, bytes]] = []
        self.max_packet = 10**9
        self.refuse: dict[str, tuple[int, str]] = {}  # request id -> MQTT 5 negative PUBACK (code, reason)
        self.refuse_once: set[str] = set()  # request ids refused only the first time
        self.mqtt5 = True  # whether the 'broker' accepts an MQTT 5 CONNECT
        self.versions: list[bool] = []  # mqtt5 flag of each connection attempt
        self.drop_every = 0  # drop after every n-th processed message, if >= 2 triggers are unacknowledged
        self.processed = 0
        self.current: FakeConnection | None = None
        self.connections = 0

    def triggers(self) -> list[str]:
        return [json.loads(p)["request_id"] for t, p in self.delivered if t == "$SDV-FANOUT/trigger"]


NET = FakeNet()


class FakeConnection:
    def __init__(self, *, client_id: str, username: Any, password: Any, keepalive_s: int, on_ack: Callable[[int], None],
                 on_message: Callable[[str, bytes], None], on_lost: Callable[[Any, str], None],
                 mqtt5: bool = False) -> None:
        self._loop = asyncio.get_running_loop()
        self.mqtt5 = mqtt5
        self._on_ack, self._on_lost = on_ack, on_lost
        self._mids = count(1)
        self.pending = 0
        self.triggers = 0  # unacknowledged triggers: a lone (isolated) submission is never hit by a blip
        self.lost = False
        self.connected = False

    async def open(self, host: str, port: int, timeout_s: float) -> None:
        await asyncio.sleep(0)
        NET.versions.append(self.mqtt5)
        if not NET.up:
            raise ConnectFailed("refused")
        if self.mqtt5 and not NET.mqtt5:
            raise ConnectFailed("CONNACK refused: Unsupported protocol version", protocol_refused=True)
        self.connected = True
        NET.current = self
        NET.connections += 1

    def publish(self, topic: str, payload: bytes) -> int:
        if self.lost:
            raise PublishFailed("connection lost", connection_lost=True)
        mid = next(self._mids)
        self.pending += 1
        self.triggers += topic == "$SDV-FANOUT/trigger"
        self._loop.call_soon(self._process, mid, topic, payload)
        return mid

    def _process(self, mid: int, topic: str, payload: bytes) -> None:
        if self.lost:
            return
        self.pending -= 1
        if len(payload) > NET.max_packet:
            self._drop("closed by broker: packet too large")
            return
        rid = json.loads(payload).get("request_id") if topic == "$SDV-FANOUT/trigger" else None
        if self.mqtt5 and rid in NET.refuse:
            self.triggers -= 1
            code, reason = NET.refuse[rid]
            if rid in NET.refuse_once:
                del NET.refuse[rid]
            self._loop.call_soon(self._on_ack, mid, code, reason)
            return
        NET.delivered.append((topic, payload))
        NET.processed += 1
        if NET.drop_every and NET.processed % NET.drop_every == 0 and self.triggers >= 2:
            self._drop("network blip")  # delivered, PUBACK lost: QoS 1 redelivery follows
            return
        self._loop.call_soon(self._ack, mid, topic)

    def _ack(self, mid: int, topic: str) -> None:
        if not self.lost:
            self.triggers -= topic == "$SDV-FANOUT/trigger"
            self._on_ack(mid)

    def _drop(self, reason: str) -> None:
        if not self.lost:
            self.lost, self.connected = True, False
            self._loop.call_soon(self._on_lost, self, reason)

    def subscribe(self, topic: str) -> None:
        pass

    def misc(self) -> None:
        pass

    def abort(self, reason: str) -> None:
        self._drop(reason)

    async def close(self, timeout_s: float = 1.0) -> None:
        self._drop("closed")


@pytest.fixture(autouse=True)
def fake_net(monkeypatch: pytest.MonkeyPatch) -> FakeNet:
    global NET
    NET = FakeNet()
    monkeypatch.setattr(pump_mod, "BrokerConnection", FakeConnection)
    return NET


async def eventually(pred: Callable[[], bool], timeout: float = 5.0) -> bool:
    deadline = asyncio.get_running_loop().time() + timeout
    while not pred():
        if asyncio.get_running_loop().time() > deadline:
            return False
        await asyncio.sleep(0.005)
    return True


def make(tmp_path: Path, **kw: Any) -> FanoutClient:
    opts: dict[str, Any] = dict(outbox_dir=tmp_path / "ob", reconnect_min_s=0.001, reconnect_max_s=0.01, backoff_base_s=0.01,
                                backoff_max_s=0.05, connect_timeout_s=0.5)
    opts.update(kw)
    return FanoutClient(**opts)


async def test_connection_losses_keep_order_and_lose_nothing(tmp_path: Path, fake_net: FakeNet) -> None:
    """8 concurrent submitters (HOT ring, ring-full spill, COLD group commits) while the transport
    drops the connection every 23rd message: all delivered, first deliveries in ``seq`` order."""
    fake_net.drop_every = 23
    async with make(tmp_path, ring_size=16, max_inflight=12) as client:

        async def submitter(k: int) -> list[Any]:
            out = []
            for i in range(50):
                out.append(await client.submit([f"V{k}-{i}", f"W{k}-{i}"], b"blob" if i % 2 else b"other", request_id=f"r{k}-{i}"))
                if i % 5 == 0:
                    await asyncio.sleep(0)
            return out

        handles = [h for group in await asyncio.gather(*(submitter(k) for k in range(8))) for h in group]
        await asyncio.wait_for(asyncio.gather(*(h.acked() for h in handles)), 30)
        assert await client.drain(5)
        assert await eventually(lambda: client.mode == "hot")
        reasons = {r for _, r in client.mode_changes}
    ids = fake_net.triggers()
    expected = [h.request_id for h in sorted(handles, key=lambda h: h.seq)]
    assert list(dict.fromkeys(ids)) == expected  # nothing lost, first deliveries in submission order
    assert fake_net.connections > 3 and "ring_full" in reasons
    dups = sum(c - 1 for c in Counter(ids).values())
    assert dups <= 12 * fake_net.connections  # only what was in flight at a loss is sent again


async def test_poison_is_isolated_and_dead_lettered_without_charging_others(tmp_path: Path, fake_net: FakeNet) -> None:
    fake_net.max_packet = 1000
    async with make(tmp_path, max_attempts=3) as client:
        good = [await client.submit(["A"], b"ok", request_id=f"g{i}") for i in range(5)]
        poison = await client.submit(["A"], b"x" * 5000, request_id="poison")
        good += [await client.submit(["A"], b"ok", request_id=f"g{i}") for i in range(5, 10)]
        with pytest.raises(FanoutDeadLettered) as info:
            await asyncio.wait_for(poison.acked(), 10)
        assert info.value.attempts == 3 and "packet too large" in info.value.last_error
        await asyncio.wait_for(asyncio.gather(*(h.acked() for h in good)), 10)
        assert await client.drain(5)
        assert client._outbox is not None and client._outbox.retry == {}  # no innocent item was charged
        assert await eventually(lambda: client.mode == "hot")  # reconnected after the poison's last close
        st = client.status()
        assert (st.dead_letters, st.suspects, st.mode) == (1, 0, "hot")
    assert list(dict.fromkeys(fake_net.triggers())) == [f"g{i}" for i in range(10)]


async def test_outage_goes_cold_and_back_hot_only_when_drained(tmp_path: Path, fake_net: FakeNet) -> None:
    async with make(tmp_path) as client:
        assert client.mode == "hot"
        fake_net.up = False
        assert fake_net.current is not None
        fake_net.current.abort("broker gone")
        await asyncio.sleep(0.01)
        assert client.mode == "cold" and not client.status().connected
        h = await client.submit(["A"], b"p", request_id="during-outage")
        assert h.mode == "cold" and client.status().outbox_depth == 1
        await asyncio.sleep(0.05)
        assert client.mode == "cold" and client.status().retrying == 0  # disconnected time costs no attempts
        fake_net.up = True
        await asyncio.wait_for(h.acked(), 5)
        assert await client.drain(5) and client.mode == "hot"
        assert [m for m, _ in client.mode_changes][-3:] == ["hot", "cold", "hot"]


async def test_close_spills_unsent_hot_items_and_next_client_sends_them(tmp_path: Path, fake_net: FakeNet) -> None:
    client = make(tmp_path, close_timeout_s=0.05)
    await client.start()
    fake_net.up = False
    assert fake_net.current is not None
    fake_net.current.abort("gone")
    await asyncio.sleep(0.01)
    handles = [await client.submit(["A"], b"p", request_id=f"k{i}") for i in range(3)]
    await client.close()
    with pytest.raises(Exception) as info:
        await handles[0].acked()
    assert "stays in the outbox" in str(info.value)
    fake_net.up = True
    async with make(tmp_path) as again:
        assert await again.drain(5)
    assert fake_net.triggers() == ["k0", "k1", "k2"]


async def test_durability_always_never_goes_hot(tmp_path: Path, fake_net: FakeNet) -> None:
    async with make(tmp_path, durability="always") as client:
        hs = [await client.submit(["A"], b"p", request_id=f"a{i}") for i in range(20)]
        assert {h.mode for h in hs} == {"cold"}
        await asyncio.gather(*(h.acked() for h in hs))
        assert await client.drain(5) and client.mode == "cold" and client.status().outbox_depth == 0
    assert fake_net.triggers() == [f"a{i}" for i in range(20)]


@pytest.mark.parametrize("durability", ["always", "hybrid"])
async def test_cold_submit_cancelled_after_the_commit_is_still_delivered(tmp_path: Path, fake_net: FakeNet, durability: str) -> None:
    """Issue 12: a COLD ``submit`` whose caller is cancelled while its outbox commit is under way.
    The commit completes (the README says the submission is still delivered), so the pump must be
    told about it: it goes out, in its place, without any later ``submit`` waking the sender."""
    async with make(tmp_path, durability=durability, ring_size=1) as client:
        assert await eventually(lambda: fake_net.current is not None and client._conn is not None)
        await asyncio.sleep(0.05)  # the first refill after connecting has found the outbox empty
        handles: list[Any] = []

        async def caller() -> None:
            if durability == "hybrid":  # no await between the two: the first fills the ring, the second goes COLD
                handles.append(await client.submit(["A"], b"p", request_id="in-ring"))
            await client.submit(["A"], b"p", request_id="cancelled")

        task = asyncio.get_running_loop().create_task(caller())
        await asyncio.sleep(0)  # the second submit is now waiting for its group commit
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert client.mode == "cold"
        await asyncio.wait_for(asyncio.gather(*(h.acked() for h in handles)), 5)
        assert await eventually(lambda: "cancelled" in fake_net.triggers(), timeout=3), "left in the outbox"
        assert await client.drain(5) and client.status().outbox_depth == 0
        after = await client.submit(["A"], b"p", request_id="after")
        await asyncio.wait_for(after.acked(), 5)
    assert fake_net.triggers() == (["in-ring"] if handles else []) + ["cancelled", "after"]


@pytest.mark.parametrize("durability", ["always", "hybrid"])
@pytest.mark.parametrize("request_id", ["a/b", "a\tb", "r" * 129])
async def test_request_id_the_cluster_rejects_is_refused_and_nothing_is_queued(
        tmp_path: Path, fake_net: FakeNet, durability: str, request_id: str) -> None:
    """Issue 12: such an id was accepted, then the cluster's error closed the connection under every
    in-flight submission. Now ``submit`` raises naming it, and neither the ring nor the outbox holds it."""
    from fanout.client import SubmissionInvalid

    async with make(tmp_path, durability=durability) as client:
        with pytest.raises(SubmissionInvalid) as info:
            await client.submit(["A"], b"p", request_id=request_id)
        assert info.value.field == "request_id"
        st = client.status()
        assert (st.submitted, st.ring_depth, st.in_flight, st.outbox_depth) == (0, 0, 0, 0)
        ok = await client.submit(["A"], b"p", request_id="ok")
        await asyncio.wait_for(ok.acked(), 5)
    assert fake_net.triggers() == ["ok"] and fake_net.connections == 1


async def test_mqtt5_negative_puback_rejects_only_its_submission_and_keeps_the_connection(tmp_path: Path,
                                                                                           fake_net: FakeNet) -> None:
    fake_net.refuse["bad"] = (0x99, "invalid_trigger: ids[0]: not a VIN")
    async with make(tmp_path) as client:
        good1 = await client.submit(["V1"], b"blob", request_id="good1")
        bad = await client.submit(["V2"], b"blob", request_id="bad")
        good2 = await client.submit(["V3"], b"blob", request_id="good2")
        await asyncio.wait_for(asyncio.gather(good1.acked(), good2.acked()), 10)
        with pytest.raises(FanoutRejected) as info:
            await asyncio.wait_for(bad.acked(), 10)
        assert (info.value.error, info.value.field, info.value.reason) == ("invalid_trigger", "ids[0]", "not a VIN")
        assert info.value.detail["reason_code"] == 0x99 and info.value.attempts == 1
        assert fake_net.connections == 1, "a negative PUBACK does not cost the connection"
        assert sorted(fake_net.triggers()) == ["good1", "good2"]


async def test_a_server_without_mqtt5_gets_mqtt_3_1_1(tmp_path: Path, fake_net: FakeNet) -> None:
    fake_net.mqtt5 = False
    async with make(tmp_path) as client:
        h = await client.submit(["V1"], b"blob", request_id="r1")
        await asyncio.wait_for(h.acked(), 10)
    assert fake_net.versions == [True, False], "one MQTT 5 attempt, then 3.1.1 for good"


async def test_mqtt_version_pinned_to_3_1_1_never_tries_mqtt5(tmp_path: Path, fake_net: FakeNet) -> None:
    async with make(tmp_path, mqtt_version="3.1.1") as client:
        h = await client.submit(["V1"], b"blob", request_id="r1")
        await asyncio.wait_for(h.acked(), 10)
    assert fake_net.versions == [False]


async def test_mqtt5_unavailable_is_retried_not_dead_lettered(tmp_path: Path, fake_net: FakeNet) -> None:
    """PUBACK 0x80 "unavailable" (a dispatcher call failed): one attempt charged, then resent and acked."""
    fake_net.refuse["r1"] = (0x80, "unavailable: dispatcher call failed")
    fake_net.refuse_once.add("r1")
    async with make(tmp_path) as client:
        h = await client.submit(["V1"], b"blob", request_id="r1")
        await asyncio.wait_for(h.acked(), 10)
        assert fake_net.triggers() == ["r1"] and fake_net.connections == 1
        assert await client.dead_letters() == []
