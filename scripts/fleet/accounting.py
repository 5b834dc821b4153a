"""The mock fleet's delivery ledger: what each vehicle received, twice, out of order, and how late.

Strategy:

- One :class:`Ledger` per fleet process, vehicles named by their local index (0..n-1), so the ledger
  is a plain object testable without sockets. :meth:`Ledger.record` is called once per received
  delivery (a PUBLISH on the vehicle's delivery topic) and returns what it was: :data:`NEW` (first
  receipt of that request id by that vehicle), :data:`DUP_FLAG` (received again, with DUP=1: a
  redelivery after a lost PUBACK), :data:`DUP_NOFLAG` (received again with DUP=0: the sender queued it
  twice, which the cluster must never do) or :data:`UNTRACKED` (more distinct request ids than
  ``max_requests``; counted as new, not deduplicated).
- Request ids are interned once per ledger (``str`` -> small int); each vehicle keeps the set of ints
  it received (``None`` until its first delivery), so 100,000 vehicles x 10 requests stay a few tens
  of MB.
- Order: with an ``order`` function (request id -> comparable rank, or None for "unranked"), a new
  request whose rank is below the highest rank this vehicle already received is an order violation.
  Duplicates are not order-checked (they are counted as duplicates).
- Latency: per request, the arrival times (wall-clock microseconds) of first receipts are kept (a
  reservoir of ``max_samples`` when there are more), with the send time from the payload header when
  present. Latency = arrival - send time, or arrival - first arrival of that request when the payload
  carries no send time. Arrival times rather than latencies are kept so that ledgers of several
  processes merge exactly: :func:`summarize` takes the earliest first arrival over all of them.
- Percentiles use the nearest-rank method: the q-quantile of n sorted values is the value at 1-based
  rank ``ceil(q * n)``; p99 of 10 values is the largest.
"""
from __future__ import annotations

import math
import random
from array import array
from typing import Any, Callable, Iterable, Sequence

NEW = 0
DUP_FLAG = 1
DUP_NOFLAG = 2
UNTRACKED = 3

OrderKey = Callable[[str], Any]


def order_by_string(request_id: str) -> str:
    """Rank request ids by string comparison (``mock_platform`` ids sort in submission order)."""
    return request_id


def order_from_list(request_ids: Sequence[str]) -> OrderKey:
    """Rank request ids by their position in ``request_ids`` (the platform's queue order).

    Args:
        request_ids: request ids, first queued first.

    Returns:
        A rank function; ids not in the list are unranked (None, never a violation).
    """
    ranks = {rid: i for i, rid in enumerate(request_ids)}
    return ranks.get


class _Request:
    """What the ledger knows about one request id."""

    __slots__ = ("sent_us", "first_us", "count", "duplicates", "arrivals")

    def __init__(self, sent_us: int | None, now_us: int) -> None:
        self.sent_us = sent_us
        self.first_us = now_us
        self.count = 0  # vehicles that received it (first receipts)
        self.duplicates = 0
        self.arrivals = array("q")  # first-receipt arrival times, a reservoir of max_samples


class Ledger:
    """Received deliveries of one fleet process.

    Args:
        vehicles: number of vehicles (indexes 0..vehicles-1).
        order: request id -> rank for order checking, or None for no order checking.
        max_requests: distinct request ids tracked; deliveries of further ids are UNTRACKED.
        max_samples: arrival times kept per request (reservoir sampling beyond).
        seed: seed of the reservoir's random choices.
    """

    __slots__ = ("_ids", "_requests", "_names", "_seen", "_top", "_order", "max_requests", "max_samples",
                 "_rng", "received", "unique", "dup_flag", "dup_noflag", "order_violations", "untracked")

    def __init__(self, vehicles: int, *, order: OrderKey | None = None, max_requests: int = 10_000,
                 max_samples: int = 200_000, seed: int | None = None) -> None:
        if max_requests < 1 or max_samples < 1:
            raise ValueError("max_requests and max_samples must be >= 1")
        self._ids: dict[str, int] = {}
        self._names: list[str] = []
        self._requests: list[_Request] = []
        self._seen: list[set[int] | None] = [None] * vehicles
        self._top: list[Any] = [None] * vehicles
        self._order = order
        self.max_requests = max_requests
        self.max_samples = max_samples
        self._rng = random.Random(seed)
        self.received = self.unique = self.dup_flag = self.dup_noflag = 0
        self.order_violations = self.untracked = 0

    @property
    def duplicates(self) -> int:
        """Duplicate receipts, with or without the DUP flag."""
        return self.dup_flag + self.dup_noflag

    def record(self, vehicle: int, request_id: str, dup: bool, now_us: int, sent_us: int | None = None) -> int:
        """Account one delivery received by ``vehicle``.

        Args:
            vehicle: the vehicle's index.
            request_id: the last level of the delivery topic.
            dup: the PUBLISH's DUP flag.
            now_us: arrival time, wall-clock microseconds.
            sent_us: send time from the payload header, or None.

        Returns:
            :data:`NEW`, :data:`DUP_FLAG`, :data:`DUP_NOFLAG` or :data:`UNTRACKED`.
        """
        self.received += 1
        rid = self._ids.get(request_id)
        if rid is None:
            if len(self._names) >= self.max_requests:
                self.untracked += 1
                self.unique += 1
                return UNTRACKED
            rid = self._ids[request_id] = len(self._names)
            self._names.append(request_id)
            self._requests.append(_Request(sent_us, now_us))
        req = self._requests[rid]
        seen = self._seen[vehicle]
        if seen is None:
            seen = self._seen[vehicle] = set()
        elif rid in seen:
            req.duplicates += 1
            if dup:
                self.dup_flag += 1
                return DUP_FLAG
            self.dup_noflag += 1
            return DUP_NOFLAG
        seen.add(rid)
        self.unique += 1
        if self._order is not None:
            rank = self._order(request_id)
            if rank is not None:
                top = self._top[vehicle]
                if top is None or rank > top:
                    self._top[vehicle] = rank
                elif rank < top:
                    self.order_violations += 1
        if req.sent_us is None and sent_us is not None:
            req.sent_us = sent_us
        if now_us < req.first_us:
            req.first_us = now_us
        req.count += 1
        arrivals = req.arrivals
        if len(arrivals) < self.max_samples:
            arrivals.append(now_us)
        else:  # reservoir sampling (Algorithm R): each arrival kept with probability max_samples / count
            j = self._rng.randrange(req.count)
            if j < self.max_samples:
                arrivals[j] = now_us
        return NEW

    def counters(self) -> dict[str, int]:
        """The running totals (cheap; for progress reports)."""
        return {"received": self.received, "unique": self.unique, "dup_flag": self.dup_flag,
                "dup_noflag": self.dup_noflag, "order_violations": self.order_violations,
                "untracked": self.untracked}

    def export(self) -> dict[str, Any]:
        """Everything :func:`summarize` needs, picklable (sent from a fleet process to its parent).

        Returns:
            The counters plus ``requests``: request id -> (sent_us, first_us, count, duplicates,
            arrivals array).
        """
        out: dict[str, Any] = self.counters()
        out["requests"] = {name: (r.sent_us, r.first_us, r.count, r.duplicates, r.arrivals)
                           for name, r in zip(self._names, self._requests)}
        return out

    def summary(self, max_listed: int = 1000) -> dict[str, Any]:
        """:func:`summarize` of this ledger alone."""
        return summarize([self.export()], max_listed=max_listed, order=self._order)


