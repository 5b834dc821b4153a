"""Random sequences of topic ops against a real store, a replica fed the batch bytes, and a plain Python model
(hypothesis): offsets are dense and never reused, reads skip exactly the pruned entries, commits never move a group
back, and the replica ends byte-identical."""
from __future__ import annotations

import tempfile

from hypothesis import given, settings, strategies as st

from storage import ShardStore, WriteBatch
from storage.replication_protocol import Ack, ReplicaApplier, table_digests

T0 = 1_700_000_000_000
PARTITIONS = (0, 1, 2)
GROUPS = ("g", "h")

OPS = st.lists(st.one_of(
    st.tuples(st.just("append"), st.sampled_from(PARTITIONS), st.integers(0, 4)),
    st.tuples(st.just("commit"), st.sampled_from(GROUPS), st.sampled_from(PARTITIONS), st.integers(0, 12)),
    st.tuples(st.just("reset"), st.sampled_from(GROUPS), st.sampled_from(PARTITIONS), st.integers(0, 12)),
    st.tuples(st.just("prune"), st.sampled_from(PARTITIONS), st.integers(0, 14)),
), max_size=30)


@settings(max_examples=80, deadline=None)
@given(st.lists(OPS, min_size=1, max_size=4))
def test_topic_ops_match_a_model_and_a_replica(batches):
    with tempfile.TemporaryDirectory() as tmp:
        primary, replica_store = ShardStore(f"{tmp}/p", 0, sync=False), ShardStore(f"{tmp}/r", 0, sync=False)
        replica = ReplicaApplier(replica_store)
        logs: dict[int, dict[int, bytes]] = {p: {} for p in PARTITIONS}  # the model
        nxt = dict.fromkeys(PARTITIONS, 0)
        committed: dict[tuple[str, int], int] = {}
        try:
            for n, ops in enumerate(batches):
                b = WriteBatch()
                expected_ranges = []
                for i, op in enumerate(ops):
                    kind = op[0]
                    if kind == "append" and op[2]:
                        _, p, k = op
                        payloads = [f"{n}.{i}.{j}".encode() for j in range(k)]
                        b.topic_append("t", p, T0 + n, [("a/b", "c", 1, x, None) for x in payloads])
                        expected_ranges.append(("t", p, nxt[p], nxt[p] + k - 1))
                        logs[p].update(zip(range(nxt[p], nxt[p] + k), payloads))
                        nxt[p] += k
                    elif kind == "commit":
                        _, g, p, off = op
                        b.topic_commit("t", g, p, off, T0 + n)
                        committed[g, p] = max(committed.get((g, p), -1), off)
                    elif kind == "reset":
                        _, g, p, off = op
                        b.topic_reset("t", g, p, off, T0 + n)
                        committed[g, p] = off
                    elif kind == "prune":
                        _, p, below = op
                        b.topic_prune_if("t", p, below)
                        logs[p] = {o: x for o, x in logs[p].items() if o >= below}
                result = primary.apply(b)
                assert result.topic_offsets == expected_ranges
                assert replica.apply(1, result.seq, b.to_bytes()) == Ack(result.seq)
            for p in PARTITIONS:
                got = primary.topic_read("t", p, 0, 1_000)
                assert {e.offset: e.payload for e in got} == logs[p]
                assert [e.offset for e in got] == sorted(logs[p])
                assert primary.topic_bounds("t", p) == (min(logs[p], default=nxt[p]), nxt[p])
                for g in GROUPS:
                    assert primary.topic_committed("t", g, p) == committed.get((g, p))
            assert table_digests(primary) == table_digests(replica_store)
        finally:
            primary.close()
            replica_store.close()
