"""DurableTopics: which durable topics a publish goes to, and its partition."""
from __future__ import annotations

from fanout.topics.matcher import DurableTopics
from storage.topics import RECEIPTS, TopicSpec, partition_for

RESP = TopicSpec.build("responses", "ecp/+/response")
ALL_ECP = TopicSpec.build("ecp-all", "ecp/#", partitions=3)
PLANT = TopicSpec.build("plant", "plant/line1")


def test_matches_and_targets():
    d = DurableTopics(2, [RESP, ALL_ECP, PLANT, RECEIPTS])
    assert set(d.specs) == {"responses", "ecp-all", "plant"}  # receipts is the store's own
    assert d.matches("ecp/VIN1/response") and d.matches("ecp/VIN1/heartbeat") and d.matches("plant/line1")
    assert not d.matches("plant/line2") and not d.matches("agent/VIN1/proxy/request/r1")
    got = sorted(d.targets("ecp/VIN1/response", "VIN1"))
    p_resp = partition_for(RESP, "ecp/VIN1/response", "VIN1", 2)
    p_all = partition_for(ALL_ECP, "ecp/VIN1/response", "VIN1", 2)
    assert got == sorted([("responses", p_resp, p_resp % 2), ("ecp-all", p_all, p_all % 2)])
    assert 0 <= p_all < 3
    # the VIN level keys the partition: one vehicle's messages in one partition whoever publishes them
    assert {t[1] for t in d.targets("ecp/VIN1/response", "x") if t[0] == "responses"} == {p_resp}


def test_dollar_topics_and_changes():
    d = DurableTopics(2, [TopicSpec.build("all", "#")])
    assert d.matches("a/b") and not d.matches("$SYS/broker/uptime")  # MQTT-4.7.2-1
    assert d.set_specs([]) is True and not d and not d.matches("a/b")
    assert d.set_specs([]) is False


def test_the_last_level_check_never_rejects_a_match():
    d = DurableTopics(2, [TopicSpec.build("r", "ecp/+/response"), TopicSpec.build("one", "single")])
    assert d.matches("ecp/V/response") and d.matches("single")
    assert not d.matches("ecp/V/heartbeat") and not d.matches("x/single") and not d.matches("ecp/V/x/response")
    d.set_specs([TopicSpec.build("w", "plant/+")])  # ends in a wildcard: every ending may match
    assert d.matches("plant/anything") and not d.matches("plant/a/b")


def test_matched_names_are_remembered_per_topic_bounded_and_forgotten_when_topics_change():
    from fanout.topics import matcher

    d = DurableTopics(2, [RESP, ALL_ECP])
    fresh = DurableTopics(2, [RESP, ALL_ECP])
    topics = [f"ecp/V{i}/response" for i in range(50)]
    assert all(d.matches(t) for t in topics)  # a read buffer's publishes, then their appends
    assert len(d._matched) == 50
    for t in topics:
        assert sorted(d.targets(t, "c")) == sorted(fresh.targets(t, "c"))
    assert len(d._matched) == 50  # remembered for the next publish on the same topic
    d.set_specs([PLANT])  # the topic set changed between the publish and its append: no stale names
    assert d._matched == {} and d.targets("ecp/V1/response", "c") == [] and not d.matches("ecp/V1/response")
    d.set_specs([RESP])
    assert d.matches("ecp/V1/response") and [t[0] for t in d.targets("ecp/V1/response", "c")] == ["responses"]
    small = DurableTopics(2, [RESP], memo_entries=16)
    fleet = [f"ecp/X{i}/response" for i in range(40)]
    for _ in range(2):  # a fleet larger than the memo, publishing in turn: bounded, the resident part kept
        for t in fleet:
            assert small.matches(t) and small.targets(t, "c")[0][0] == "responses"
        assert len(small._matched) == 16 and len(small._targets) == 16
    assert set(fleet[:15]) <= set(small._matched) and set(fleet[:15]) <= set(small._targets)
    assert DurableTopics(2, [RESP])._memo_entries == matcher.MATCHED_MAX
    assert [t[0] for t in d.targets("ecp/X1/response", "c")] == ["responses"]  # forgotten, then walked again
    # a topic that passes the last-level check but matches nothing is remembered as matching nothing
    d.set_specs([RESP, TopicSpec.build("fleet", "fleet/+/response")])
    assert not d.matches("other/V1/response") and d._matched["other/V1/response"] == {}
    assert d.targets("other/V1/response", "c") == []


def test_targets_remembered_only_when_the_topic_keys_every_partition():
    """A topic keyed by its VIN level gives the same targets whoever publishes; one keyed by the client id
    (no such level) must be computed per publisher."""
    by_vin = TopicSpec.build("responses", "ecp/+/response")
    by_client = TopicSpec.build("plant", "plant/line1", partitions=8)  # no wildcard: keyed by the client id
    d = DurableTopics(2, [by_vin, by_client])
    first = d.targets("ecp/VIN7/response", "a")
    assert d.targets("ecp/VIN7/response", "b") == first and "ecp/VIN7/response" in d._targets
    parts = {d.targets("plant/line1", f"client-{i}")[0][1] for i in range(40)}
    assert len(parts) > 1 and "plant/line1" not in d._targets  # spread by client id, never remembered
    assert all(d.targets("plant/line1", f"client-{i}") == [("plant", partition_for(by_client, "plant/line1",
               f"client-{i}", 2), partition_for(by_client, "plant/line1", f"client-{i}", 2) % 2)] for i in range(40))
    d.set_specs([by_client])
    assert d._targets == {} and d.targets("ecp/VIN7/response", "a") == []
