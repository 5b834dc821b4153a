"""Retry policy of outbox items: exponential backoff, then dead letter.

Strategy: pure arithmetic, no clock of its own (``now_ms`` comes in), so the schedule is table-tested.
Attempt ``n`` (1-based) that fails is retried after ``base_s * factor ** (n - 1)`` seconds, capped at
``max_delay_s``: with the defaults 1, 2, 4, 8 s; the failure that brings the count to
``max_attempts`` (default 5) moves the item to the dead-letter store instead.
"""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class RetryPolicy:
    """When a failed item is retried, and when it becomes a dead letter.

    Attributes:
        max_attempts: failed attempts after which the item is dead-lettered (>= 1).
        base_s: delay after the first failure, seconds.
        factor: growth of the delay per further failure.
        max_delay_s: ceiling of one delay, seconds.
    """

    max_attempts: int = 5
    base_s: float = 1.0
    factor: float = 2.0
    max_delay_s: float = 300.0

    def __post_init__(self) -> None:
        if self.max_attempts < 1:
            raise ValueError(f"max_attempts must be >= 1, got {self.max_attempts}")
        if self.base_s < 0 or self.max_delay_s < 0:
            raise ValueError("backoff delays must be >= 0")
        if self.factor < 1:
            raise ValueError(f"backoff factor must be >= 1, got {self.factor}")

    def delay_s(self, attempts: int) -> float:
        """Delay before the next try after ``attempts`` failures (1-based).

        Args:
            attempts: failures recorded so far, >= 1.

        Returns:
            Seconds to wait: ``base_s * factor ** (attempts - 1)``, capped at ``max_delay_s``.
        """
        if attempts < 1:
            return 0.0
        exponent = min(attempts - 1, 64)
        return min(self.base_s * self.factor**exponent, self.max_delay_s)

    def after_failure(self, attempts_before: int, now_ms: int) -> tuple[int, int | None]:
        """Record one more failure.

        Args:
            attempts_before: failures recorded before this one.
            now_ms: current wall-clock time in ms.

        Returns:
            ``(attempts, next_retry_ms)``; ``next_retry_ms`` is None when the item must be
            dead-lettered (``attempts >= max_attempts``).
        """
        attempts = attempts_before + 1
        if attempts >= self.max_attempts:
            return attempts, None
        return attempts, now_ms + int(self.delay_s(attempts) * 1000)
