"""``fanout topics`` / ``fanout consume`` without a cluster: argument checks, and ``consume --data-dir`` on real
stores (JSON lines, ``--ack``, the data dir lock)."""
from __future__ import annotations

import json

from cluster.cli import main
from fanout.topics.log_calls import TopicCatalog
from fanout.topics.records import AppendItem
from storage import ShardStore
from storage.data_dir_lock import DataDirLock
from storage.topics import TopicSpec, partition_for

SPEC = TopicSpec.build("responses", "ecp/+/response")


def _store(data_dir, payloads):
    stores = [ShardStore(data_dir / f"shard-{k}", k, sync=False) for k in range(2)]
    try:
        cats = [TopicCatalog(s, k, 2) for k, s in enumerate(stores)]
        for s, c in zip(stores, cats):
            s.apply(c.create_batch(SPEC, 1))
        topic = "ecp/VINCLI0000000001/response"
        p = partition_for(SPEC, topic, "VINCLI0000000001", 2)
        items = [AppendItem.build("responses", p, topic, "VINCLI0000000001", 1, x) for x in payloads]
        stores[p % 2].apply(cats[p % 2].append_batch(items, 1_700_000_000_000))
    finally:
        for s in stores:
            s.close()


def test_bad_arguments_exit_2_before_any_cluster_is_asked(capsys, tmp_path):
    assert main(["topics", "create", "t", "--filter", "$SYS/#", "--data-dir", str(tmp_path)]) == 2
    assert "topic.filter" in capsys.readouterr().err
    assert main(["topics", "create", "t", "--filter", "a/#", "--retention", "soon", "--data-dir", str(tmp_path)]) == 2
    assert "topic.retention" in capsys.readouterr().err
    assert main(["consume", "t", "--group", "g", "--from", "yesterday", "--data-dir", str(tmp_path)]) == 2
    assert "--from must be earliest, latest or an offset" in capsys.readouterr().err
    assert main(["consume", "t", "--group", "g", "--data-dir", str(tmp_path)]) == 1  # no shard stores there
    assert "no shard" in capsys.readouterr().err


def test_consume_data_dir_prints_json_lines_and_acks(capsys, tmp_path):
    _store(tmp_path, [b"a", b"b", b"\x80"])
    args = ["consume", "responses", "--group", "g", "--from", "earliest", "--json", "--data-dir", str(tmp_path)]
    assert main([*args, "--limit", "2", "--ack"]) == 0
    lines = [json.loads(x) for x in capsys.readouterr().out.splitlines()]
    assert [(x["offset"], x["payload"]) for x in lines] == [(0, "a"), (1, "b")]
    assert lines[0]["mqtt_topic"] == "ecp/VINCLI0000000001/response" and lines[0]["client_id"] == "VINCLI0000000001"
    assert main(args) == 0  # resumes after the ack
    [last] = [json.loads(x) for x in capsys.readouterr().out.splitlines()]
    assert (last["offset"], last["payload_b64"]) == (2, "gA==") and "payload" not in last
    assert main(["consume", "nope", "--group", "g", "--data-dir", str(tmp_path)]) == 2
    assert "no durable topic 'nope'" in capsys.readouterr().err


def test_consume_data_dir_held_by_a_cluster_that_cannot_be_reached_is_refused(capsys, tmp_path):
    _store(tmp_path, [b"a"])
    (tmp_path / "ray_address").write_text("127.0.0.1:1\n")
    with DataDirLock(tmp_path, "fanout up"):
        assert main(["consume", "responses", "--group", "g", "--data-dir", str(tmp_path)]) == 1
    err = capsys.readouterr().err
    assert "in use by fanout up" in err and "cannot be reached" in err
