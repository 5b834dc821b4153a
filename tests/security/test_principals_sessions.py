"""Trust model (b), (c) and the vehicle part of (a), at the sans-I/O level: the broker core in memory.

Users are configured, so this is not development mode: sessions are bound to the principal that made them,
a client id names a vehicle only for the vehicle principal, and a verified certificate's CN is a principal.
"""
from __future__ import annotations


import pytest

from fanout.config import UserConfig
from fanout.mqtt.auth import hash_password
from fanout.mqtt.connection import CONNECTED
from fanout.mqtt.hooks import ClientConnected, RecordingHooks
from fanout.mqtt.packets import Connack, Connect, Publish
from fanout.mqtt.peer import Peer
from tests.unit.test_mqtt_broker import FakeClient, Net, pubs

VIN = "WVW0000000000001"
USERS = {
    "admin": ("admin-pw", "admin"), "alice": ("alice-pw", "client"), "bob": ("bob-pw", "client"),
    "fleet": ("fleet-pw", "vehicle"), "plat": ("plat-pw", "platform"),
}


def users() -> dict:
    return {n: UserConfig(n, hash_password(pw, iterations=1000), role) for n, (pw, role) in USERS.items()}


@pytest.fixture
def net() -> Net:
    return Net(users=users(), hooks=RecordingHooks())


def login(net: Net, cid: str, user: str | None, clean: bool = True) -> tuple[FakeClient, Connack]:
    c = net.client()
    pw = USERS[user][0].encode() if user else None
    return c, c.connect(cid, clean=clean, username=user, password=pw)


def cert_client(net: Net, cn: str | None) -> FakeClient:
    c = FakeClient.__new__(FakeClient)
    c.net = net
    c.conn = net.broker.connection_made(net.now, Peer("127.0.0.1", 50001, cn, "mqtts"))
    c.conn.transport = c
    from fanout.mqtt.codec import PacketReader
    c.reader, c.inbox, c.closed = PacketReader(), [], False
    return c


# -- (b) a session belongs to the principal that made it ----------------------------------------------------------


@pytest.mark.parametrize("intruder", [None, "bob", "plat"])
def test_nobody_else_resumes_an_admins_or_clients_session(net, intruder):
    for owner, topic in (("admin", "$SDV-FANOUT/data/x"), ("alice", "private/alice")):
        c, ack = login(net, f"{owner}-console", owner, clean=False)
        assert ack == Connack(False, 0)
        c.subscribe((topic, 1))
        c.drop()
        pub, _ = login(net, "pub", "admin")
        pub.send(Publish(topic, b"secret", 1, False, False, 7))
        thief, ack = login(net, f"{owner}-console", intruder, clean=False)
        assert ack == Connack(False, 2) and thief.closed  # identifier rejected: bound to another principal
        thief, ack = login(net, f"{owner}-console", intruder, clean=True)  # nor may it discard the session
        assert ack == Connack(False, 2) and thief.inbox == []
        back, ack = login(net, f"{owner}-console", owner, clean=False)
        assert ack == Connack(True, 0)  # the owner resumes it, with what was queued meanwhile
        assert [t for t, *_ in pubs(back.take())] == [topic]


def test_another_principal_cannot_take_over_a_live_connection(net):
    owner, _ = login(net, "console", "alice")
    _, ack = login(net, "console", "bob")
    assert ack.return_code == 2 and owner.conn.state is CONNECTED


# -- (c) nothing another principal does keeps the owner out ---------------------------------------------------------


def test_anonymous_connect_storm_on_a_vin_neither_kicks_nor_throttles_the_vehicle(net):
    car, ack = login(net, VIN, "fleet", clean=False)
    assert ack.return_code == 0
    for _ in range(3 * net.settings.takeover_limit):
        _, ack = login(net, VIN, None)
        assert ack.return_code == 2
    assert car.conn.state is CONNECTED
    again, ack = login(net, VIN, "fleet", clean=False)  # the owner's own takeover is still accepted
    assert ack == Connack(True, 0) and car.closed


