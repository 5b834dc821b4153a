"""Submission: validation naming the argument, trigger chunks, outbox record round trip."""
from __future__ import annotations

import hashlib
import json

import pytest
from hypothesis import given, strategies as st

from fanout.client.errors import FanoutRejected, SubmissionInvalid, describe_cluster_error
from fanout.client.submission import (
    Submission,
    default_data_id,
    iter_trigger_payloads,
    make_submission,
    parse_cluster_error,
)
from fanout.trigger import TriggerError, errors_topic, parse_trigger


def test_defaults_data_id_is_sha1_and_str_payload_is_utf8() -> None:
    s = make_submission(7, iter(["A", "B"]), "héllo", "r", None, 5)
    assert s.payload == "héllo".encode() and s.data_id == hashlib.sha1("héllo".encode()).hexdigest()
    assert s.vins == ["A", "B"] and s.seq == 7 and s.ts_ms == 5 and not s.durable


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"vins": "WVW123"}, "vins"),
        ({"vins": []}, "vins"),
        ({"vins": 5}, "vins"),
        ({"vins": ["A", "", "C"]}, "vins[1]"),
        ({"vins": ["A", "B", "C", 4]}, "vins[3]"),
        ({"payload": 12}, "payload"),
        ({"request_id": ""}, "request_id"),
        ({"request_id": "a/#"}, "request_id"),
        ({"data_id": "a/b"}, "data_id"),
        ({"data_id": "x+"}, "data_id"),
        ({"data_id": ""}, "data_id"),
        # issue 12: ids the cluster rejects (fanout.trigger's topic-level rule) are refused here, before
        # they reach the wire, where the cluster's reply closes the connection of every in-flight submission
        ({"request_id": "a/b"}, "request_id"),
        ({"request_id": "a\tb"}, "request_id"),
        ({"request_id": "x" * 129}, "request_id"),
        ({"request_id": "é" * 65}, "request_id"),  # 130 bytes of UTF-8
        ({"request_id": "\ud800"}, "request_id"),
        ({"request_id": "a\x85"}, "request_id"),
        ({"data_id": "a\tb"}, "data_id"),
        ({"data_id": "d" * 129}, "data_id"),
    ],
)
def test_invalid_arguments_name_the_field(kwargs: dict, field: str) -> None:
    args = {"vins": ["A"], "payload": b"p", "request_id": "r", "data_id": None} | kwargs
    with pytest.raises(SubmissionInvalid) as info:
        make_submission(1, args["vins"], args["payload"], args["request_id"], args["data_id"], 0)
    assert info.value.field == field and str(info.value).startswith(f"{field}: ")
    assert isinstance(info.value, ValueError)


@given(st.text(max_size=140), st.text(max_size=140))
def test_request_and_data_ids_accepted_exactly_when_the_cluster_accepts_them(rid: str, did: str) -> None:
    """The client's rule is the cluster's: a trigger it would send parses, one it refuses does not."""
    try:
        parse_trigger(json.dumps({"ids": ["V1"], "request_id": rid, "data_id": did}).encode())
    except TriggerError as exc:
        cluster_field: str | None = exc.field
    else:
        cluster_field = None
    try:
        make_submission(1, ["V1"], b"p", rid, did, 0)
    except SubmissionInvalid as exc:
        client_field: str | None = exc.field
    else:
        client_field = None
    assert client_field == cluster_field


def test_trigger_chunks_share_request_id_and_cover_all_vins() -> None:
    vins = [f"V{i}" for i in range(10)]
    chunks = [json.loads(p) for p in iter_trigger_payloads(vins, "req", "d", 4)]
    assert [len(c["ids"]) for c in chunks] == [4, 4, 2]
    assert all(set(c) == {"ids", "request_id", "data_id"} and c["request_id"] == "req" and c["data_id"] == "d" for c in chunks)
    assert [v for c in chunks for v in c["ids"]] == vins


@pytest.mark.parametrize("max_bytes", [200, 1000, 20_000])
def test_triggers_also_split_by_bytes_to_fit_the_packet_size(max_bytes: int) -> None:
    vins = [f"WVWZZZ1JZ{i:08d}" for i in range(3000)] + ["ü" * 30]  # non-ASCII grows when escaped
    docs = list(iter_trigger_payloads(vins, "req", "d", 1_000_000, max_bytes))
    assert all(len(d) <= max_bytes or len(json.loads(d)["ids"]) == 1 for d in docs)
    assert [v for d in docs for v in json.loads(d)["ids"]] == vins
    assert len(docs) < 3 * (len(b"".join(docs)) // max_bytes + 2)  # chunks are reasonably full


def test_a_single_oversized_vin_is_sent_alone() -> None:
    docs = list(iter_trigger_payloads(["A", "B" * 500, "C"], "r", "d", 10, 100))
    assert [json.loads(d)["ids"] for d in docs] == [["A"], ["B" * 500], ["C"]]


@given(
    st.lists(st.text(min_size=1, max_size=20), min_size=1, max_size=50),
    st.binary(max_size=300),
    st.text(st.characters(blacklist_categories=("Cc", "Cs"), blacklist_characters="/+#"), min_size=1, max_size=32),
    st.integers(1, 2**62),
)
def test_pack_unpack_round_trip(vins: list[str], payload: bytes, rid: str, seq: int) -> None:
    s = make_submission(seq, vins, payload, rid, None, 123)
    back = Submission.unpack(seq, s.pack())
    assert (back.seq, back.vins, back.payload, back.request_id, back.data_id, back.ts_ms) == (seq, vins, payload, rid, s.data_id, 123)
    assert back.durable and back.data_id == default_data_id(payload)


def test_unpack_rejects_unknown_version() -> None:
    import msgpack

    with pytest.raises(ValueError):
        Submission.unpack(1, msgpack.packb([99, 0, "r", "d", b"", []]))


def test_cluster_error_parsing_and_exception_names_field() -> None:
    raw = b'{"error": "invalid_trigger", "field": "ids[17]", "reason": "not a VIN", "request_id": "r1"}'
    detail = parse_cluster_error(raw)
    assert describe_cluster_error(detail) == "invalid_trigger: ids[17]: not a VIN"
    exc = FanoutRejected(4, "r1", 1, detail)
    assert exc.field == "ids[17]" and exc.reason == "not a VIN" and "ids[17]" in str(exc)
    assert parse_cluster_error(b"\xff nope")["error"] == "unparsable_error"
    assert parse_cluster_error(b"[1]")["error"] == "unparsable_error"
    assert errors_topic("c1") == "$SDV-FANOUT/errors/c1"
