"""The issue's attacks against a running ``fanout broker`` (subprocess, loopback, users configured), failing safe:
an anonymous client resuming an admin's session, a connect storm with a vehicle's client id, and the
deny-rule leak to wildcard subscribers."""
from __future__ import annotations

import contextlib
import time
from pathlib import Path
from typing import Iterator

import pytest

from fanout.mqtt.auth import hash_password
from fanout.mqtt.packets import Puback, Publish, Suback, Subscribe
from tests.integration.conftest import RawClient, cli_broker, url_port

VIN = "WVWSEC0000000001"
USERS = {"admin": ("admin-pw", "admin"), "fleet": ("fleet-pw", "vehicle"), "alice": ("alice-pw", "client")}


def config_text() -> str:
    users = "".join(f'[users.{n}]\npassword_hash = "{hash_password(pw, iterations=1000)}"\nrole = "{role}"\n'
                    for n, (pw, role) in USERS.items())
    return ('[mqtt]\ntakeover_limit = 3\n' + users
            + '[[acl]]\naction = "subscribe"\ntopic = "test/nosubscribe"\nallow = false\n')


@pytest.fixture(scope="module")
def port(tmp_path_factory) -> Iterator[int]:
    path: Path = tmp_path_factory.mktemp("sec") / "fanout.toml"
    path.write_text(config_text())
    with cli_broker("--config", str(path)) as (_proc, url):
        yield url_port(url)


@contextlib.contextmanager
def client(port: int, cid: str, user: str | None = None, clean: bool = True, expect: int = 0) -> Iterator[RawClient]:
    c = RawClient(port)
    try:
        pw = USERS[user][0].encode() if user else None
        ack = c.connect(cid, clean, username=user, password=pw)
        assert ack.return_code == expect, (cid, user, ack)
        yield c
    finally:
        c.close()


def subscribe(c: RawClient, *filters: tuple[str, int], pid: int = 1) -> tuple[int, ...]:
    c.send(Subscribe(pid, tuple(filters)))
    ack = c.recv()
    assert isinstance(ack, Suback), ack
    return ack.return_codes


def test_anonymous_cannot_resume_an_admins_session(port):
    with client(port, "ops-console", "admin", clean=False) as admin:
        subscribe(admin, ("$SDV-FANOUT/#", 1))
    with client(port, "pub", "admin") as pub:
        pub.send(Publish("$SDV-FANOUT/data/blob-1", b"secret-blob", 1, False, False, 1))
        assert isinstance(pub.recv(), Puback)
    for clean in (False, True):
        with client(port, "ops-console", None, clean=clean, expect=2) as thief:
            assert thief.is_closed()
    with client(port, "ops-console", "alice", clean=False, expect=2):
        pass
    with client(port, "ops-console", "admin", clean=False) as admin:  # intact, with what it queued
        got = admin.recv()
        assert isinstance(got, Publish) and got.payload == b"secret-blob"


def test_connect_storm_with_a_vins_id_does_not_lock_the_vehicle_out(port):
    with client(port, VIN, "fleet") as car:
        subscribe(car, (f"agent/{VIN}/#", 1))
        for _ in range(11):
            with client(port, VIN, None, expect=2):
                pass
        with client(port, VIN, "alice", expect=2):
            pass
        with client(port, "pub", "admin") as pub:
            pub.send(Publish(f"agent/{VIN}/proxy/request/r1", b"ota", 1, False, False, 1))
            got = car.recv()
            assert isinstance(got, Publish) and got.topic == f"agent/{VIN}/proxy/request/r1"
    for _ in range(2):  # and the vehicle itself reconnects as usual
        with client(port, VIN, "fleet"):
            pass


def test_deny_rule_is_held_for_wildcard_subscribers(port):
    with client(port, "w1", None) as hash_sub, client(port, "w2", "alice") as test_sub:
        assert subscribe(hash_sub, ("#", 1)) == (1,)
        assert subscribe(test_sub, ("test/#", 1)) == (1,)
        assert subscribe(test_sub, ("test/nosubscribe", 1), pid=2) == (0x80,)
        with client(port, "pub2", "alice") as pub:
            pub.send(Publish("test/nosubscribe", b"hidden", 1, True, False, 1),
                     Publish("test/visible", b"shown", 1, False, False, 2))
            time.sleep(0.2)
        for c in (hash_sub, test_sub):
            got = [p for p in c.recv_n(1) if isinstance(p, Publish)]
            assert [(p.topic, p.payload) for p in got] == [("test/visible", b"shown")]
            c.expect_nothing(0.3)
        with client(port, "late", None) as late:  # nor by retained replay
            subscribe(late, ("test/#", 1))
            late.expect_nothing(0.3)
