"""ACL held at delivery, at the sans-I/O level: a message reaches a subscriber only if that subscriber's
principal may read its topic, whatever filter matched; routed publishes, retained replay and wills alike.

The property test draws random subscription filters, topics and subscribe rules (allow and deny, per role
or user) and checks every PUBLISH a client receives against a reference decision written from the rules'
definition (first subscribe rule whose filter matches the topic decides, else the role's policy), and that
nothing a client may read and subscribed to is missing.
"""
from __future__ import annotations

import itertools

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fanout.config import AclRule, UserConfig
from fanout.mqtt.auth import hash_password
from fanout.mqtt.packets import Publish, Will
from fanout.mqtt.topics import topic_matches
from tests.unit.test_mqtt_broker import Net, pubs

HASHES = {n: UserConfig(n, hash_password(n + "-pw", iterations=1), r)
          for n, r in (("alice", "client"), ("bob", "client"), ("ops", "platform"), ("root", "admin"))}


def net_with(acl: tuple[AclRule, ...] = ()) -> Net:
    return Net(users=dict(HASHES), acl=acl)


def login(net: Net, cid: str, user: str | None):
    c = net.client()
    assert c.connect(cid, username=user, password=(user + "-pw").encode() if user else None).return_code == 0
    return c


DENY = (AclRule("subscribe", "test/nosubscribe", False),)


def test_deny_rule_holds_for_wildcard_subscribers():
    net = net_with(DENY)
    subs = [login(net, f"s{i}", u) for i, u in enumerate((None, "alice", "ops"))]
    for s, f in zip(subs, ("test/#", "#", "+/+")):
        assert s.subscribe((f, 1)) == (1,)
        assert s.subscribe(("test/nosubscribe", 1), pid=2) == (0x80,)  # the filter itself stays refused
    pub = login(net, "pub", "root")
    pub.send(Publish("test/nosubscribe", b"secret", 1, False, False, 1),
             Publish("test/other", b"fine", 1, False, False, 2))
    for s in subs:
        assert [(t, p) for t, p, *_ in pubs(s.take())] == [("test/other", b"fine")]
    assert net.broker.state.deliveries_denied == 3
    assert net.broker.sys.snapshot(net.now)["$SYS/broker/publish/messages/denied_at_delivery"] == 3
    root = login(net, "root-sub", "root")
    root.subscribe(("test/#", 0))  # the rule names no role or user: it applies to admin too
    pub.send(Publish("test/nosubscribe", b"secret", 0, False, False, None))
    assert pubs(root.take()) == []


def test_deny_rule_holds_for_retained_replay_and_wills():
    net = net_with(DENY)
    pub = login(net, "pub", "alice")
    pub.send(Publish("test/nosubscribe", b"kept", 1, True, False, 1))
    late = login(net, "late", "bob")
    late.subscribe(("#", 1))
    assert pubs(late.take()) == []  # the retained message is not replayed to a principal that may not read it
    dying = net.client()
    dying.connect("dying", will=Will("test/nosubscribe", b"gone", 1, False), username="alice", password=b"alice-pw")
    dying.drop()
    assert pubs(late.take()) == []


# -- property ---------------------------------------------------------------------------------------------------

LEVELS = ("a", "b", "test", "$SYS")
USERS = (None, "alice", "bob", "ops")  # anonymous is role client
ROLE = {None: "client", "alice": "client", "bob": "client", "ops": "platform"}


def topics() -> st.SearchStrategy[str]:
    first = st.sampled_from(LEVELS)
    rest = st.lists(st.sampled_from(("a", "b", "c")), min_size=0, max_size=2)
    return st.builds(lambda f, r: "/".join([f, *r]), first, rest)


def filters() -> st.SearchStrategy[str]:
    level = st.sampled_from(("a", "b", "c", "test", "+"))
    return st.builds(lambda ls, hashed: "/".join([*ls, "#"] if hashed else ls) or "#",
                     st.lists(level, min_size=0, max_size=3), st.booleans())