def percentile(sorted_values: Sequence[float], q: float) -> float | None:
    """Nearest-rank percentile: the value at 1-based rank ``ceil(q * n)`` (None when empty).

    Args:
        sorted_values: ascending values.
        q: quantile in (0, 1].
    """
    n = len(sorted_values)
    if not n:
        return None
    return sorted_values[min(n, max(1, math.ceil(q * n))) - 1]


def latency_stats(latencies_ms: list[float]) -> dict[str, float | None]:
    """``{"p50", "p90", "p99", "max"}`` of ``latencies_ms`` (sorted in place), rounded to 0.001 ms."""
    latencies_ms.sort()

    def r(v: float | None) -> float | None:
        return None if v is None else round(v, 3)

    return {"p50": r(percentile(latencies_ms, 0.50)), "p90": r(percentile(latencies_ms, 0.90)),
            "p99": r(percentile(latencies_ms, 0.99)), "max": r(latencies_ms[-1] if latencies_ms else None)}


def summarize(exports: Iterable[dict[str, Any]], *, max_listed: int = 1000, order: OrderKey | None = None
              ) -> dict[str, Any]:
    """Merge the exports of one or more ledgers into the JSON summary part about deliveries.

    Args:
        exports: :meth:`Ledger.export` results (one per process).
        max_listed: most requests listed under ``requests`` (the rest are counted in
            ``requests_omitted``; the overall latency still covers them).
        order: rank function used to list requests in queue order (default: by first arrival).

    Returns:
        ``received``, ``unique``, ``duplicates`` ({total, dup_flag, no_dup_flag}), ``order_violations``,
        ``untracked``, ``latency_ms`` (all requests), ``requests`` ({request id: {count, duplicates,
        timestamped, first_ms, latency_ms}}; ``first_ms`` is the first receipt by any vehicle, from the send
        time, or 0 without one) and ``requests_omitted``.
    """
    totals = dict.fromkeys(("received", "unique", "dup_flag", "dup_noflag", "order_violations", "untracked"), 0)
    merged: dict[str, list[Any]] = {}  # rid -> [sent_us, first_us, count, duplicates, [arrival arrays]]
    for ex in exports:
        for key in totals:
            totals[key] += ex[key]
        for rid, (sent_us, first_us, count, dups, arrivals) in ex["requests"].items():
            m = merged.get(rid)
            if m is None:
                merged[rid] = [sent_us, first_us, count, dups, [arrivals]]
                continue
            if m[0] is None:
                m[0] = sent_us
            m[1] = min(m[1], first_us)
            m[2] += count
            m[3] += dups
            m[4].append(arrivals)
    every: list[float] = []
    requests: dict[str, Any] = {}
    rank = (lambda rid: (0, order(rid)) if order(rid) is not None else (1, merged[rid][1])) if order else None
    names = sorted(merged, key=rank or (lambda rid: merged[rid][1]))
    for i, rid in enumerate(names):
        sent_us, first_us, count, dups, arrays = merged[rid]
        base = sent_us if sent_us is not None else first_us
        lat = [(a - base) / 1000 for arr in arrays for a in arr]
        every.extend(lat)
        if i < max_listed:
            requests[rid] = {"count": count, "duplicates": dups, "timestamped": sent_us is not None,
                             "first_ms": round((first_us - base) / 1000, 3),
                             "latency_ms": latency_stats(lat)}
    return {
        "received": totals["received"],
        "unique": totals["unique"],
        "duplicates": {"total": totals["dup_flag"] + totals["dup_noflag"], "dup_flag": totals["dup_flag"],
                       "no_dup_flag": totals["dup_noflag"]},
        "order_violations": totals["order_violations"],
        "untracked": totals["untracked"],
        "latency_ms": latency_stats(every),
        "requests": requests,
        "requests_omitted": max(0, len(names) - max_listed),
    }
