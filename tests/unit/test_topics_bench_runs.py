"""benchmarks.topics_bench's append runs: one key per (publishers, window), the 4-publisher keys unchanged.

The results of every earlier run (benchmarks/results, docs/topics.md) name the 4-publisher figures
``append_msgs_per_s_w32`` / ``_w256``; the runs with more publishers must not take those names, and no two runs
may share a key (one would overwrite the other in the JSON)."""
from __future__ import annotations

from benchmarks import topics_bench as tb


def test_the_default_publishers_keep_the_historical_keys() -> None:
    assert tb.append_suffix(tb.PUBLISHERS, 32) == "w32"
    assert tb.append_suffix(tb.PUBLISHERS, 256) == "w256"
    assert tb.append_suffix(16, 32) == "p16_w32"


def test_every_append_run_has_its_own_key_and_many_publishers_are_measured() -> None:
    suffixes = [tb.append_suffix(p, w) for p, w in tb.APPEND_RUNS]
    assert len(set(suffixes)) == len(tb.APPEND_RUNS)
    assert {(tb.PUBLISHERS, w) for w in tb.WINDOWS} <= set(tb.APPEND_RUNS)
    assert max(p for p, _w in tb.APPEND_RUNS) >= 16  # issue 14's "many publishers"
