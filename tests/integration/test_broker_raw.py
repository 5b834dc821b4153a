"""What third-party clients cannot do, over real TCP with raw sockets and the project codec: withhold
acks to see DUP redelivery, send malformed or oversize packets, never send CONNECT, speak out of turn."""
from __future__ import annotations

import time

import pytest

from fanout.mqtt.codec import encode
from fanout.mqtt.hooks import ClientConnected, IngestTicket, RecordingHooks
from fanout.mqtt.packets import (
    Connack, Connect, Pingreq, Pingresp, Puback, Pubcomp, Publish, Pubrec, Pubrel, Suback, Subscribe, Unsuback,
    Unsubscribe, Will,
)

from .conftest import wait_for

pytestmark = pytest.mark.timeout(60)


def _sub(c, *filters, pid=1):
    c.send(Subscribe(pid, tuple(filters)))
    ack = c.recv()
    assert isinstance(ack, Suback) and ack.packet_id == pid
    return ack.return_codes


def test_redelivery_with_dup_qos1(broker, raw_client):
    sub = raw_client(broker)
    assert sub.connect("dup1", clean=False) == Connack(False, 0)
    _sub(sub, ("r1", 1))
    pub = raw_client(broker)
    pub.connect("pub")
    pub.send(Publish("r1", b"a", 1, False, False, 1), Publish("r1", b"b", 1, False, False, 2))
    assert pub.recv_n(2) == [Puback(1), Puback(2)]
    first = sub.recv_n(2)
    assert [(m.payload, m.dup) for m in first] == [(b"a", False), (b"b", False)]
    sub.send(Puback(first[0].packet_id))  # ack only the first
    time.sleep(0.05)
    sub.kill()
    again = raw_client(broker)
    assert again.connect("dup1", clean=False) == Connack(True, 0)
    m = again.recv()
    assert (m.topic, m.payload, m.qos, m.dup, m.packet_id) == ("r1", b"b", 1, True, first[1].packet_id)
    again.send(Puback(m.packet_id))
    again.expect_nothing()


def test_redelivery_qos2_publish_and_pubrel(broker, raw_client):
    sub = raw_client(broker)
    sub.connect("dup2", clean=False)
    _sub(sub, ("r2", 2))
    pub = raw_client(broker)
    pub.connect("pub")
    pub.send(Publish("r2", b"a", 2, False, False, 1), Publish("r2", b"b", 2, False, False, 2))
    m1, m2 = sub.recv_n(2)
    sub.send(Pubrec(m1.packet_id))  # first: past PUBREC; second: not acknowledged at all
    assert sub.recv() == Pubrel(m1.packet_id)
    sub.kill()
    again = raw_client(broker)
    assert again.connect("dup2", clean=False).session_present
    assert again.recv() == Pubrel(m1.packet_id)  # MQTT-4.4.0-1: resend PUBREL, not the PUBLISH
    m = again.recv()
    assert (m.payload, m.qos, m.dup, m.packet_id) == (b"b", 2, True, m2.packet_id)
    again.send(Pubcomp(m1.packet_id), Pubrec(m.packet_id))
    assert again.recv() == Pubrel(m.packet_id)
    again.send(Pubcomp(m.packet_id))
    wait_for(lambda: broker.call(lambda: not broker.broker.sessions["dup2"].inflight), what="inflight empty")


def test_inbound_qos2_not_routed_twice_across_reconnect(broker, raw_client):
    sub = raw_client(broker)
    sub.connect("watch")
    _sub(sub, ("in2", 0))
    pub = raw_client(broker)
    pub.connect("pub2", clean=False)
    pub.send(Publish("in2", b"once", 2, False, False, 7))
    assert pub.recv() == Pubrec(7)
    pub.kill()
    pub = raw_client(broker)
    pub.connect("pub2", clean=False)
    pub.send(Publish("in2", b"once", 2, False, True, 7))
    assert pub.recv() == Pubrec(7)
    pub.send(Pubrel(7))
    assert pub.recv() == Pubcomp(7)
    assert sub.recv().payload == b"once"
    sub.expect_nothing()


