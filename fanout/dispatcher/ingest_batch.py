"""The write batches of ingest on one shard, and the head-first policy for big triggers.

Strategy: writes are only ever :class:`storage.WriteBatch` objects returned to the caller, which applies
them on the shard's single writer (and replication ships the same batch): one batch per round of blobs
(:func:`blob_batch`), one per round of triggers (:func:`ingest_batch`).

Head first: a shard's part of a trigger bigger than 2 x :data:`HEAD_WRITE_VINS` is written as two batches
(:class:`IngestJob`): its first :data:`HEAD_WRITE_VINS` VINs alone, which the dispatcher dispatches and
ships at once, then the rest. The first deliveries of a big batch then wait for the commit of 256 rows,
not of a million; the caller (the platform's PUBACK) is answered only after both commits.

Conflicts: a trigger whose request id already queued one of its VINs with another data id is refused
whole, before any part of it is written (:func:`fanout.trigger.conflict_reason`); re-sending the same
trigger is what a request id may be re-used for.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Iterator

from fanout.records import VIN_SEPARATOR, split_vins
from storage import WriteBatch

HEAD_WRITE_VINS = 256  # a bigger new batch commits and dispatches this many VINs first (first delivery early)


def blob_batch(items: list[tuple]) -> WriteBatch:
    """One write batch storing :class:`fanout.records.BlobItem` items (a repeated blob refreshes meta.ts only)."""
    batch = WriteBatch()
    for data_id, blob, ts_ms, content_type in items:
        batch.put_blob(data_id, blob, ts_ms, content_type)
    return batch


def ingest_batch(items: list[tuple], has_data: Callable[[list[str]], list[bool]],
                 shard: int) -> tuple[WriteBatch, list[Any], list[list[str]]]:
    """Build the write batch of a round of triggers for one shard.

    Args:
        items: :class:`fanout.records.IngestItem` tuples.
        has_data: whether each data id has a blob on the shard.
        shard: the shard index (for error messages).

    Returns:
        ``(batch, results, vin_lists)``: results per item (``{"vins": n}`` or an error string for an
        unknown data id or invalid VINs, which writes nothing for that item), and the VIN lists to
        dispatch once the batch is durable.
    """
    batch = WriteBatch()
    results: list[Any] = []
    vin_lists: list[list[str]] = []
    for request_id, data_id, joined, ts_ms, ttl_ms, user_properties in items:
        if not has_data([data_id])[0]:
            results.append(f"unknown data_id {data_id!r} on shard {shard}")
            continue
        vins = split_vins(joined)
        try:
            if ttl_ms:  # in the same batch as the rows: no row of it is ever durable without its expiry
                batch.set_expiry(request_id, ts_ms + ttl_ms)
            if user_properties:  # likewise: no row is ever delivered without them
                batch.set_request_props(request_id, user_properties)
            batch.enqueue_many(vins, ts_ms, request_id, data_id)
        except ValueError as exc:
            results.append(f"invalid trigger: {exc}")
            continue
        vin_lists.append(vins)
        results.append({"vins": len(vins)})
    return batch, results, vin_lists


def split_head(items: list[tuple], head_vins: int) -> tuple[list[tuple], list[tuple]] | None:
    """Split the first ``head_vins`` VINs of the first item off a round of triggers.

    Args:
        items: :class:`fanout.records.IngestItem` tuples.
        head_vins: VINs in the head.

    Returns:
        ``(head_items, rest_items)``, or None when the first item is not much bigger than the head.
    """
    if not items:
        return None
    request_id, data_id, joined, ts_ms, ttl_ms, user_properties = items[0]
    if joined.count(VIN_SEPARATOR) < 2 * head_vins:
        return None
    parts = joined.split(VIN_SEPARATOR, head_vins)
    rest = parts.pop()
    return ([(request_id, data_id, VIN_SEPARATOR.join(parts), ts_ms, ttl_ms, user_properties)],
            [(request_id, data_id, rest, ts_ms, ttl_ms, user_properties), *items[1:]])


def merge_head_result(head: Any, rest: Any) -> Any:
    """The result of an item written as head + rest (:func:`split_head`)."""
    if isinstance(head, dict) and isinstance(rest, dict):
        return {"vins": head["vins"] + rest["vins"]}
    return rest if not isinstance(rest, dict) else head


@dataclass(slots=True)
class IngestPart:
    """One write of an ingest call: apply ``batch``, then dispatch ``vin_lists``."""

    batch: WriteBatch
    vin_lists: list[list[str]]
    head: bool  # the head of a big trigger: ship its sends at once, before the rest is built


@dataclass(slots=True)
class IngestJob:
    """The writes of one ``ingest`` call, head first (see the module docstring).

    Iterate :meth:`parts` (each part is built only when asked, so the head ships before the rest's batch
    is built), apply each part's batch and dispatch its VINs, then answer with :meth:`results`.

    Attributes:
        items: the call's :class:`fanout.records.IngestItem` tuples.
        build: builds the write batch of some items (:func:`ingest_batch`).
        head_vins: VINs of a big trigger written first.
        refused: item index -> error, for items that are not written at all (conflicts).
    """

    items: list[tuple]
    build: Callable[[list[tuple]], tuple[WriteBatch, list[Any], list[list[str]]]]
    head_vins: int = HEAD_WRITE_VINS
    refused: dict[int, str] = field(default_factory=dict)
    _results: list[Any] = field(default_factory=list)

    def parts(self) -> Iterator[IngestPart]:
        refused = self.refused
        items = [item for i, item in enumerate(self.items) if i not in refused]
        head_result = None
        split = split_head(items, self.head_vins)
        if split is not None:
            head, items = split
            batch, results, vin_lists = self.build(head)
            head_result = results[0]
            yield IngestPart(batch, vin_lists, head=True)
        batch, results, vin_lists = self.build(items)
        if head_result is not None:
            results[0] = merge_head_result(head_result, results[0])
        written = iter(results)
        self._results = [refused[i] if i in refused else next(written) for i in range(len(self.items))]
        yield IngestPart(batch, vin_lists, head=False)

    def results(self) -> list[Any]:
        """Per item ``{"vins": n}`` or an error string (after :meth:`parts` is exhausted)."""
        return self._results


__all__ = ["HEAD_WRITE_VINS", "IngestJob", "IngestPart", "blob_batch", "ingest_batch", "split_head",
           "merge_head_result"]
