"""In-flight tracking: blob skip per connection, completion on the last PUBACK, reset order."""
from __future__ import annotations

import json
from itertools import count

from fanout.client.inflight import Inflight
from fanout.client.submission import Submission, data_topic, make_submission
from fanout.trigger import TRIGGER_TOPIC


class FakeWire:
    def __init__(self) -> None:
        self.sent: list[tuple[int, str, bytes]] = []
        self._mids = count(1)

    def publish(self, topic: str, payload: bytes) -> int:
        mid = next(self._mids)
        self.sent.append((mid, topic, payload))
        return mid


def sub(seq: int, n: int = 5, payload: bytes = b"blob", rid: str | None = None) -> Submission:
    return make_submission(seq, [f"V{seq}-{i}" for i in range(n)], payload, rid or f"r{seq}", None, seq)


def test_blob_then_chunks_and_done_on_last_ack() -> None:
    wire, inf = FakeWire(), Inflight()
    s = sub(1, n=5)
    assert inf.send(s, 2, wire.publish, 0.0) == 4
    topics = [t for _, t, _ in wire.sent]
    assert topics == [data_topic(s.data_id), TRIGGER_TOPIC, TRIGGER_TOPIC, TRIGGER_TOPIC]
    chunks = [json.loads(p) for _, t, p in wire.sent[1:]]
    assert [c["ids"] for c in chunks] == [s.vins[0:2], s.vins[2:4], s.vins[4:5]]
    assert {c["request_id"] for c in chunks} == {"r1"} and {c["data_id"] for c in chunks} == {s.data_id}
    assert inf.messages == 4 and len(inf) == 1 and s.total_msgs == 4
    for mid in (4, 1, 3):
        assert inf.ack(mid) == []
    assert s.acked_msgs == 3
    assert inf.ack(2) == [s] and len(inf) == 0 and inf.messages == 0
    assert inf.ack(2) == []  # duplicate PUBACK ignored


def test_blob_published_once_per_connection() -> None:
    wire, inf = FakeWire(), Inflight()
    a, b = sub(1), sub(2)
    inf.send(a, 100, wire.publish, 0.0)
    inf.send(b, 100, wire.publish, 0.0)  # same payload, blob PUBACK pending: b waits for it too
    assert [t for _, t, _ in wire.sent].count(data_topic(a.data_id)) == 1
    assert inf.ack(3) == []  # b's trigger
    assert inf.ack(2) == []  # a's trigger
    assert inf.ack(1) == [a, b]  # the blob completes both
    c = sub(3)
    inf.send(c, 100, wire.publish, 0.0)  # blob acked on this connection: not re-sent
    assert wire.sent[-1][1] == TRIGGER_TOPIC and len(wire.sent) == 4 and c.total_msgs == 1
    assert inf.ack(4) == [c]
    inf.reset()
    inf.send(sub(4), 100, wire.publish, 0.0)  # new connection: blob sent again
    assert wire.sent[-2][1] == data_topic(c.data_id)


def test_reset_returns_unacked_in_publish_order_and_forget() -> None:
    wire, inf = FakeWire(), Inflight()
    subs = [sub(i, payload=bytes([i])) for i in (5, 3, 9)]
    for s in subs:
        inf.send(s, 100, wire.publish, float(s.seq))
    assert inf.oldest_sent_at() == 5.0 and inf.oldest_ts_ms() == 3
    assert inf.find_request("r3") == [subs[1]]
    assert inf.forget(3) is subs[1] and 3 not in inf
    assert inf.ack(3) == [] and inf.ack(4) == []  # PUBACKs of a forgotten submission are ignored
    assert inf.reset() == [subs[0], subs[2]]
    assert len(inf) == 0 and inf.messages == 0 and inf.oldest_sent_at() is None


def test_publish_raising_leaves_partial_state_forgettable() -> None:
    inf = FakeWire()
    tracker = Inflight()
    calls = count()

    def flaky(topic: str, payload: bytes) -> int:
        if next(calls) == 1:
            raise OSError("refused")
        return inf.publish(topic, payload)

    s = sub(1)
    try:
        tracker.send(s, 100, flaky, 0.0)
    except OSError:
        pass
    assert tracker.forget(1) is s
    assert tracker.ack(1) == []


def test_blob_cache_bounded() -> None:
    wire, inf = FakeWire(), Inflight(blob_cache=2)
    for i in range(5):
        s = sub(i, payload=bytes([i]))
        inf.send(s, 100, wire.publish, 0.0)
        for mid, _, _ in wire.sent[-2:]:
            inf.ack(mid)
    assert len(inf._blobs) == 2
