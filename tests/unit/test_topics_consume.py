"""``consume`` over the stores of a stopped cluster (LocalLogSource, real LMDB): where a group starts, paging,
acks, independent groups, redelivery without ack, the data dir lock; and the offsets/lag summary."""
from __future__ import annotations

import pytest

from fanout.topics.consume import UnknownTopic, consume, entry_json, parse_start, start_offset
from fanout.topics.local_source import LocalLogSource
from fanout.topics.log_calls import TopicCatalog
from fanout.topics.records import AppendItem
from fanout.topics.summary import lag_of, summarize
from storage import ShardStore
from storage.data_dir_lock import DataDirBusy, DataDirLock
from storage.topics import TopicSpec, partition_for

SPEC = TopicSpec.build("responses", "ecp/+/response")
SHARDS = 2


def _fill(data_dir, per_vin: dict[str, int]) -> dict[int, list[bytes]]:
    """Create the topic and append ``n`` messages per VIN; returns the payloads per partition in order."""
    stores = [ShardStore(data_dir / f"shard-{k}", k, sync=False) for k in range(SHARDS)]
    expected: dict[int, list[bytes]] = {}
    try:
        cats = [TopicCatalog(s, k, SHARDS) for k, s in enumerate(stores)]
        for s, c in zip(stores, cats):
            s.apply(c.create_batch(SPEC, 1))
        for vin, n in per_vin.items():
            topic = f"ecp/{vin}/response"
            p = partition_for(SPEC, topic, vin, SHARDS)
            items = [AppendItem.build("responses", p, topic, vin, 1, f"{vin}:{i}".encode()) for i in range(n)]
            stores[p % SHARDS].apply(cats[p % SHARDS].append_batch(items, 1_700_000_000_000 + n))
            expected.setdefault(p, []).extend(x[5] for x in items)
    finally:
        for s in stores:
            s.close()
    return expected


def _run(data_dir, group, **kw):
    got: list[tuple[int, tuple]] = []
    with LocalLogSource(data_dir, sync=False) as src:
        result = consume(src, "responses", group, emit=lambda p, e: got.append((p, e)), **kw)
    return got, result


@pytest.fixture
def filled(tmp_path):
    return tmp_path, _fill(tmp_path, {f"VIN{i:014d}": 30 for i in range(6)})


def test_earliest_reads_everything_in_offset_order_per_partition(filled):
    data_dir, expected = filled
    got, result = _run(data_dir, "g1", start="earliest", page=7)
    per: dict[int, list[bytes]] = {}
    for p, e in got:
        per.setdefault(p, []).append(e[5])
        assert e[0] == len(per[p]) - 1  # offsets 0, 1, 2, ... in each partition
    assert per == expected and result.emitted == 180
    # one vehicle's messages keep their publish order
    for vin in ("VIN00000000000000", "VIN00000000000003"):
        mine = [e[5] for _p, e in got if e[3] == vin]
        assert mine == [f"{vin}:{i}".encode() for i in range(30)]


def test_latest_and_offset_starts_and_ack_up_to(filled):
    data_dir, expected = filled
    got, _ = _run(data_dir, "late")  # default latest: only what comes after
    assert got == []
    got, _ = _run(data_dir, "from10", start=10, limit=5, ack=True)
    assert len(got) == 5 and all(e[0] >= 10 for _p, e in got)
    # a group with commits resumes after them, whatever --from says; where it has none, --from applies
    acked = {p: e[0] for p, e in got}
    assert len(acked) == 1  # the limit was reached in the first partition read
    again, _ = _run(data_dir, "from10", start="earliest", limit=1000, ack=True)
    first = {}
    for p, e in again:
        first.setdefault(p, e[0])
    assert first == {p: (acked[p] + 1 if p in acked else 0) for p in expected}
    assert len(again) == sum(len(v) - first[p] for p, v in expected.items())
    # everything acknowledged: nothing left
    assert _run(data_dir, "from10", start="earliest")[0] == []


def test_without_ack_the_same_messages_come_again_and_groups_are_independent(filled):
    data_dir, _ = filled
    a1, _ = _run(data_dir, "a", start="earliest", limit=20)
    a2, _ = _run(data_dir, "a", start="earliest", limit=20)
    assert a1 == a2  # crashed (or quit) without acking: redelivered
    b, _ = _run(data_dir, "b", start="earliest", limit=20, ack=True)
    assert b == a1
    b2, _ = _run(data_dir, "b", start="earliest", limit=20, ack=True)
    assert not set((p, e[0]) for p, e in b2) & set((p, e[0]) for p, e in b)
    assert _run(data_dir, "a", start="earliest", limit=20)[0] == a1  # b's acks do not move a


