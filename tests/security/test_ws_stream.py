"""The sans-I/O WebSocket stream (:mod:`fanout.mqtt.websocket`) against wsproto's client, in memory."""
from __future__ import annotations

import pytest
from wsproto import ConnectionType, WSConnection
from wsproto.events import (AcceptConnection, BytesMessage, CloseConnection, Ping, Pong, RejectConnection, Request,
                            TextMessage)

from fanout.mqtt.websocket import WebSocketStream

CONNECT = b"\x10\x0d\x00\x04MQTT\x04\x02\x00\x3c\x00\x01x"


def _pair(target: str = "/mqtt", subprotocols: tuple[str, ...] = ("mqtt",), byte_by_byte: bool = False):
    client, server = WSConnection(ConnectionType.CLIENT), WebSocketStream()
    hello = client.send(Request(host="localhost", target=target, subprotocols=list(subprotocols)))
    chunks = [hello[i:i + 1] for i in range(len(hello))] if byte_by_byte else [hello]
    for chunk in chunks:
        assert server.receive_data(chunk) == b""
    client.receive_data(server.data_to_send())
    return client, server, list(client.events())


@pytest.mark.parametrize("byte_by_byte", [False, True])
def test_upgrade_to_mqtt_subprotocol(byte_by_byte):
    client, server, events = _pair(byte_by_byte=byte_by_byte)
    assert server.accepted and not server.closed
    assert isinstance(events[0], AcceptConnection) and events[0].subprotocol == "mqtt"
    assert events[0].extensions == []  # no permessage-deflate


@pytest.mark.parametrize("target, subprotocols, status", [("/", ("mqtt",), 404), ("/mqtt", (), 400),
                                                          ("/mqtt", ("mqttv3.1",), 400)])
def test_wrong_path_or_subprotocol_is_refused(target, subprotocols, status):
    _, server, events = _pair(target, subprotocols)
    assert server.closed and not server.accepted
    assert isinstance(events[0], RejectConnection) and events[0].status_code == status
    assert server.frame(b"\x20\x02\x00\x00") == b""  # nothing leaks after a refusal


def test_mqtt_bytes_are_a_stream_across_frames():
    client, server, _ = _pair()
    # one packet split over two frames, then two packets in one frame, then one frame byte by byte
    assert server.receive_data(client.send(BytesMessage(data=CONNECT[:5]))) == CONNECT[:5]
    assert server.receive_data(client.send(BytesMessage(data=CONNECT[5:]))) == CONNECT[5:]
    assert server.receive_data(client.send(BytesMessage(data=b"\xc0\x00\xc0\x00"))) == b"\xc0\x00\xc0\x00"
    frame = client.send(BytesMessage(data=b"\xe0\x00"))
    got = b"".join(server.receive_data(frame[i:i + 1]) for i in range(len(frame)))
    assert got == b"\xe0\x00"
    client.receive_data(server.frame(b"\x20\x02\x00\x00"))
    (msg,) = list(client.events())
    assert isinstance(msg, BytesMessage) and msg.data == b"\x20\x02\x00\x00"


def test_ping_is_answered_and_close_ends_the_stream():
    client, server, _ = _pair()
    assert server.receive_data(client.send(Ping(payload=b"hi"))) == b""
    client.receive_data(server.data_to_send())
    assert [type(e) for e in client.events()] == [Pong]
    server.receive_data(client.send(CloseConnection(code=1000)))
    assert server.closed
    client.receive_data(server.data_to_send())
    assert isinstance(list(client.events())[0], CloseConnection)


def test_text_frame_closes_with_1003():
    client, server, _ = _pair()
    assert server.receive_data(client.send(TextMessage(data="CONNECT"))) == b""
    assert server.closed
    client.receive_data(server.data_to_send())
    (ev,) = list(client.events())
    assert isinstance(ev, CloseConnection) and ev.code == 1003


def test_garbage_before_upgrade_closes():
    server = WebSocketStream()
    assert server.receive_data(CONNECT) == b""
    assert server.closed and not server.accepted


def test_broker_close_sends_a_close_frame():
    client, server, _ = _pair()
    client.receive_data(server.close())
    (ev,) = list(client.events())
    assert isinstance(ev, CloseConnection) and ev.code == 1000
    assert server.closed and server.close() == b""
