"""Topic records on the wire: a consumer's page (storage.topics.read_log_packed -> records.page_entries) gives the
same entries as the decoded read, for every size of page and every kind of entry."""
from __future__ import annotations

import pytest

from fanout.topics.log_calls import TopicCatalog
from fanout.topics.records import EMPTY_PAGE, ReadRequest, ReadResult, page_entries
from storage import WriteBatch
from storage.topics import TopicSpec

T0 = 1_700_000_000_000


def decoded(store, partition, start, limit, **kw):
    return [(e.offset, e.ts_ms, e.mqtt_topic, e.client_id, e.qos, e.payload, e.properties)
            for e in store.topic_read("resp", partition, start, limit, **kw)]


def packed(store, partition, start, limit, **kw):
    page, n = store.topic_read_packed("resp", partition, start, limit, **kw)
    entries = page_entries(page)
    assert len(entries) == n
    return entries


@pytest.mark.parametrize("n", [0, 1, 15, 16, 70_000 // 1000, 65_536 + 3])
def test_a_page_of_any_size_decodes_to_the_entries_read_log_gives(store, n):
    # 15/16 and 65,535/65,536 are where the msgpack array header changes form (fixarray, array 16, array 32)
    items = [(f"ecp/V{i % 7}/response", f"V{i % 7}", i % 2, bytes([i % 256]) * (i % 5), None) for i in range(n)]
    for k in range(0, n, 20_000):
        store.apply(WriteBatch().topic_append("resp", 0, T0 + k, items[k:k + 20_000]))
    assert packed(store, 0, 0, 100_000) == decoded(store, 0, 0, 100_000)
    assert len(packed(store, 0, 0, 100_000)) == n


def test_properties_non_utf8_payloads_and_offsets_past_32_bits(store):
    props = [["user_property", ["k", "v"]], ["content_type", "text/plain"], ["correlation_data", b"\x01\xff"],
             ["payload_format_indicator", 1], ["response_topic", "r/1"]]
    store.apply(WriteBatch().topic_append("resp", 3, T0, [("ecp/V1/response", "V1", 1, b"\xff\x00\xfe", props),
                                                          ("ecp/V2/response", "cli-ü", 0, b"", None)]))
    got = packed(store, 3, 0, 10)
    assert got == decoded(store, 3, 0, 10)
    assert got[0][5] == b"\xff\x00\xfe" and got[0][6] == props and got[1][3] == "cli-ü"


def test_from_offset_limit_and_the_byte_cap_keep_at_least_one_entry(store):
    store.apply(WriteBatch().topic_append("resp", 0, T0, [("t/a", "c", 1, b"x" * 100, None) for _ in range(10)]))
    assert [e[0] for e in packed(store, 0, 4, 3)] == [4, 5, 6]
    assert [e[0] for e in packed(store, 0, 8, 100)] == [8, 9]
    assert packed(store, 0, 10, 100) == [] and packed(store, 0, 0, 0) == [] and packed(store, 1, 0, 10) == []
    one = len(store.topic_read_packed("resp", 0, 0, 1)[0]) - 1  # one pair's bytes (minus the array header)
    assert [e[0] for e in packed(store, 0, 0, 100, max_bytes=1)] == [0]  # at least one
    assert len(packed(store, 0, 0, 100, max_bytes=3 * one)) == 3  # stored bytes, not payload bytes: fewer than 100 B


def test_the_catalog_answers_with_pages_within_its_byte_budget(store, monkeypatch):
    from fanout.topics import log_calls

    store.apply(WriteBatch().create_topic(TopicSpec.build("resp", "ecp/+/response", partitions=2), T0))
    store.apply(WriteBatch().topic_append("resp", 0, T0, [("ecp/V/response", "V", 1, b"y" * 1000, None)] * 30))
    store.apply(WriteBatch().topic_append("resp", 1, T0, [("ecp/W/response", "W", 1, b"z" * 1000, None)] * 30))
    catalog = TopicCatalog(store, 0, 1)
    monkeypatch.setattr(log_calls, "MAX_READ_BYTES", 20_000)  # ~19 entries: the first request takes most of it
    requests = [ReadRequest.build("resp", 0, 0, 100), ReadRequest.build("resp", 1, 0, 100),
                ReadRequest.build("resp", 1, 5, 100)]
    answers = [ReadResult(*r) for r in catalog.read(requests)]
    first, second, third = (page_entries(a.entries) for a in answers)
    assert 15 <= len(first) <= 20 and [e[0] for e in first] == list(range(len(first)))
    assert [e[0] for e in second] == [0]  # what is left of the budget is under one entry: at least one
    assert third == [] and answers[2].entries == EMPTY_PAGE and (answers[2].low, answers[2].next) == (0, 30)


def test_a_malformed_page_is_a_value_error():
    for bad in (b"\xc1", b"\x91\x01", b"\x92"):
        with pytest.raises(ValueError):
            page_entries(bad)