def test_summary_counts_lag(filled):
    data_dir, expected = filled
    _run(data_dir, "g", start="earliest", limit=25, ack=True)
    with LocalLogSource(data_dir, sync=False) as src:
        t = summarize("responses", src.info(["responses"])["responses"])
    assert t["high"] == 180 and t["retained"] == 180
    [g] = t["groups"]
    assert g["group"] == "g" and g["committed"] == 25 and g["lag"] == 155
    assert lag_of(0, 10, None) == 10 and lag_of(3, 10, 9) == 0 and lag_of(5, 10, 2) == 7


def test_data_dir_lock_and_unknown_topic(filled):
    data_dir, _ = filled
    with DataDirLock(data_dir, "fanout up"):
        with pytest.raises(DataDirBusy, match="fanout up"):
            LocalLogSource(data_dir)
    with LocalLogSource(data_dir, sync=False) as src:
        with pytest.raises(UnknownTopic):
            consume(src, "nope", "g", emit=lambda p, e: None)


def test_start_parsing_and_json():
    assert parse_start("earliest") == "earliest" and parse_start("42") == 42
    with pytest.raises(ValueError, match="--from"):
        parse_start("-1")
    assert start_offset("earliest", 5, 9, None) == 5 and start_offset("latest", 5, 9, None) == 9
    assert start_offset(2, 5, 9, None) == 5 and start_offset(7, 5, 9, None) == 7 and start_offset(0, 5, 9, 6) == 7
    e = (3, 1000, "ecp/V/response", "V", 1, b"\xff\x00", None)
    assert entry_json("t", 1, e) == {"topic": "t", "partition": 1, "offset": 3, "ts_ms": 1000,
                                     "mqtt_topic": "ecp/V/response", "client_id": "V", "payload_b64": "/wA="}
    assert entry_json("t", 1, (*e[:5], "hé".encode(), None))["payload"] == "hé"


# -- reading ahead (a source with read_nowait: the running cluster's) -------------------------------------------
class _ReadAhead:
    """A LocalLogSource that can also start a read without waiting (answered when waited for, as Ray's would)."""

    def __init__(self, src):
        self.src, self.reads, self.ahead, self.used = src, 0, 0, 0

    def info(self, names):
        return self.src.info(names)

    def read(self, requests):
        self.reads += 1
        return self.src.read(requests)

    def read_nowait(self, requests):
        self.ahead += 1

        def wait():
            self.used += 1
            return self.src.read(requests)
        return wait

    def commit(self, items):
        return self.src.commit(items)


@pytest.mark.parametrize("kw", [{}, {"limit": 100}, {"limit": 7}, {"ack": True}])
def test_reading_ahead_gives_what_reading_in_turn_gives(filled, kw):
    data_dir, _ = filled
    plain, r1 = _run(data_dir, "plain", start="earliest", page=7, **kw)
    with LocalLogSource(data_dir, sync=False) as src:
        ahead = _ReadAhead(src)
        got: list[tuple[int, tuple]] = []
        r2 = consume(ahead, "responses", "ahead", start="earliest", page=7, emit=lambda p, e: got.append((p, e)), **kw)
    assert got == plain and r2.emitted == r1.emitted and r2.positions == r1.positions
    if "limit" not in kw or kw["limit"] > 7:
        assert ahead.reads == 1 and ahead.used >= 2  # after the first page every page was read ahead
    assert ahead.used <= ahead.ahead


def test_a_page_with_missing_offsets_is_read_again_not_skipped():
    """Offsets inside a partition are consecutive in this store (pruning takes a prefix); a source whose are not
    makes the guessed next request wrong: that answer is dropped and the right page is read."""
    import msgpack

    from fanout.topics.consume import page_span

    offsets = [0, 1, 2, 5, 6, 9, 10, 11]

    def page(start, want):
        chosen = [o for o in offsets if o >= start][:want]
        body = b"".join(b"\x92\xcf" + o.to_bytes(8, "big") + msgpack.packb([1, "t/a", "c", 1, b"%d" % o, None])
                        for o in chosen)
        return bytes((0x90 | len(chosen),)) + body

    class Holes:
        reads = 0
        asked: list[tuple] = []

        def info(self, names):
            return {"responses": {"spec": {"partitions": 1}, "partitions": {0: [0, 12]}, "groups": {}}}

        def read(self, requests):
            self.reads += 1
            self.asked.extend(requests)
            return [(page(r[2], r[3]), 0, 12) for r in requests]

        def read_nowait(self, requests):
            answer = self.read(requests)
            return lambda: answer

        def commit(self, items):
            return len(items)

    assert page_span(page(0, 3)) == (0, 3) and page_span(b"\x90") is None and page_span(b"\x93\x01") is None
    src = Holes()
    got: list[int] = []
    r = consume(src, "responses", "g", start="earliest", page=3, emit=lambda p, e: got.append(e[0]))
    assert got == offsets and r.emitted == len(offsets)
    # read 0 -> [0, 1, 2]; ahead 3 (right) -> [5, 6, 9]; ahead 8 (wrong: 10 follows 9), dropped; read 10 -> [10, 11]
    assert [a[2] for a in src.asked] == [0, 3, 8, 10] and src.reads == 4