def test_malformed_packet_closes_only_that_connection(broker, raw_client, paho_client):
    good = paho_client()
    good.connect(broker.port)
    good.subscribe(("ok", 1), ("wills/#", 0))
    bad = raw_client(broker)
    bad.connect("bad", will=Will("wills/bad", b"malformed", 0, False))
    bad.send_raw(b"\x30\x03\x00\x05a")  # topic length runs past the packet end
    assert bad.is_closed()
    assert good.get().payload == b"malformed"  # the will is published on a protocol error
    other = raw_client(broker)
    other.connect("other")
    other.send(Publish("ok", b"still fine", 1, False, False, 1))
    assert other.recv() == Puback(1)
    assert good.get().payload == b"still fine"


@pytest.mark.parametrize("garbage", [
    b"\x00\x00",  # reserved packet type 0
    b"\x62\x02\x00\x00",  # PUBREL with packet id 0
    b"\x82\x02\x00\x01",  # SUBSCRIBE without filters
    b"\x36\x05\x00\x01a\x00\x01",  # PUBLISH QoS 3
    b"\xc0\x01\x00",  # PINGREQ with a body
    b"\x30\xff\xff\xff\xff\x01",  # remaining length of 5 bytes
], ids=["type0", "pid0", "nofilter", "qos3", "pingbody", "rl5"])
def test_bad_input_closes(broker, raw_client, garbage):
    c = raw_client(broker)
    c.connect("g")
    c.send_raw(garbage)
    assert c.is_closed()


def test_oversize_packet_closes(start_broker, raw_client):
    rb = start_broker(mqtt={"max_packet_size": "1KiB"})
    c = raw_client(rb)
    c.connect("big")
    c.send(Publish("t", b"x" * 500, 0))  # fits
    c.send(Pingreq())
    assert c.recv() == Pingresp()
    c.send_raw(encode(Publish("t", b"x" * 2000, 0))[:10])  # the header alone announces too much
    assert c.is_closed()
    ok = raw_client(rb)
    assert ok.connect("next").return_code == 0


def test_connect_timeout(start_broker, raw_client):
    rb = start_broker(mqtt={"connect_timeout": "300ms"})
    c = raw_client(rb)
    t0 = time.monotonic()
    assert c.is_closed(timeout=3)
    assert 0.25 < time.monotonic() - t0 < 2.5  # not before the timeout; the upper bound allows a busy machine


def test_first_packet_must_be_connect(broker, raw_client):
    c = raw_client(broker)
    c.send(Pingreq())
    assert c.is_closed()


def test_second_connect_closes(broker, raw_client):
    c = raw_client(broker)
    c.connect("twice")
    c.send(Connect("twice"))
    assert c.is_closed()


def test_bad_protocol_level_raw(broker, raw_client):
    c = raw_client(broker)
    assert c.connect("x", protocol_level=6) == Connack(False, 1)  # 5 is MQTT 5, accepted
    assert c.is_closed()


def test_zero_length_client_id_without_clean_session(broker, raw_client):
    c = raw_client(broker)
    assert c.connect("", clean=False) == Connack(False, 2)
    assert c.is_closed()
    ok = raw_client(broker)
    assert ok.connect("", clean=True) == Connack(False, 0)


def test_invalid_filters_refused_with_0x80(broker, raw_client):
    c = raw_client(broker)
    c.connect("f")
    assert _sub(c, ("a/#/b", 0), ("a+", 1), ("", 0), ("ok/+/#", 2)) == (0x80, 0x80, 0x80, 2)


def test_pingreq(broker, raw_client):
    c = raw_client(broker)
    c.connect("ping", keepalive=1)
    for _ in range(3):
        time.sleep(0.5)
        c.send(Pingreq())
        assert c.recv() == Pingresp()


