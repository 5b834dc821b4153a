"""Ring: bounded FIFO that refuses (never drops) when full."""
from __future__ import annotations

import pytest
from hypothesis import given, strategies as st

from fanout.client.ring import Ring


def test_push_pop_fifo_and_refuse_when_full() -> None:
    r: Ring[int] = Ring(3)
    assert [r.push(i) for i in range(5)] == [True, True, True, False, False]
    assert r.full() and len(r) == 3 and r.peek() == 0
    assert r.pop() == 0
    assert r.push(9)
    assert r.drain() == [1, 2, 9]
    assert len(r) == 0 and r.peek() is None and not r.full()


def test_pop_empty_raises_and_capacity_checked() -> None:
    with pytest.raises(IndexError):
        Ring(1).pop()
    with pytest.raises(ValueError):
        Ring(0)


@given(st.lists(st.one_of(st.integers(0, 1000), st.none()), max_size=200), st.integers(1, 20))
def test_ring_is_a_bounded_prefix_preserving_queue(ops: list[int | None], cap: int) -> None:
    """Model check: None = pop; a value = push. Accepted pushes come out in order, none lost."""
    r: Ring[int] = Ring(cap)
    model: list[int] = []
    for op in ops:
        if op is None:
            if model:
                assert r.pop() == model.pop(0)
        else:
            accepted = r.push(op)
            assert accepted == (len(model) < cap)
            if accepted:
                model.append(op)
        assert len(r) == len(model) <= cap
    assert list(r) == model
