"""The shard count a cluster starts with (actors.shard_count): configured, else the data directory's, else the CPUs'."""
from __future__ import annotations

import json

import pytest

from actors.shard_count import LAYOUT_FILE, choose_shard_count, shards_for_cpus, stored_shard_count


@pytest.mark.parametrize(("cpus", "listeners", "replicas", "want"), [
    (2, 1, 1, 1),     # the benchmarks' machine: one shard (primary + replica) next to one listener
    (1, 1, 1, 1),     # never below one
    (2.0, 1, 0, 1),   # no replicas: a shard is one process
    (8, 1, 0, 7),
    (8, 1, 1, 3),
    (48, 3, 1, 22),   # three 16-CPU machines, one listener each
    (48, 6, 2, 14),
    (16, 0, 1, 8),
])
def test_one_shard_per_one_plus_replicas_cpus_left_by_the_listeners(cpus, listeners, replicas, want):
    assert shards_for_cpus(cpus, listeners, replicas) == want


def _layout(path, shards: int) -> None:
    path.mkdir(parents=True, exist_ok=True)
    (path / LAYOUT_FILE).write_text(json.dumps({"shards": [{"epoch": 1, "primary": {}, "replicas": []}] * shards}))


def test_a_data_directory_without_a_layout_has_no_count(tmp_path):
    assert stored_shard_count(tmp_path) is None
    assert stored_shard_count(tmp_path / "not-created-yet") is None


def test_the_layout_gives_the_count_of_the_existing_store(tmp_path):
    _layout(tmp_path, 3)
    assert stored_shard_count(tmp_path) == 3


@pytest.mark.parametrize("text", ["not json", "[]", '{"shards": []}', '{"shards": 2}', '{"other": 1}'])
def test_a_file_that_is_not_a_layout_is_named_in_the_error(tmp_path, text):
    (tmp_path / LAYOUT_FILE).write_text(text)
    with pytest.raises(RuntimeError, match=r"layout\.json is not a shard layout"):
        stored_shard_count(tmp_path)


def test_configured_count_wins_over_layout_and_cpus(tmp_path):
    _layout(tmp_path, 3)
    assert choose_shard_count(5, tmp_path, 64, 1, 1) == (5, {"source": "fanout.dispatchers"})


def test_auto_takes_the_stored_count_whatever_the_cpus(tmp_path):
    """A store created on 2 CPUs with 3 shards starts again with 3 on a machine whose CPUs say otherwise:
    a VIN's shard is hash(VIN) % shards, so the count of existing data never changes by itself."""
    _layout(tmp_path, 3)
    for cpus in (2, 64):
        assert choose_shard_count(0, tmp_path, cpus, 1, 1) == (3, {"source": LAYOUT_FILE})


def test_auto_without_a_store_sizes_by_the_cpus_and_says_so(tmp_path):
    shards, why = choose_shard_count(0, tmp_path, 8, 1, 1)
    assert shards == 3
    assert why == {"source": "cpus", "cpus": 8, "listener_processes": 1, "replicas": 1}
