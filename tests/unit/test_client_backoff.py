"""Retry policy: 1, 2, 4, 8 s ... then dead letter after max_attempts."""
from __future__ import annotations

import pytest

from fanout.client.backoff import RetryPolicy


def test_default_schedule_is_1_2_4_8_then_dead() -> None:
    p = RetryPolicy()
    now = 1_000_000
    schedule = []
    attempts = 0
    while True:
        attempts, nxt = p.after_failure(attempts, now)
        if nxt is None:
            break
        schedule.append((nxt - now) / 1000)
    assert schedule == [1.0, 2.0, 4.0, 8.0]
    assert attempts == 5


@pytest.mark.parametrize(
    ("policy", "attempts", "delay"),
    [
        (RetryPolicy(base_s=0.05), 1, 0.05),
        (RetryPolicy(base_s=0.05), 3, 0.2),
        (RetryPolicy(base_s=1, max_delay_s=5), 10, 5.0),
        (RetryPolicy(base_s=1, factor=3), 3, 9.0),
        (RetryPolicy(), 0, 0.0),
        (RetryPolicy(max_delay_s=300), 500, 300.0),
    ],
)
def test_delay_table(policy: RetryPolicy, attempts: int, delay: float) -> None:
    assert policy.delay_s(attempts) == pytest.approx(delay)


def test_max_attempts_one_dead_letters_on_first_failure() -> None:
    assert RetryPolicy(max_attempts=1).after_failure(0, 0) == (1, None)


@pytest.mark.parametrize("kwargs", [{"max_attempts": 0}, {"base_s": -1}, {"factor": 0.5}])
def test_invalid_policy(kwargs: dict) -> None:
    with pytest.raises(ValueError):
        RetryPolicy(**kwargs)
