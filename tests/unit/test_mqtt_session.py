"""Session state: packet ids, inflight window, bounded queue with drop policies, QoS 2 states."""
from __future__ import annotations

from fanout.config import load_config, mqtt_settings
from fanout.mqtt.session import RELEASED, SENT, OutMsg, QueueBudget, Session, SessionLimits


def _session(max_inflight: int = 3, max_queued: int = 2, drop_oldest: bool = True, clean: bool = False) -> Session:
    return Session("c1", clean, SessionLimits(max_inflight, max_queued, drop_oldest))


def _msg(n: int, qos: int = 1, tag=None) -> OutMsg:
    return OutMsg(f"t/{n}", b"%d" % n, qos, False, tag)


def test_limits_from_settings():
    cfg = load_config(None, env={"FANOUT_MQTT_MAX_INFLIGHT": "5", "FANOUT_MQTT_OFFLINE_DROP": "newest",
                                 "FANOUT_MQTT_MAX_SESSION_BYTES": "1MiB"})
    lim = SessionLimits.from_settings(mqtt_settings(cfg))
    assert lim == SessionLimits(5, 1000, False, 1 << 20)


def test_packet_ids_round_robin_and_wrap():
    s = _session()
    assert [s.alloc_pid() for _ in range(3)] == [1, 2, 3]
    s.last_pid = 0xFFFE
    assert s.alloc_pid() == 0xFFFF
    assert s.alloc_pid() == 1  # wraps, 0 is never used (MQTT-2.3.1-1)


def test_packet_ids_skip_ids_in_flight():
    s = _session()
    s.conn = object()
    s.inflight[2] = _msg(0)
    s.inflight[3] = _msg(0)
    s.last_pid = 1
    assert s.alloc_pid() == 4
    s.last_pid = 0xFFFF
    s.inflight[1] = _msg(0)
    assert s.alloc_pid() == 4


def test_window_and_queue_order():
    s = _session(max_inflight=2, max_queued=10)
    assert not s.window_open()  # offline
    s.conn = object()
    assert s.window_open()
    p1, p2 = s.send(_msg(1)), s.send(_msg(2))
    assert (p1, p2) == (1, 2)
    assert not s.window_open()
    assert s.enqueue(_msg(3)) == () and s.enqueue(_msg(4)) == ()
    assert s.next_sendable() is None  # window still full
    assert s.acked(1, 1).topic == "t/1"
    assert s.next_sendable().topic == "t/3"
    s.send(_msg(3))
    assert not s.window_open()
    assert s.queued_count() == 1


def test_queue_drop_oldest_counts():
    s = _session(max_queued=2, drop_oldest=True)
    assert s.enqueue(_msg(1)) == ()
    assert s.enqueue(_msg(2)) == ()
    (dropped,) = s.enqueue(_msg(3))
    assert dropped.topic == "t/1" and s.drop_reason == "mqtt.max_offline_messages"
    assert [m.topic for m in s.queue] == ["t/2", "t/3"]
    assert (s.dropped, s.dropped_unreported) == (1, 1)


def test_queue_drop_newest_counts():
    s = _session(max_queued=2, drop_oldest=False)
    s.enqueue(_msg(1))
    s.enqueue(_msg(2))
    new = _msg(3)
    assert s.enqueue(new) == (new,)
    assert [m.topic for m in s.queue] == ["t/1", "t/2"]
    assert s.dropped == 1


def test_queue_bound_zero_drops_everything():
    s = _session(max_queued=0)
    m = _msg(1)
    assert s.enqueue(m) == (m,)
    assert s.queued_count() == 0 and s.dropped == 1


def test_qos1_ack_rules():
    s = _session()
    s.conn = object()
    pid = s.send(_msg(1, qos=1))
    assert s.acked(pid, 2) is None  # PUBCOMP for a QoS 1 message is ignored
    assert s.acked(99, 1) is None
    assert s.acked(pid, 1) is not None
    assert s.acked(pid, 1) is None  # duplicate PUBACK


def test_qos2_states():
    s = _session()
    s.conn = object()
    pid = s.send(_msg(1, qos=2))
    assert s.inflight[pid].state == SENT
    assert s.acked(pid, 2) is None  # PUBCOMP before PUBREC: ignored
    assert s.pubrec(pid) is True
    assert s.inflight[pid].state == RELEASED
    assert s.pubrec(pid) is True  # duplicate PUBREC: PUBREL again
    assert s.pubrec(77) is False
    assert s.acked(pid, 1) is None  # PUBACK for a QoS 2 message: ignored
    assert s.acked(pid, 2).topic == "t/1"
    assert not s.inflight