def test_unsubscribe_unknown_filter_acked(broker, raw_client):
    c = raw_client(broker)
    c.connect("u")
    c.send(Unsubscribe(9, ("never/there",)))
    assert c.recv() == Unsuback(9)


def test_pipelined_stream_any_split(broker, raw_client):
    c = raw_client(broker)
    data = encode(Connect("split")) + encode(Subscribe(1, (("s", 1),))) + encode(Publish("s", b"me", 1, False, False, 3))
    for i in range(len(data)):
        c.send_raw(data[i:i + 1])
        time.sleep(0.001)
    got = c.recv_n(4)
    assert got[0] == Connack(False, 0) and got[1] == Suback(1, (1,))
    assert sorted(type(p).__name__ for p in got[2:]) == ["Puback", "Publish"]


def test_deferred_ack_hooks_over_tcp(start_broker, raw_client):
    hooks = RecordingHooks(intercept_ingest=True)
    rb = start_broker(hooks=hooks)
    plat = raw_client(rb)
    plat.connect("plat", username="platform", password=b"platform")
    plat.send(Publish("$SDV-FANOUT/trigger", b"{}", 1, False, False, 5))
    plat.expect_nothing(0.2)  # no PUBACK until the write is durable
    ticket = wait_for(lambda: rb.call(lambda: [e for e in hooks.events if isinstance(e, IngestTicket)]))[0]
    assert rb.call(rb.broker.complete_publish, ticket.client_id, ticket.packet_id, ticket.generation)
    assert plat.recv() == Puback(5)
    assert any(isinstance(e, ClientConnected) for e in rb.call(lambda: list(hooks.events)))


def test_server_stop_closes_clients_without_wills(start_broker, raw_client):
    rb = start_broker()
    watcher, c = raw_client(rb), raw_client(rb)
    watcher.connect("w")
    _sub(watcher, ("wills/#", 0))
    c.connect("c", will=Will("wills/c", b"x", 0, False))
    import threading

    stopper = threading.Thread(target=rb.stop, daemon=True)
    stopper.start()
    assert c.is_closed() and watcher.is_closed()
    stopper.join(10)
    assert not stopper.is_alive()
    assert watcher.pending == []  # no will was delivered before the close


def test_graceful_stop_delivers_what_the_publisher_had_acked(start_broker, raw_client):
    """A clean stop flushes every message already written to a subscriber, although that subscriber keeps
    sending PUBACKs while it reads them: the broker half-closes (FIN after the data) and drains its
    input until the client closes. A plain close with unread input would reset the connection (RST) and
    the kernel would drop the queued messages the publisher had been PUBACKed for."""
    import socket
    import threading

    from fanout.mqtt.codec import PacketReader

    rb = start_broker()
    sub, pub = raw_client(rb), raw_client(rb)
    sub.connect("slow-reader")
    _sub(sub, ("big/#", 1))
    pub.connect("pub")
    n, payload = 24, b"x" * 250_000  # 6 MB: far more than the socket buffers hold
    pub.send(*(Publish("big/t", payload, 1, False, False, i) for i in range(1, n + 1)))
    assert pub.recv_n(n) == [Puback(i) for i in range(1, n + 1)]
    stopper = threading.Thread(target=rb.stop, daemon=True)
    stopper.start()  # the broker now closes every connection while the subscriber reads slowly
    assert pub.is_closed()
    reader, received, eof = PacketReader(), 0, False
    sub.sock.settimeout(10)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            data = sub.sock.recv(32768)
        except ConnectionResetError:
            break
        if not data:
            eof = True
            break
        for p in reader.feed(data):
            if isinstance(p, Publish):
                received += 1
                sub.sock.sendall(encode(Puback(p.packet_id)))  # input the stopping broker leaves unread
        time.sleep(0.002)
    sub.sock.shutdown(socket.SHUT_RDWR)
    stopper.join(15)
    assert (received, eof) == (n, True)
