"""The ACL at delivery decided once per covering filter P/+ (Delivery.deliver +
AccessControl.reads_every_topic_under): it must decide exactly as can_read per topic would."""
from __future__ import annotations

from fanout.config import AclRule
from fanout.mqtt.hooks import DeliverStatus

from .test_mqtt_broker import Net


def _subscriber(net: Net, cid: str, topic_filter: str):
    c = net.client()
    c.connect(cid)
    c.subscribe((topic_filter, 1))
    return c


def test_prefix_decision_is_remembered_and_skips_the_check():
    net = Net()
    _subscriber(net, "c1", "agent/c1/#")
    calls = []
    can_read = net.broker._delivery._can_read
    net.broker._delivery._can_read = lambda p, t: calls.append(t) or can_read(p, t)
    covering = ("agent/c1/proxy/request/+",)
    for i in range(5):
        topic = f"agent/c1/proxy/request/r{i}"
        assert net.broker.deliver("c1", topic, b"x", 1, require_subscription=False, covering=covering) is DeliverStatus.SENT
    assert calls == ["agent/c1/proxy/request/r0"]  # decided for the filter by the first
    s = net.broker.session_of("c1")
    assert (s.read_filter, s.read_ok) == ("agent/c1/proxy/request/+", True)
    assert net.broker.deliver("c1", "agent/c1/other", b"x", 1) is DeliverStatus.SENT
    assert calls[-1] == "agent/c1/other"  # no covering filter vouches for its shape: asked
    assert net.broker.deliver("c1", "agent/c1/x/y", b"x", 1, covering=("agent/c1/#",)) is DeliverStatus.SENT
    assert calls[-1] == "agent/c1/x/y"  # a multi-level filter decides nothing per prefix
    n = len(calls)
    for i in range(2):
        net.broker.deliver("c1", f"agent/c1/y{i}", b"x", 1, covering=("agent/+/+",))
    assert len(calls) == n + 2  # a wildcard in P/ stands for any level: never decided per prefix


def test_a_rule_naming_the_last_level_is_held_per_topic():
    rules = (AclRule("subscribe", "agent/+/proxy/request/secret", False),)
    net = Net(acl=rules)
    _subscriber(net, "c1", "agent/c1/#")
    cov = {"require_subscription": False, "covering": ("agent/c1/proxy/request/+",)}
    deliver = net.broker.deliver
    assert deliver("c1", "agent/c1/proxy/request/r1", b"x", 1, **cov) is DeliverStatus.SENT
    assert net.broker.session_of("c1").read_ok is False  # a rule applies: no decision per prefix
    assert deliver("c1", "agent/c1/proxy/request/secret", b"x", 1, **cov) is DeliverStatus.NOT_SUBSCRIBED
    assert deliver("c1", "agent/c1/proxy/request/r2", b"x", 1, **cov) is DeliverStatus.SENT
    assert net.broker.state.deliveries_denied == 1


def test_errors_topics_are_never_decided_per_prefix():
    net = Net()
    net.client().connect("p1")
    principal = net.broker.session_of("p1").principal
    assert not net.acl.reads_every_topic_under(principal, "$SDV-FANOUT/errors/")
    deliver = net.broker.deliver
    assert deliver("p1", "$SDV-FANOUT/errors/p1", b"x", 1, require_subscription=False) is DeliverStatus.SENT
    assert deliver("p1", "$SDV-FANOUT/errors/other", b"x", 1, require_subscription=False) is DeliverStatus.NOT_SUBSCRIBED


def test_prefix_decision_matches_can_read_for_every_role():
    from fanout.mqtt.principals import Principal

    net = Net()
    acl = net.acl
    decided = 0
    for role in ("client", "vehicle", "platform", "admin"):
        p = Principal(username=None, role=role, client_id="WVW00000000000001")
        for prefix in ("agent/WVW00000000000001/proxy/request/", "agent/OTHER/", "agent/", "ecp/x/", "a/b/", "$SYS/broker/"):
            if acl.reads_every_topic_under(p, prefix):
                decided += 1
                for last in ("r1", "", "WVW00000000000001", "secret"):
                    assert acl.can_read(p, prefix + last), (role, prefix, last)
    assert decided >= 8


def test_a_new_principal_on_the_session_is_asked_again():
    from fanout.mqtt.principals import Principal

    net = Net()
    _subscriber(net, "c1", "agent/c1/#")
    cov = {"require_subscription": False, "covering": ("agent/c1/proxy/request/+",)}
    assert net.broker.deliver("c1", "agent/c1/proxy/request/r1", b"x", 1, **cov) is DeliverStatus.SENT
    s = net.broker.session_of("c1")
    assert s.read_ok
    s.principal = Principal(username=None, role="vehicle", client_id="OTHER")  # as a re-login with other rights
    assert net.broker.deliver("c1", "agent/c1/proxy/request/r2", b"x", 1, **cov) is DeliverStatus.NOT_SUBSCRIBED
