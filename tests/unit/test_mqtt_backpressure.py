"""Read back-pressure of the broker core (fanout.mqtt.backpressure), in memory: the decisions, not the sockets
(tests/security/test_backpressure.py runs them against a real broker process)."""
from __future__ import annotations

from structlog.testing import capture_logs

from fanout.mqtt.packets import Puback, Publish

from .test_mqtt_broker import Net

# online part = 10,000 x (1 - 0.5) = 5,000 bytes: high water 4,000, low water 2,000
BUDGET = {"max_queued_bytes": "10000B", "offline_queued_fraction": 0.5, "backpressure_high_fraction": 0.8,
          "backpressure_low_fraction": 0.4, "max_session_bytes": "1MiB", "max_inflight": 2}


def _publish(pub, n: int, first_pid: int = 1, topic: str = "t", size: int = 999) -> None:
    pub.send(*[Publish(topic, b"x" * size, 1, packet_id=first_pid + i) for i in range(n)])  # 1,000 bytes each


def _slow_subscriber(net: Net, cid: str = "slow", topic_filter: str = "t"):
    sub = net.client()
    sub.connect(cid)
    sub.subscribe((topic_filter, 1))
    return sub


def _ack_all(sub) -> int:
    pids = [p.packet_id for p in sub.take() if isinstance(p, Publish)]
    for pid in pids:
        sub.send(Puback(pid))
    return len(pids)


def test_publisher_is_paused_past_high_water_and_resumed_below_low_water():
    net = Net(mqtt=BUDGET)
    pressure = net.broker.state.pressure
    sub = _slow_subscriber(net)
    pub = net.client()
    pub.connect("fast")
    with capture_logs() as logs:
        _publish(pub, 6)  # 2 in flight, 4 queued: 4,000 bytes, not over
        assert net.broker.read_changes() is None and not pressure.engaged
        _publish(pub, 1, 7)  # 5,000 queued > 4,000
        assert net.broker.read_changes() == {pub.conn: True}
        _publish(pub, 2, 8)  # what the adapter had already read is still handled (and acknowledged)
        assert net.broker.read_changes() is None  # paused once
        assert sum(isinstance(p, Puback) for p in pub.take()) == 9
        budget = net.broker.state.queue_budget
        assert budget.online_bytes == 7_000 and pressure.paused == {pub.conn}
        acked = 0
        changes: dict = {}
        while pressure.engaged and acked < 100:
            acked += _ack_all(sub)  # the subscriber is read all along: its acks drain the queue
            changes.update(net.broker.read_changes() or {})
        assert changes == {pub.conn: False}  # resumed in the flush of the ack that got to low water
        assert budget.online_bytes <= 2_000 and acked >= 5
    assert [e["event"] for e in logs if "back-pressure" in e["event"]] == [
        "mqtt back-pressure engaged: not reading from publishers", "mqtt back-pressure released"]
    snap = net.broker.sys.snapshot(net.now)
    assert snap["$SYS/broker/backpressure/episodes"] == 1 and snap["$SYS/broker/backpressure/pauses"] == 1
    assert snap["$SYS/broker/backpressure/paused"] == 0 and net.broker.pub_dropped == 0
    while _ack_all(sub):
        pass
    assert budget.queued_bytes == 0


def test_an_offline_session_filling_its_part_does_not_pause_publishers():
    net = Net(mqtt=BUDGET)
    away = net.client()
    away.connect("away", clean=False)
    away.subscribe(("t", 1))
    away.drop()
    pub = net.client()
    pub.connect("fast")
    _publish(pub, 20)  # 20,000 bytes for the offline session: its part is 5,000
    budget = net.broker.state.queue_budget
    assert budget.offline_bytes <= 5_000 and budget.online_bytes == 0
    assert net.broker.read_changes() is None and not net.broker.state.pressure.engaged
    assert net.broker.pub_dropped == 15 and net.broker.state.caps.hits["offline_queued_bytes"] == 15


def test_a_paused_publisher_that_must_acknowledge_is_read_again():
    net = Net(mqtt=BUDGET)
    _slow_subscriber(net)
    both = net.client()
    both.connect("both")
    both.subscribe(("echo", 1))
    _publish(both, 7)
    assert net.broker.read_changes() == {both.conn: True}
    other = net.client()
    other.connect("other")
    _publish(other, 3, topic="echo")  # 2 in flight, 1 queued for the paused one: only its acks free that
    changes = net.broker.read_changes()
    assert changes is not None and changes.get(both.conn) is False


def test_paused_connections_do_not_time_out():
    net = Net(mqtt=BUDGET)
    _slow_subscriber(net, "slow")
    pub = net.client()
    pub.connect("fast", keepalive=2)  # 3 s at 1.5 x
    _publish(pub, 7)
    assert net.broker.read_changes() == {pub.conn: True}
    for _ in range(10):
        net.advance(1000)  # its PINGREQs wait unread in the socket: silence is the broker's doing
    assert not pub.closed


def test_subscriber_only_connections_are_never_paused():
    net = Net(mqtt=BUDGET)
    sub = _slow_subscriber(net)
    pub = net.client()
    pub.connect("fast")
    _publish(pub, 10)
    net.broker.read_changes()
    sub.send(Puback(1))  # still over high water after this ack
    assert net.broker.state.pressure.engaged
    assert sub.conn not in net.broker.state.pressure.paused


def test_episodes_in_quick_succession_are_logged_once_per_window_and_counted():
    """A subscriber that never catches up makes several episodes a second: one engaged/released pair per
    LOG_EVERY_MS, the episodes between counted in the next engaged line (all of them in $SYS)."""
    from fanout.mqtt.backpressure import LOG_EVERY_MS
    net = Net(mqtt=BUDGET)
    pressure = net.broker.state.pressure
    sub = _slow_subscriber(net)
    pub = net.client()
    pub.connect("fast")
    pid = 1

    def episode() -> None:
        nonlocal pid
        _publish(pub, 7, pid)
        pid += 7
        assert pressure.engaged
        while pressure.engaged:
            _ack_all(sub)
        while _ack_all(sub):
            pass
        net.broker.read_changes()

    with capture_logs() as logs:
        for _ in range(5):
            episode()
            net.advance(100)
        net.advance(LOG_EVERY_MS)
        episode()
    lines = [e for e in logs if "back-pressure" in e["event"]]
    assert [e["event"].split(":")[0] for e in lines] == ["mqtt back-pressure engaged", "mqtt back-pressure released"] * 2
    assert [e["episodes_unlogged"] for e in lines if "engaged" in e["event"]] == [0, 4]
    assert net.broker.sys.snapshot(net.now)["$SYS/broker/backpressure/episodes"] == 6
