"""The direct channel's wire format (fanout.channel.frames), without sockets."""
from __future__ import annotations

import pytest

from fanout.channel import frames as fr

SECRET = b"k" * 32


def _handshake(client_secret: bytes = SECRET, server_secret: bytes = SECRET, service: str = "replica/0/r1"):
    hello, snonce = fr.server_hello()
    reply, expected = fr.client_reply(client_secret, hello, service)
    assert fr.client_reply_size(reply[:fr.NONCE_BYTES + fr.PROOF_BYTES + 1]) == len(reply)
    got_service, answer = fr.check_client(server_secret, snonce, reply)
    return got_service, answer, expected


def test_handshake_both_sides_prove_the_secret():
    service, answer, expected = _handshake()
    assert service == "replica/0/r1"
    assert answer == expected


def test_handshake_with_another_secret_is_refused():
    with pytest.raises(fr.HandshakeError):
        _handshake(client_secret=b"x" * 32)


def test_a_server_without_the_secret_cannot_produce_the_expected_answer():
    hello, snonce = fr.server_hello()
    reply, expected = fr.client_reply(SECRET, hello, "s")
    # an impostor server answering with a proof made from another secret
    _service, answer = fr.check_client(SECRET, snonce, reply)
    impostor = fr.proof(b"other" * 8, b"s", snonce, reply[:fr.NONCE_BYTES], b"s")
    assert answer == expected and impostor != expected


def test_a_proof_for_one_service_is_no_proof_for_another():
    hello, snonce = fr.server_hello()
    reply, _ = fr.client_reply(SECRET, hello, "replica/0/r1")
    n = fr.NONCE_BYTES + fr.PROOF_BYTES
    forged = reply[:n] + bytes([len(b"dispatcher/0")]) + b"dispatcher/0"
    with pytest.raises(fr.HandshakeError):
        fr.check_client(SECRET, snonce, forged)


def test_bad_hello_is_refused():
    with pytest.raises(fr.HandshakeError):
        fr.client_reply(SECRET, b"HTTP/1.1 200 OK\r\n\r\n", "s")


def _frame(rid: int, kind: int, payload: bytes) -> bytes:
    return fr.encode_header(len(payload), rid, kind) + payload


def test_decoder_whole_byte_at_a_time_and_with_trailing_bytes():
    data = _frame(1, fr.REQUEST, b"abc") + _frame(2, fr.REPLY, b"") + _frame(3, fr.ERROR, b"x" * 1000)
    want = [(1, fr.REQUEST, b"abc"), (2, fr.REPLY, b""), (3, fr.ERROR, b"x" * 1000)]
    assert fr.FrameDecoder(4096).feed(data) == want
    d = fr.FrameDecoder(4096)
    got = []
    for i in range(len(data)):
        got += d.feed(data[i:i + 1])
    assert got == want and d.buffered == 0
    d = fr.FrameDecoder(4096)
    assert d.feed(data + data[:5]) == want
    assert d.buffered == 5
    assert d.feed(data[5:]) == want


def test_decoder_refuses_a_frame_over_max_frame_from_its_header_alone():
    d = fr.FrameDecoder(100)
    with pytest.raises(fr.ChannelError, match="max_frame"):
        d.feed(fr.encode_header(101, 1, fr.REQUEST))  # nothing of the payload was sent, nothing is buffered


def test_decoder_refuses_an_unknown_kind():
    with pytest.raises(fr.ChannelError, match="kind"):
        fr.FrameDecoder(100).feed(fr.encode_header(0, 1, 7))


def test_decoder_compacts_its_buffer_when_a_partial_frame_follows_many():
    d = fr.FrameDecoder(1 << 20)
    one = _frame(9, fr.REQUEST, b"y" * 500)
    frame = (9, fr.REQUEST, b"y" * 500)
    assert d.feed(one * 200 + one[:100]) == [frame] * 200
    assert d.buffered == 100 and len(d._buf) == 100  # the 101,000 bytes before it are gone
    assert d.feed(one[100:]) == [frame]
    assert d.buffered == 0 and len(d._buf) == 0
