"""Call arguments split into inline-sized chunks (actors.ray_args): the bytes come back whole and in order."""
from __future__ import annotations

import os

import pytest

from actors.ray_args import INLINE_ARG_BYTES, chunked, joined, joined_entries, split_entries


@pytest.mark.parametrize("size", [0, 1, INLINE_ARG_BYTES - 1, INLINE_ARG_BYTES, INLINE_ARG_BYTES + 1,
                                  3 * INLINE_ARG_BYTES + 17])
def test_chunked_pieces_fit_and_join_back(size):
    data = os.urandom(size)
    parts = chunked(data)
    assert all(len(p) <= INLINE_ARG_BYTES for p in parts)
    assert len(parts) == max(1, -(-size // INLINE_ARG_BYTES))
    assert joined(parts) == data
    if size <= INLINE_ARG_BYTES:
        assert parts[0] is data  # no copy for what fits


def test_entries_round_trip_with_small_and_large_entries():
    entries = [(7, b"small"), (8, os.urandom(2 * INLINE_ARG_BYTES + 5)), (9, b""), (10, os.urandom(INLINE_ARG_BYTES))]
    index, chunks = split_entries(entries)
    assert [seq for seq, _n in index] == [7, 8, 9, 10] and [n for _s, n in index] == [1, 3, 1, 1]
    assert all(len(c) <= INLINE_ARG_BYTES for c in chunks)
    assert joined_entries(index, chunks) == entries


@pytest.mark.parametrize("index", [[(1, 2)], [(1, 1), (2, 2)], [(1, 0), (2, 1)]])
def test_joined_entries_refuses_an_index_that_does_not_match(index):
    with pytest.raises(ValueError):
        joined_entries(index, [b"a", b"b"][:max(1, sum(n for _s, n in index) - 1)])
