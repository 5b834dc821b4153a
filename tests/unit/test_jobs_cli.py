"""``fanout gc``/``export``/``report`` without Spark: argument handling, export, rendering of summaries."""
from __future__ import annotations

import json
import os

from rich.console import Console

from cluster.cli import build_parser, main
from fanout.cli.jobs import print_report, print_summary
from storage import ShardStore, WriteBatch
from storage.data_dir_lock import DataDirLock
from storage.jobs.export import read_watermarks

T0 = 1_700_000_000_000


def test_commands_are_registered():
    parser = build_parser()
    args = parser.parse_args(["gc", "--now", "--dry-run", "--data-dir", "d"])
    assert args.now and args.dry_run and args.data_dir == "d" and not args.live
    assert parser.parse_args(["report", "--request", "r1"]).request == "r1"
    assert parser.parse_args(["export", "--out", "x"]).out == "x"


def test_export_command_writes_every_shard(tmp_path, capsys):
    for k in (0, 1):
        with ShardStore(tmp_path / "data" / f"shard-{k}", k, sync=False) as s:
            s.apply(WriteBatch().put_blob("d", b"x", T0).enqueue_many([f"V{k}a", f"V{k}b"], T0, "r", "d"))
    assert main(["export", "--data-dir", str(tmp_path / "data"), "--out", str(tmp_path / "out")]) == 0
    marks = read_watermarks(tmp_path / "out")
    assert sorted(marks) == [0, 1] and all(m["rows"]["ids"] == 2 and m["applied_seq"] == 1 for m in marks.values())
    assert "exported 12 rows from 2 shard(s)" in capsys.readouterr().out  # 5 per shard + the receipts catalog row


def test_gc_and_export_without_shards_fail_cleanly(tmp_path, capsys):
    assert main(["gc", "--data-dir", str(tmp_path / "nothing")]) == 1
    assert main(["export", "--data-dir", str(tmp_path / "nothing"), "--out", str(tmp_path / "o")]) == 1
    err = capsys.readouterr().err
    assert "fanout: gc: no shard-<k> store under" in err and "fanout: export:" in err


def test_offline_gc_refuses_a_data_dir_that_fanout_up_holds(tmp_path, capsys):
    """Refused before any Spark start, naming the holder and ``--live``; the stores stay untouched."""
    data = tmp_path / "data"
    with ShardStore(data / "shard-0", 0, sync=False) as s:
        s.apply(WriteBatch().put_blob("d", b"x", T0).enqueue_many(["V1"], T0, "r", "d"))
    with DataDirLock(data, "fanout up"):
        assert main(["gc", "--now", "--data-dir", str(data)]) == 1
    err = capsys.readouterr().err
    assert f"fanout: gc: the data dir {data} is in use by fanout up (pid {os.getpid()})" in err
    assert f"fanout gc --live --data-dir {data}" in err
    assert not (data / "export").exists()


def _render(fn, *args) -> str:
    console = Console(record=True, width=140)
    fn(console, *args)
    return console.export_text()


def test_print_summary_shows_plan_applied_and_stages():
    summary = {
        "plan_id": "abcdef0123456789", "cutoff_ms": T0, "dry_run": False, "shards": [0, 1],
        "planned": {"delete_ids/expired": 1200, "delete_blob/expired": 1}, "content_dup_groups": 2,
        "applied": {0: {"batches": 1, "counts": {"deleted": 1000, "guard_skipped": 1}},
                    1: {"batches": 1, "counts": {"deleted": 200}}},
        "refused": {}, "stage_s": {"export": 1.5, "plan": 2.25}, "exported_rows": 5000, "deleted": 1200,
        "repointed": 0, "skipped": 1,
    }
    text = _render(print_summary, summary)
    assert "abcdef012345" in text and "2023-11-14 22:13:20Z" in text
    assert "delete_ids" in text and "1,200" in text and "content-duplicate blob groups: 2" in text
    assert "exported 5,000 rows from 2 shard(s); deleted 1,200, repointed 0, kept 1; export 1.50s, plan 2.25s" in text
    dry = _render(print_summary, {**summary, "dry_run": True, "planned": {}})
    assert "would delete (dry run)" in dry and "nothing to collect" in dry and "applied" not in dry


def test_print_report_table():
    rows = [{"request_id": "req-A", "queued": 1200, "delivered": 10, "pending": 2, "expired": 0, "discarded": 3471,
             "cancelled": 5289, "p50_ms": 550.0, "p95_ms": 955.0, "p99_ms": 991.0}]
    text = _render(print_report, rows)
    assert "req-A" in text and "1,200" in text and "955.0" in text
    assert "discarded" in text and "cancelled" in text and "3,471" in text and "5,289" in text
    assert "-" in _render(print_report, [{**rows[0], "p50_ms": None, "p95_ms": None, "p99_ms": None}])
    with_receipts = _render(print_report, [{**rows[0], "receipts_delivered": 1010, "receipts_expired": 2,
                                            "receipts_discarded": 0, "receipts_cancelled": 7}])
    assert "receipts d/e/x/c" in with_receipts and "1,010/2/0/7" in with_receipts
    assert json.dumps(rows)  # report rows are JSON-able as printed by --json
