"""The records of the durable-topic calls (node -> dispatcher appends, consumer reads and commits), defined once.

Same rules as :mod:`fanout.records`: each record is ONE ``typing.NamedTuple`` whose ``build`` returns the
wire form (a plain tuple in field order); consumers unpack with the full arity or read it with ``Record(*t)``.
``tests/unit/test_topics_records.py`` builds every record with its producer and consumes it with its consumer.

- ConnectionNode -> Dispatcher ``topic_append(pack_batch([AppendItem]))``: one call per shard per round; the
  reply is a list with one :class:`AppendResult` per (topic, partition) written.
- consumer -> Dispatcher ``topic_read([ReadRequest])``: one :class:`ReadResult` per request, its entries one
  packed page (:func:`page_entries`);
  ``topic_commit([CommitItem])``: one WriteBatch for them all.
"""
from __future__ import annotations

from typing import Any, NamedTuple

import msgpack  # type: ignore[import-untyped]  # no stubs; compiled (fanout.native): Any to mypyc

# MQTT 5 properties of a PUBLISH kept in the log with its payload (topics-spec: "properties worth keeping")
KEPT_PROPERTIES = ("payload_format_indicator", "content_type", "response_topic", "correlation_data")


class AppendItem(NamedTuple):
    """One publish to append to ``topic``'s ``partition`` (a publish matching two topics is two items)."""

    topic: str
    partition: int
    mqtt_topic: str
    client_id: str
    qos: int
    payload: bytes
    properties: list | None  # [[name, value], ...] (kept_properties), None from a 3.1.1 publisher

    @staticmethod
    def build(topic: str, partition: int, mqtt_topic: str, client_id: str, qos: int, payload: bytes,
              properties: list | None = None) -> tuple:
        return (topic, partition, mqtt_topic, client_id, qos, payload, properties)


class AppendResult(NamedTuple):
    """The offsets one ``topic_append`` call assigned in one partition (first..last, inclusive)."""

    topic: str
    partition: int
    first: int
    last: int


class ReadRequest(NamedTuple):
    """Read up to ``limit`` entries of ``topic``'s ``partition`` from ``from_offset`` on."""

    topic: str
    partition: int
    from_offset: int
    limit: int

    @staticmethod
    def build(topic: str, partition: int, from_offset: int, limit: int) -> tuple:
        return (topic, partition, from_offset, limit)


class ReadResult(NamedTuple):
    """The answer to one :class:`ReadRequest`: ``entries`` as a packed page (:func:`page_entries` gives its
    :class:`Entry` tuples in offset order), and the partition's bounds (first retained offset, next offset to
    assign)."""

    entries: bytes
    low: int
    next: int


class Entry(NamedTuple):
    """One log entry as a consumer gets it from a page (``storage.topics.LogEntry`` without topic and partition)."""

    offset: int
    ts_ms: int
    mqtt_topic: str
    client_id: str
    qos: int
    payload: bytes
    properties: list | None


EMPTY_PAGE = b"\x90"  # a packed page without entries (an empty msgpack array)


def page_entries(page: bytes) -> list[tuple]:
    """The :class:`Entry` tuples of a packed page (``storage.topics.read_log_packed``: a msgpack array of
    ``[offset, [ts_ms, mqtt_topic, client_id, qos, payload, properties]]``), decoded in one call.

    Raises:
        ValueError: not such a page (msgpack's own errors are ValueError subclasses, or TypeError on a wrong shape).
    """
    try:
        return [(offset, *value) for offset, value in msgpack.unpackb(page, raw=False)]
    except TypeError as exc:
        raise ValueError(f"malformed topic page: {exc}") from None


class CommitItem(NamedTuple):
    """``group`` acknowledged ``topic``'s ``partition`` up to and including ``offset``."""

    topic: str
    group: str
    partition: int
    offset: int

    @staticmethod
    def build(topic: str, group: str, partition: int, offset: int) -> tuple:
        return (topic, group, partition, offset)


def by_shard(partitions: Any, shards: int) -> dict[int, list[int]]:
    """``{shard: [indices]}`` of a batch's items, given each item's partition (partition ``p`` is in shard
    ``p % shards``, :func:`storage.topics.shard_of_partition`): how a batched read or commit is split per shard."""
    per: dict[int, list[int]] = {}
    for i, p in enumerate(partitions):
        per.setdefault(p % shards, []).append(i)
    return per


def in_order(per: dict[int, list[int]], answers: Any, n: int) -> list:
    """The per-shard answers of a batch split by :func:`by_shard` put back in the batch's order."""
    out: list = [None] * n
    for indices, results in zip(per.values(), answers):
        for i, r in zip(indices, results):
            out[i] = r
    return out


def kept_properties(properties: Any) -> list | None:
    """The MQTT 5 properties of a PUBLISH worth keeping in the log as ``[[name, value], ...]`` (User Properties
    as one ``["user_property", [name, value]]`` pair each, in wire order); None for a 3.1.1 publish."""
    if properties is None:
        return None
    out: list = [["user_property", [k, v]] for k, v in properties.user_properties]
    for name in KEPT_PROPERTIES:
        value = getattr(properties, name)
        if value is not None:
            out.append([name, value])
    return out


__all__ = ["AppendItem", "AppendResult", "ReadRequest", "ReadResult", "Entry", "EMPTY_PAGE", "page_entries", "CommitItem",
           "kept_properties", "by_shard", "in_order"]