def test_inbound_qos2_ids_dedupe_until_pubrel():
    s = _session()
    assert s.qos2_received(5) is True
    assert s.qos2_received(5) is False  # DUP resend: not routed again
    s.qos2_released(5)
    assert s.inbound_qos2 is None
    assert s.qos2_received(5) is True  # a new message may reuse the id
    s.qos2_released(6)  # unknown: no error


def test_resend_order_and_tags():
    s = _session(max_inflight=2, max_queued=5)
    s.conn = object()
    s.send(_msg(1, tag="a"))
    s.send(_msg(2))
    s.enqueue(_msg(3, tag="c"))
    assert [pid for pid, _ in s.resend_order()] == [1, 2]
    assert s.tags() == (("a",), ("c",))
    assert s.clear_messages() == 3
    assert s.tags() == ((), ())


def test_idle_session_is_small():
    """Containers most sessions never use are created lazily."""
    s = _session()
    assert s.queue is None and s.inbound_qos2 is None


def _big(n: int, size: int) -> OutMsg:
    return OutMsg(f"t/{n}", b"x" * (size - 3), 1)  # topic "t/N" is 3 characters: size bytes in all


def test_session_bytes_bound_counts_queued_and_inflight():
    s = Session("c1", False, SessionLimits(max_inflight=10, max_queued=100, max_bytes=1000))
    s.conn = object()
    assert s.window_open(400)
    s.send(_big(1, 400))
    assert s.bytes == 400 and s.window_open(600) and not s.window_open(601)
    s.conn = None
    assert s.enqueue(_big(2, 500)) == () and s.bytes == 900
    (dropped,) = s.enqueue(_big(3, 300))  # 1200 > 1000: the oldest queued goes, the new one fits
    assert dropped.topic == "t/2" and s.drop_reason == "mqtt.max_session_bytes"
    assert [m.topic for m in s.queue] == ["t/3"] and s.bytes == 700
    new = _big(4, 700)  # does not fit even with the queue emptied (400 in flight): dropped too
    third = s.queue[0]
    assert s.enqueue(new) == (third, new)
    assert s.queue is None and s.bytes == 400 and s.dropped == 3
    assert s.acked(1, 1) is not None and s.bytes == 0


def test_an_empty_session_takes_one_message_over_its_bound():
    s = Session("c1", False, SessionLimits(max_inflight=10, max_queued=100, max_bytes=100))
    big = _big(1, 5000)
    assert s.enqueue(big) == () and s.bytes == 5000
    s.conn = object()
    assert s.next_sendable() is big and s.bytes == 0
    s.send(big)
    assert s.bytes == 5000 and not s.window_open(1)


def test_node_budget_is_shared_and_counts_queued_bytes_only():
    budget = QueueBudget(1000)
    lim = SessionLimits(max_inflight=1, max_queued=100, max_bytes=10_000)
    a, b = Session("a", False, lim, budget), Session("b", False, lim, budget)
    assert a.enqueue(_big(1, 600)) == ()
    assert b.enqueue(_big(2, 300)) == () and budget.queued_bytes == 900
    m, oldest = _big(3, 200), b.queue[0]
    assert b.enqueue(m) == (oldest,)
    assert b.drop_reason == "mqtt.max_queued_bytes" and budget.queued_bytes == 800  # b dropped its oldest for it
    a.attach(object())  # connected: its queue moves to the online part
    sent = a.next_sendable()
    a.send(sent)
    assert budget.queued_bytes == 200 and a.bytes == 600  # in flight: out of the node budget, in the session's
    b.clear_messages()
    assert budget.queued_bytes == 0 and b.bytes == 0


def test_drop_where_releases_the_session_and_node_budgets() -> None:
    budget = QueueBudget(10_000)
    s = Session("c", clean=False, limits=SessionLimits(max_inflight=1), budget=budget)
    sent = OutMsg("t/a", b"x" * 100, 1, tag=b"row1")
    s.send(sent)
    for i in range(3):
        s.enqueue(OutMsg(f"t/{i}", b"y" * 50, 1, tag=b"row" if i != 1 else None))
    assert s.bytes == 103 + 3 * 53 and budget.queued_bytes == 3 * 53
    assert s.drop_where(lambda m: type(m.tag) is bytes) == 3
    assert s.bytes == 53 and budget.queued_bytes == 53
    assert not s.inflight and s.queued_count() == 1
    assert s.drop_where(lambda m: True) == 1
    assert s.bytes == 0 and budget.queued_bytes == 0 and s.queue is None
