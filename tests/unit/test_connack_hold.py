"""CONNACKs held until the embedding registered the connection (fanout.mqtt.connack_hold), in memory."""
from __future__ import annotations

from fanout.mqtt.codec import encode
from fanout.mqtt.connack_hold import DEFAULT_MAX_HOLD_MS
from fanout.mqtt.packets import Connack, Connect, Pingreq, Pingresp, Publish, Suback, Subscribe

from .test_mqtt_broker import Net


def _held_net() -> Net:
    net = Net()
    net.broker.hold_connacks(lambda cid, principal: cid.startswith("VIN"))
    return net


def test_only_the_gated_client_ids_are_held():
    net = _held_net()
    other = net.client()
    other.send(Connect("other", True, 60, None, None, None))
    net.pump()
    assert [type(p) for p in other.inbox] == [Connack]
    car = net.client()
    car.send(Connect("VIN1", True, 60, None, None, None))
    net.pump()
    assert car.inbox == []


def test_release_writes_the_connack_first_then_answers_what_was_pipelined():
    net = _held_net()
    car = net.client()
    car.send(Connect("VIN1", True, 60, None, None, None), Subscribe(1, (("a/b", 1),)))
    net.pump()
    car.send(Pingreq())
    sub = net.client()
    sub.send(Connect("other", True, 60, None, None, None), Subscribe(1, (("a/b", 0),)))
    net.pump()
    assert car.inbox == []
    assert not net.broker.release_connack("VIN1", 999)  # another connection of the id: not this one
    assert net.broker.release_connack("VIN1", car.conn.generation)
    net.pump()
    assert [type(p) for p in car.inbox] == [Connack, Suback, Pingresp]
    assert not net.broker.release_connack("VIN1", car.conn.generation)  # released once


def test_messages_routed_to_a_held_connection_wait_behind_its_connack():
    net = _held_net()
    car = net.client()
    car.send(Connect("VIN1", False, 60, None, None, None))
    net.broker.release_connack("VIN1", car.conn.generation)
    car.send(Subscribe(1, (("a/b", 1),)))
    net.pump()
    car.net.broker.connection_lost(car.conn, net.now)  # persistent session stays, subscribed
    car2 = net.client()
    car2.send(Connect("VIN1", False, 60, None, None, None))
    pub = net.client()
    pub.send(Connect("pub", True, 60, None, None, None), Publish("a/b", b"x", 1, False, False, 7))
    net.pump()
    assert car2.inbox == []
    net.broker.release_connack("VIN1", car2.conn.generation)
    net.pump()
    assert [type(p) for p in car2.inbox] == [Connack, Publish]


def test_a_hold_nobody_releases_ends_on_the_tick():
    net = _held_net()
    car = net.client()
    car.send(Connect("VIN1", True, 60, None, None, None))
    net.advance(DEFAULT_MAX_HOLD_MS - 1000)
    assert car.inbox == []
    net.advance(2000)
    assert [type(p) for p in car.inbox] == [Connack]
    assert net.broker.state.holds.released_late == 1 and len(net.broker.state.holds) == 0


def test_a_held_connection_that_closes_sends_nothing_and_is_forgotten():
    net = _held_net()
    car = net.client()
    car.send(Connect("VIN1", True, 60, None, None, None))
    net.broker.connection_lost(car.conn, net.now)
    net.pump()
    assert car.inbox == []
    net.advance(DEFAULT_MAX_HOLD_MS + 1000)
    assert len(net.broker.state.holds) == 0 and net.broker.state.holds.released_late == 0


def test_bytes_sent_while_held_are_capped():
    net = _held_net()
    car = net.client()
    car.send(Connect("VIN1", True, 60, None, None, None))
    blob = encode(Publish("a/b", b"x" * 60_000, 0, False, False, None))
    for _ in range(200):
        if car.closed:
            break
        car.send_raw(blob)
        net.pump()
    assert car.closed and Connack not in [type(p) for p in car.inbox]
    assert net.broker.state.caps.hits["pre_auth_bytes"] >= 1