rules = st.lists(st.builds(
    lambda f, allow, who: AclRule("subscribe", f, allow, role=who[0], user=who[1]),
    filters(), st.booleans(),
    st.sampled_from(((None, None), ("client", None), ("platform", None), (None, "alice"), (None, "bob"))),
), max_size=4)


def may_read(user: str | None, topic: str, acl: list[AclRule]) -> bool:
    """The reference decision, from the rules' definition (not from AccessControl)."""
    role = ROLE[user]
    for r in acl:
        if (r.role is None or r.role == role) and (r.user is None or r.user == user) and topic_matches(r.topic, topic):
            return r.allow
    return True  # client and platform read any topic that is not agent/, $SDV-FANOUT/ (not drawn here)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(acl=rules, subs=st.lists(st.tuples(st.sampled_from(USERS), filters()), min_size=1, max_size=5),
       published=st.lists(st.tuples(topics(), st.booleans()), min_size=1, max_size=6))
def test_never_a_delivery_the_rules_forbid(acl, subs, published):
    net = net_with(tuple(acl))
    clients = []
    for n, (user, f) in enumerate(subs):
        c = login(net, f"c{n}", user)
        granted = c.subscribe((f, 1))[0] != 0x80
        clients.append((c, user, f, granted))
    pub = login(net, "pub", "root")
    for pid, (topic, retain) in enumerate(published, 1):
        pub.send(Publish(topic, b"m%d" % pid, 1, retain, False, pid))
    for c, user, f, granted in clients:
        got = [t for t, *_ in pubs(c.take())]
        for t in got:
            assert may_read(user, t, acl), (user, f, t, acl)
        expected = [t for t, _r in published if granted and topic_matches(f, t) and may_read(user, t, acl)]
        assert got == expected, (user, f, acl)
    # retained replay to a newcomer obeys the same rules
    for n, (user, f) in enumerate(itertools.islice(subs, 2)):
        late = login(net, f"late{n}", user)
        if late.subscribe((f, 1))[0] == 0x80:
            continue
        for t, *_ in pubs(late.take()):
            assert may_read(user, t, acl), (user, f, t, acl)


def test_read_decisions_are_bounded_by_entries_and_bytes():
    from fanout.mqtt.auth import AccessControl

    ac = AccessControl(net_with(DENY).settings, listener_is_loopback=True, decision_cache_size=100,
                       decision_cache_bytes=10_000)
    p = ac.authenticate("reader", "alice", b"alice-pw")
    for n in range(1000):
        assert ac.can_read(p, f"test/{'x' * 200}/{n}") is True
        assert len(ac._reads.entries) <= 100 and ac._reads.bytes <= 10_000
    assert ac.can_read(p, "test/nosubscribe") is False


def test_deny_rule_holds_for_shared_subscription_members():
    """A member of ``$share/g/test/#`` may subscribe (the filter is allowed) but must not get a message its
    principal may not read: the ACL at delivery holds for shared groups too, and the group's message goes to
    a member that may read it."""
    from fanout.mqtt.packets5 import Subscription

    from tests.unit.test_mqtt5_broker import Client5, publishes
    net = net_with(DENY + (AclRule("subscribe", "test/#", False, user="alice"),))
    members = []
    for cid, user in (("m-alice", "alice"), ("m-ops", "ops")):
        m = Client5(net)
        assert m.connect5(cid, username=user, password=(user + "-pw").encode()).reason_code == 0
        assert m.sub5(Subscription("$share/g/#", 1)) == (1,)
        members.append(m)
    pub = login(net, "pub", "root")
    for i in range(4):
        pub.send(Publish("test/nosubscribe", b"secret", 1, False, False, 10 + i),
                 Publish("test/other", b"fine", 1, False, False, 20 + i))
    alice, ops = (publishes(m.take()) for m in members)
    assert all(not p.topic.startswith("test/") for p in alice), [p.topic for p in alice]
    assert [p.topic for p in ops] == ["test/other"] * 4  # the one member that may read test/other gets all 4
    assert net.broker.state.deliveries_denied >= 4
