"""Pending-row reads of one dispatcher tick: the machine's ``PendingRows`` over a ``ShardStore``.

Strategy: every next-row question of an event batch (or of a slice of a new batch) is answered from ONE
read transaction and cursor (:class:`storage.queue_cursor.QueueCursor`), skipping the acked keys whose
delete is still being written (Rule 4 of :mod:`fanout.dispatcher.machine`) as bytes, and decoding only
the row that is returned.
"""
from __future__ import annotations

from contextlib import contextmanager
from typing import Any, Iterator


class TickRows:
    """``PendingRows`` over a ``ShardStore``: inside ``with rows.reading():`` every question of the block
    is answered from ONE read transaction and cursor; outside, each ``next_row`` is its own short read.

    Args:
        store: the shard's ``ShardStore``.
    """

    __slots__ = ("_store", "_qc", "reads")

    def __init__(self, store: Any) -> None:
        self._store = store
        self._qc: Any = None
        self.reads = 0

    @contextmanager
    def reading(self) -> Iterator[None]:
        """One read transaction for the block (nested blocks share the outer one)."""
        if self._qc is not None:
            yield
            return
        with self._store.queue_cursor() as qc:
            self._qc = qc
            try:
                yield
            finally:
                self._qc = None
                self.reads += qc.reads

    def next_row(self, vin: str, after: bytes | None = None) -> Any:
        """The oldest row of ``vin`` after key ``after`` (all rows if None), or None."""
        qc = self._qc
        if qc is not None:
            return qc.first_row(vin) if after is None else qc.row_after(vin, after)
        self.reads += 1
        rows = self._store.next_rows(vin, limit=1, after_key=after)
        return rows[0] if rows else None

    def next_row_skipping(self, vin: str, skip: set[bytes] | None) -> Any:
        """The oldest row of ``vin`` whose key is not in ``skip``, or None."""
        qc = self._qc
        if qc is not None:
            return qc.first_row(vin, skip)
        row = self.next_row(vin)
        while row is not None and skip and row.key in skip:
            row = self.next_row(vin, after=row.key)
        return row


__all__ = ["TickRows"]
