"""Key encodings: byte order equals tuple order, round trips, clear errors on bad input."""
from __future__ import annotations

import string
import zlib

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from storage import keys

vins = st.text(alphabet=string.ascii_uppercase + string.digits + "-_", min_size=1, max_size=20)
ascii_vins = st.text(alphabet=st.characters(min_codepoint=1, max_codepoint=127), min_size=1, max_size=20)
request_ids = st.text(alphabet=st.characters(blacklist_characters="\x00", blacklist_categories=("Cs",)),
                      min_size=1, max_size=30)
timestamps = st.integers(min_value=0, max_value=keys.MAX_TS_MS)


@settings(max_examples=150, deadline=None)
@given(st.lists(st.tuples(ascii_vins, timestamps, request_ids), min_size=2, max_size=40))
def test_ids_keys_sort_like_tuples(rows):
    encoded = sorted(rows, key=lambda r: keys.ids_key(*r))
    assert encoded == sorted(rows)


@settings(max_examples=150, deadline=None)
@given(st.lists(st.tuples(request_ids, ascii_vins), min_size=2, max_size=40))
def test_reqs_keys_sort_like_tuples(rows):
    assert sorted(rows, key=lambda r: keys.reqs_key(*r)) == sorted(rows)


@given(ascii_vins, timestamps, request_ids)
def test_ids_key_round_trip(vin, ts_ms, request_id):
    key = keys.ids_key(vin, ts_ms, request_id)
    assert keys.decode_ids_key(key) == (vin, ts_ms, request_id)
    assert key.startswith(keys.vin_prefix(vin))


@given(request_ids, ascii_vins)
def test_reqs_key_round_trip(request_id, vin):
    key = keys.reqs_key(request_id, vin)
    assert keys.decode_reqs_key(key) == (request_id, vin)
    assert key.startswith(keys.request_prefix(request_id))


@given(vins, vins, timestamps, request_ids)
def test_vin_prefix_matches_only_its_vin(vin, other, ts_ms, request_id):
    key = keys.ids_key(other, ts_ms, request_id)
    assert key.startswith(keys.vin_prefix(vin)) == (vin == other)


def test_common_prefix_vins_do_not_mix():
    a1 = keys.ids_key("A1", 2**63, "z")
    a10 = keys.ids_key("A10", 0, "a")
    assert a1 < a10
    assert not a10.startswith(keys.vin_prefix("A1"))


def test_ts_is_big_endian_fixed_width():
    assert keys.ids_key("V", 255, "r") < keys.ids_key("V", 256, "r")
    assert len(keys.ids_key("V", 0, "r")) == len("V") + 1 + 8 + 1


@pytest.mark.parametrize("vin", ["", "A\x00B", "VÄN", "x" * (keys.MAX_VIN_BYTES + 1), None, 17])
def test_bad_vin(vin):
    with pytest.raises(ValueError, match="vin"):
        keys.ids_key(vin, 1, "r")


@pytest.mark.parametrize("request_id", ["", "a\x00b", "é" * 200, None])
def test_bad_request_id(request_id):
    with pytest.raises(ValueError, match="request_id"):
        keys.reqs_key(request_id, "VIN1")


@pytest.mark.parametrize("ts_ms", [-1, 2**64, 1.5, True, "1"])
def test_bad_timestamp(ts_ms):
    with pytest.raises(ValueError, match="ts_ms"):
        keys.ids_key("VIN1", ts_ms, "r")


def test_check_vins_reports_the_offender():
    keys.check_vins(["A", "B" * keys.MAX_VIN_BYTES])
    for bad in (["A", ""], ["A", "B\x00"], ["A", "Ü"], ["A", 3], ["A", "x" * (keys.MAX_VIN_BYTES + 1)]):
        with pytest.raises(ValueError, match="vin"):
            keys.check_vins(bad)


def test_decode_rejects_garbage():
    with pytest.raises(ValueError):
        keys.decode_ids_key(b"no-separator")
    with pytest.raises(ValueError):
        keys.decode_ids_key(b"V\x00short")
    with pytest.raises(ValueError):
        keys.decode_reqs_key(b"nosep")


def test_shard_of_is_crc32_and_stable():
    assert keys.shard_of("WVW00000000000001", 7) == zlib.crc32(b"WVW00000000000001") % 7
    assert {keys.shard_of(f"V{i}", 4) for i in range(100)} == {0, 1, 2, 3}
    with pytest.raises(ValueError):
        keys.shard_of("V", 0)


def test_retained_key_long_topics_hash_without_collision():
    short = "a/b/c"
    assert keys.retained_key(short) == b"a/b/c"
    long_a, long_b = "t/" + "a" * 1000, "t/" + "a" * 999 + "b"
    ka, kb = keys.retained_key(long_a), keys.retained_key(long_b)
    assert ka != kb and ka.startswith(b"\x00") and len(ka) == 33
    with pytest.raises(ValueError):
        keys.retained_key("a\x00b")


def test_key_after_is_the_next_key():
    assert keys.key_after(b"ab") > b"ab"
    assert keys.key_after(b"ab") < b"ab\x00\x00" < b"ac"