def test_a_vehicle_evicts_a_squatter_of_its_vin_but_not_a_platform_session(net):
    squat, ack = login(net, VIN, "alice", clean=False)
    assert ack.return_code == 0
    squat.subscribe(("#", 0))
    car, ack = login(net, VIN, "fleet")
    assert ack == Connack(False, 0) and squat.closed  # fresh session: nothing of the squatter's is handed over
    assert net.broker.session_of(VIN).principal.vehicle
    plat, ack = login(net, "plat-1", "plat")
    _, ack = login(net, "plat-1", "fleet")
    assert ack.return_code == 2 and plat.conn.state is CONNECTED


# -- (a) only the vehicle principal is the vehicle ---------------------------------------------------------------


@pytest.mark.parametrize("user", [None, "alice", "plat"])
def test_a_non_vehicle_with_a_vins_client_id_is_not_that_vehicle(net, user):
    c, ack = login(net, VIN, user)
    assert ack.return_code == 0
    assert c.subscribe((f"agent/{VIN}/proxy/request/+", 1), ("agent/#", 1)) == (0x80, 0x80)
    connected = [e for e in net.hooks.events if isinstance(e, ClientConnected)]
    assert connected[-1].vehicle is False
    c.subscribe(("#", 1))
    car, _ = login(net, "WVW0000000000002", "fleet")
    car.subscribe(("agent/WVW0000000000002/#", 1))
    car.send(Publish(f"ecp/{VIN}/online", b"", 0, False, False, None))  # another VIN's topic: refused
    c.send(Publish(f"ecp/{VIN}/online", b"", 0, False, False, None))
    admin, _ = login(net, "root", "admin")
    admin.subscribe(("ecp/#", 0))
    car.send(Publish("ecp/WVW0000000000002/online", b"", 0, False, False, None))  # its own: routed
    admin.send(Publish(f"agent/{VIN}/proxy/request/r1", b"ota", 1, False, False, 3))
    # '#' brings it what anyone may read (the vehicle's own ecp), neither agent/VIN/... nor the refused publishes
    assert [t for t, *_ in pubs(c.take())] == ["ecp/WVW0000000000002/online"]
    assert [t for t, *_ in pubs(admin.take())] == ["ecp/WVW0000000000002/online"]


def test_only_the_vehicle_is_served_fanout_deliveries(net):
    c, _ = login(net, VIN, "alice")
    c.subscribe(("#", 1))
    assert net.broker.deliver(VIN, f"agent/{VIN}/proxy/request/r1", b"ota", 1, b"row", require_subscription=False) \
        .name == "NOT_SUBSCRIBED"
    assert pubs(c.take()) == []
    car, _ = login(net, VIN, "fleet")  # evicts alice's session
    car.subscribe((f"agent/{VIN}/proxy/request/+", 1))
    assert net.broker.deliver(VIN, f"agent/{VIN}/proxy/request/r1", b"ota", 1, b"row").name == "SENT"
    net.pump()
    assert [t for t, *_ in pubs(car.take())] == [f"agent/{VIN}/proxy/request/r1"]


# -- certificates (the TLS listener passes peer.cert_cn) ----------------------------------------------------------


def test_certificate_cn_is_the_principal(net):
    car = cert_client(net, VIN)
    assert car.connect(VIN) == Connack(False, 0)
    assert net.broker.session_of(VIN).principal.vehicle
    assert car.subscribe((f"agent/{VIN}/#", 1)) == (1,)
    assert cert_client(net, VIN).connect("WVW0000000000009").return_code == 5  # a vehicle certificate, another VIN
    assert cert_client(net, VIN).connect(VIN, username="admin").return_code == 5  # not its CN
    op = cert_client(net, "plat")  # a CN naming a [users.NAME] takes that user's role, no password
    assert op.connect("ops-1") == Connack(False, 0)
    assert net.broker.session_of("ops-1").principal.role == "platform"
    # the fleet password and the certificate are the same vehicle principal: either resumes the session
    car.drop()
    again, ack = login(net, VIN, "fleet", clean=False)
    assert ack.return_code == 0


def test_development_mode_keeps_anonymous_vehicles():
    dev = Net()  # loopback, no users
    c = dev.client()
    assert c.connect(VIN).return_code == 0
    assert dev.broker.session_of(VIN).principal.vehicle
    assert c.subscribe((f"agent/{VIN}/#", 1), ("agent/#", 1)) == (1, 1)  # as today
