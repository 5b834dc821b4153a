"""Reading a durable topic as a consumer group, in pages: what ``fanout consume`` runs against a cluster or a
data dir.

Strategy: the source (:class:`LogSource`: the running cluster's controller, or the stores of a stopped one,
:mod:`fanout.topics.local_source`) answers batched calls, so a page is ONE read call for every partition still
behind (at most ``page`` entries each, and the source's byte cap) and, with ``ack``, ONE commit call for every
partition it printed from. Memory stays bounded by two pages whatever the backlog: with a source that can read
without waiting (``read_nowait``), the next page is asked for as soon as a page arrives, its positions guessed
from the page's entry count and first offset (:func:`page_span`), so the shard reads it while this side
decodes and emits; a guess that turns out wrong (entries missing inside a page) is dropped and the page read
again.

Where a partition starts: after the group's committed offset when it has one (a group resumes where it
acknowledged, whatever ``start`` says); else ``earliest`` (the first retained offset), ``latest`` (the next offset
to be appended: only what comes after) or an offset (clamped to what is retained). A partition whose retained
entries begin after the position (pruned meanwhile) continues at its first retained one. Reading stops when
``limit`` entries were emitted or every partition is caught up with what it held when it was last read.
Delivery is at least once: without ``ack`` nothing is committed and the group gets the same entries again.
"""
from __future__ import annotations

import base64
import time
from dataclasses import dataclass
from typing import Any, Callable, Protocol

import msgpack

from fanout.topics.records import CommitItem, ReadRequest, ReadResult, page_entries

DEFAULT_PAGE = 1000
PROGRESS_INTERVAL_S = 2.0


class LogSource(Protocol):
    """Batched calls of a durable topic store (:mod:`fanout.topics.log_calls` semantics)."""

    def info(self, names: list[str]) -> dict[str, Any]: ...

    def read(self, requests: list[tuple]) -> list[tuple]: ...

    def commit(self, items: list[tuple]) -> int: ...


def page_span(packed: bytes) -> tuple[int, int] | None:
    """``(first offset, entry count)`` of a non-empty packed page, read from its first bytes without decoding the
    rest; None for an empty page or one not of ``[offset, value]`` pairs."""
    head = msgpack.Unpacker()
    head.feed(packed[:16])  # the array's header, the first pair's header and its offset: 15 bytes at most
    try:
        n = head.read_array_header()
        if n == 0 or head.read_array_header() != 2:
            return None
        first = head.unpack()
    except (ValueError, msgpack.OutOfData):
        return None
    return (first, n) if type(first) is int else None


class UnknownTopic(LookupError):
    """No durable topic of that name."""


def parse_start(value: str) -> str | int:
    """``earliest``, ``latest`` or a non-negative offset (``--from``).

    Raises:
        ValueError: anything else.
    """
    if value in ("earliest", "latest"):
        return value
    if value.isdigit():
        return int(value)
    raise ValueError(f"--from must be earliest, latest or an offset (a non-negative integer), got {value!r}")


def start_offset(start: str | int, low: int, nxt: int, committed: int | None) -> int:
    """Where a group begins reading a partition (see the module docstring)."""
    if committed is not None:
        return committed + 1
    if start == "earliest":
        return low
    if start == "latest":
        return nxt
    return max(int(start), low)


def entry_json(topic: str, partition: int, e: tuple) -> dict[str, Any]:
    """The JSON object of one entry: payload as text when it is UTF-8, else base64 under ``payload_b64``."""
    offset, ts_ms, mqtt_topic, client_id, _qos, payload, _props = e
    out: dict[str, Any] = {"topic": topic, "partition": partition, "offset": offset, "ts_ms": ts_ms,
                           "mqtt_topic": mqtt_topic, "client_id": client_id}
    try:
        out["payload"] = bytes(payload).decode("utf-8")
    except UnicodeDecodeError:
        out["payload_b64"] = base64.b64encode(payload).decode("ascii")
    return out


@dataclass(slots=True)
class ConsumeResult:
    """What one consume run did."""

    emitted: int
    committed: dict[int, int]  # partition -> last offset committed by this run
    positions: dict[int, int]  # partition -> next offset the group would read


