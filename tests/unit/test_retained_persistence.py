"""Retained messages: change tracking in the sans-I/O store and the per-node files on disk."""
from __future__ import annotations

from fanout.mqtt.retained import RetainedStore
from storage.retained import RetainedFile, load_retained, retained_dir


def test_changes_are_tracked_only_after_track_changes_and_skip_sys():
    s = RetainedStore()
    s.set("before", b"x", 1)
    s.track_changes()
    s.set("a", b"1", 1)
    s.set("a", b"2", 0)
    s.set("before", b"", 0)
    s.set("never-there", b"", 0)  # clearing nothing is no change
    s.set("$SYS/broker/uptime", b"5", 0)
    assert s.take_changes() == {"a": (b"2", 0), "before": None}
    assert s.take_changes() == {}


def test_requeue_keeps_newer_changes():
    s = RetainedStore()
    s.track_changes()
    s.set("a", b"1", 1)
    lost = s.take_changes()
    s.set("a", b"2", 1)
    s.requeue(lost)
    assert s.take_changes() == {"a": (b"2", 1)}


def test_union_of_node_files_newest_wins_and_tombstones_hide(tmp_path):
    d = retained_dir(tmp_path)
    a, b = RetainedFile(d / "n0.lmdb"), RetainedFile(d / "n1.lmdb")
    a.write({"cfg": (b"v1", 1), "gone": (b"old", 1), "only-a": (b"A", 0)}, now_ms=1000)
    b.write({"cfg": (b"v2", 1)}, now_ms=2000)
    b.write({"gone": None}, now_ms=3000)
    a.close()
    b.close()
    assert load_retained(tmp_path) == {"cfg": (b"v2", 1), "only-a": (b"A", 0)}


def test_no_folder_no_messages(tmp_path):
    assert load_retained(tmp_path / "nothing") == {}
