"""Bounded FIFO ring of HOT submissions.

Strategy: the HOT path must cost microseconds, so the ring is a ``collections.deque`` plus an
explicit capacity check; ``push`` refuses (returns False) instead of dropping the oldest item as a
``deque(maxlen=...)`` would. A refused push is the client's signal to switch to COLD and append to
the durable outbox. ``drain`` empties the ring in FIFO order for a spill to the outbox.
Single-threaded (asyncio loop) by design: no locks.
"""
from __future__ import annotations

from collections import deque
from typing import Generic, Iterator, TypeVar

T = TypeVar("T")


class Ring(Generic[T]):
    """A bounded FIFO that refuses pushes when full.

    Args:
        capacity: the most items held; must be >= 1.

    Raises:
        ValueError: capacity < 1.
    """

    __slots__ = ("_items", "capacity")

    def __init__(self, capacity: int) -> None:
        if capacity < 1:
            raise ValueError(f"ring capacity must be >= 1, got {capacity}")
        self._items: deque[T] = deque()
        self.capacity = capacity

    def push(self, item: T) -> bool:
        """Append ``item`` unless the ring is full.

        Returns:
            True when appended, False when the ring is full (nothing changed).
        """
        if len(self._items) >= self.capacity:
            return False
        self._items.append(item)
        return True

    def peek(self) -> T | None:
        """The oldest item, or None when empty."""
        return self._items[0] if self._items else None

    def pop(self) -> T:
        """Remove and return the oldest item.

        Raises:
            IndexError: the ring is empty.
        """
        return self._items.popleft()

    def drain(self) -> list[T]:
        """Remove and return every item, oldest first."""
        items = list(self._items)
        self._items.clear()
        return items

    def full(self) -> bool:
        """True when ``push`` would refuse."""
        return len(self._items) >= self.capacity

    def __len__(self) -> int:
        return len(self._items)

    def __iter__(self) -> Iterator[T]:
        return iter(self._items)