def consume(source: LogSource, topic: str, group: str, *, start: str | int = "latest", limit: int | None = None,
            ack: bool = False, page: int = DEFAULT_PAGE, emit: Callable[[int, tuple], None],
            progress: Callable[[int, int], None] | None = None) -> ConsumeResult:
    """Read ``topic`` as ``group`` and call ``emit(partition, entry)`` for each :class:`Entry` tuple, in offset order
    per partition.

    Args:
        source: the store to read.
        topic, group: what to read as whom (the group is created by its first commit).
        start: where a partition without a committed offset begins (:func:`start_offset`).
        limit: stop after this many entries (None: until caught up).
        ack: commit each partition up to the last entry emitted, after each page (with a source that has
            ``commit_nowait``, the commit is written while the next page is read; all are done on return).
        page: most entries per partition per read call.
        emit: called per entry.
        progress: called ``(emitted, behind)`` every :data:`PROGRESS_INTERVAL_S` of a long read.

    Raises:
        UnknownTopic: no such topic.
    """
    info = source.info([topic]).get(topic)
    if info is None:
        raise UnknownTopic(topic)
    committed = info["groups"].get(group, {})
    positions: dict[int, int] = {}
    ends: dict[int, int] = {}
    for p, (low, nxt) in sorted((int(p), b) for p, b in info["partitions"].items()):
        c = committed.get(p)
        positions[p] = start_offset(start, low, nxt, None if c is None else int(c[0]))
        ends[p] = nxt
    active = [p for p in positions if positions[p] < ends[p]]
    emitted = 0
    done_commits: dict[int, int] = {}
    last_progress = time.monotonic()
    commit_nowait = getattr(source, "commit_nowait", None)  # a source that can commit while the next page is read
    read_nowait = getattr(source, "read_nowait", None)  # ... and read the next page while this one is emitted
    waiting: Callable[[], Any] | None = None
    ahead: tuple[list[tuple], Callable[[], list[tuple]]] | None = None  # (the requests guessed, their answers)
    while active and (limit is None or emitted < limit):
        want = page if limit is None else max(1, min(page, limit - emitted))
        requests = [ReadRequest.build(topic, p, positions[p], want) for p in active]
        if ahead is not None and ahead[0] == requests:
            results = ahead[1]()
        else:  # nothing read ahead, or the guess was wrong: its answer is dropped
            results = source.read(requests)
        pages = [ReadResult(*r) for r in results]
        ahead = None
        if read_nowait is not None:  # guess the next requests: every page consecutive and emitted whole
            spans = [page_span(r.entries) for r in pages]
            total = sum(span[1] for span in spans if span is not None)
            if None not in spans and (limit is None or emitted + total < limit):
                later = want if limit is None else max(1, min(page, limit - emitted - total))
                guess = [ReadRequest.build(topic, p, first + n, later)
                         for p, (first, n), r in zip(active, spans, pages) if first + n < r.next]
                if guess:
                    ahead = (guess, read_nowait(guess))
        commits: list[tuple] = []
        still: list[int] = []
        for p, (packed, low, nxt) in zip(active, pages):
            entries = page_entries(packed)
            ends[p] = nxt
            last = None
            for e in entries:
                if limit is not None and emitted >= limit:
                    break
                emit(p, e)
                emitted += 1
                last = e[0]  # Entry.offset
            if last is not None:
                positions[p] = last + 1
                commits.append(CommitItem.build(topic, group, p, last))
            elif positions[p] < low:
                positions[p] = low  # pruned meanwhile: continue at the first retained entry
            if positions[p] < ends[p]:  # (an empty answer may be the call's byte cap: asked again)
                still.append(p)
        if not commits:
            break  # nothing readable any more (every partition caught up, or pruned past its end)
        if ack:
            if waiting is not None:
                waiting()  # one commit in flight at most: it was written while this page was read
            waiting = commit_nowait(commits) if commit_nowait is not None else None
            if waiting is None:
                source.commit(commits)
            done_commits.update({c[2]: c[3] for c in commits})
        active = still
        now = time.monotonic()
        if progress is not None and now - last_progress >= PROGRESS_INTERVAL_S:
            last_progress = now
            progress(emitted, sum(max(0, ends[p] - positions[p]) for p in positions))
    if waiting is not None:
        waiting()
    return ConsumeResult(emitted, done_commits, positions)


__all__ = ["consume", "ConsumeResult", "LogSource", "UnknownTopic", "parse_start", "start_offset", "entry_json"]
