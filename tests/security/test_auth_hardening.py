"""Authentication hardening at the sans-I/O level (the deferred PBKDF2 is run by the test, like the pool would):
failed-login limits per address and overall, the bounded verification queue, answers from memory without a
thread hop, and the dummy hash for unknown users (timing)."""
from __future__ import annotations

import time

from fanout.config import UserConfig
from fanout.mqtt.auth import AccessControl, hash_password
from fanout.mqtt.packets import Connack, Connect
from fanout.mqtt.peer import Peer
from tests.unit.test_mqtt_broker import FakeClient, Net


def client_from(net: Net, host: str) -> FakeClient:
    from fanout.mqtt.codec import PacketReader
    c = FakeClient.__new__(FakeClient)
    c.net, c.reader, c.inbox, c.closed = net, PacketReader(), [], False
    c.conn = net.broker.connection_made(net.now, Peer(host, 40000))
    c.conn.transport = c
    return c


def make_net(**mqtt) -> tuple[Net, list]:
    calls: list = []
    users = {"u": UserConfig("u", hash_password("right", iterations=1000), "client")}
    net = Net(mqtt=mqtt, users=users, defer_auth=lambda conn, fn: calls.append((conn, fn)))
    return net, calls


def run_pending(net: Net, calls: list) -> None:
    while calls:
        conn, fn = calls.pop(0)
        net.broker.auth_done(conn, fn(), net.now)
    net.pump()


def attempt(net: Net, calls: list, host: str, password: bytes, cid: str = "c") -> Connack:
    c = client_from(net, host)
    c.send(Connect(cid, True, 60, "u", password))
    run_pending(net, calls)
    got = c.take()
    return got[0]


def test_failures_limited_per_address_then_overall_but_cached_logins_pass():
    net, calls = make_net(auth_fail_limit_per_host=3, auth_fail_limit_total=5)
    assert attempt(net, calls, "10.0.0.1", b"right").return_code == 0  # verified once: now cached
    for n in range(3):
        assert attempt(net, calls, "10.0.0.9", b"wrong%d" % n).return_code == 4
    assert attempt(net, calls, "10.0.0.9", b"wrong-x").return_code == 3  # this address is limited: no hash run
    assert attempt(net, calls, "10.0.0.9", b"right").return_code == 0  # a cache hit still proves the password
    for n in range(2):
        assert attempt(net, calls, f"10.0.1.{n}", b"bad%d" % n).return_code == 4
    assert attempt(net, calls, "10.0.2.1", b"bad-y").return_code == 3  # overall limit
    guard = net.acl.guard
    assert (guard.failures, guard.limited) == (5, 2)
    assert net.acl.pbkdf2_calls == 6  # 1 valid + 5 wrong: the limited ones cost nothing
    snap = net.broker.sys.snapshot(net.now)
    assert (snap["$SYS/broker/auth/failures"], snap["$SYS/broker/auth/limited"]) == (5, 2)
    net.advance(61_000)  # a new window
    assert attempt(net, calls, "10.0.2.1", b"bad-y").return_code == 4


def test_verification_queue_is_bounded():
    net, calls = make_net(auth_queue=2)
    clients = [client_from(net, f"10.1.0.{n}") for n in range(4)]
    for n, c in enumerate(clients):
        c.send(Connect(f"c{n}", True, 60, "u", b"guess%d" % n))
    net.pump()
    assert len(calls) == 2  # two admitted to the pool, the others refused at once
    assert [c.take() for c in clients[2:]] == [[Connack(False, 3)], [Connack(False, 3)]]
    assert net.acl.guard.queue_full == 2
    run_pending(net, calls)
    assert net.acl.guard.pending == 0


def test_unknown_user_costs_the_same_hash_as_a_known_one():
    users = {"alice": UserConfig("alice", hash_password("pw", iterations=60_000), "client")}
    ac = AccessControl(Net(users=users).settings, listener_is_loopback=True)

    def took(name: str, pw: bytes) -> float:
        t = time.perf_counter()
        assert ac.authenticate("c", name, pw) == 4
        return time.perf_counter() - t

    known = min(took("alice", b"wrong%d" % n) for n in range(3))
    unknown = min(took("nobody%d" % n, b"wrong") for n in range(3))
    assert 0.5 < unknown / known < 2.0, (known, unknown)
    # a repeated wrong password is answered from memory for both, so that does not tell them apart either
    assert ac.authenticate_cached("c", "alice", b"wrong2") == 4
    assert ac.authenticate_cached("c", "nobody2", b"wrong") == 4
    assert ac.authenticate_cached("c", "alice", b"new-guess") is None  # needs a PBKDF2 run
