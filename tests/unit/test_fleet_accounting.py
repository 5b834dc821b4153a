"""The mock fleet's ledger (``scripts/fleet/accounting.py``) against known delivery sequences."""
from __future__ import annotations

import pytest

from scripts.fleet.accounting import (
    DUP_FLAG, DUP_NOFLAG, NEW, UNTRACKED, Ledger, order_by_string, order_from_list, percentile, summarize,
)
from scripts.fleet.payload import HEADER_SIZE, sent_time_us, stamp, stamped_random
from scripts.fleet.vins import make_vins

T0 = 1_700_000_000_000_000  # µs


def test_known_sequence_counts_duplicates_order_and_latency() -> None:
    ledger = Ledger(3, order=order_from_list(["r1", "r2", "r3"]))
    # r1 sent at T0, reaches vehicle 0, 1, 2 after 10, 20, 30 ms
    assert ledger.record(0, "r1", False, T0 + 10_000, sent_us=T0) == NEW
    assert ledger.record(1, "r1", False, T0 + 20_000, sent_us=T0) == NEW
    assert ledger.record(2, "r1", False, T0 + 30_000, sent_us=T0) == NEW
    # vehicle 0 gets r1 again with DUP=1 (its PUBACK was lost), then once more without DUP
    assert ledger.record(0, "r1", True, T0 + 40_000, sent_us=T0) == DUP_FLAG
    assert ledger.record(0, "r1", False, T0 + 50_000, sent_us=T0) == DUP_NOFLAG
    # in order: r2 then r3 for vehicle 0; vehicle 1 gets r3 before r2 (one violation, on r2)
    assert ledger.record(0, "r2", False, T0 + 60_000) == NEW
    assert ledger.record(0, "r3", False, T0 + 70_000) == NEW
    assert ledger.record(1, "r3", False, T0 + 80_000) == NEW
    assert ledger.record(1, "r2", False, T0 + 90_000) == NEW
    # a duplicate is never an order violation
    assert ledger.record(1, "r3", True, T0 + 95_000) == DUP_FLAG

    assert ledger.counters() == {"received": 10, "unique": 7, "dup_flag": 2, "dup_noflag": 1,
                                 "order_violations": 1, "untracked": 0}
    s = ledger.summary()
    assert s["received"] == 10 and s["unique"] == 7
    assert s["duplicates"] == {"total": 3, "dup_flag": 2, "no_dup_flag": 1}
    assert s["order_violations"] == 1
    assert list(s["requests"]) == ["r1", "r2", "r3"]  # queue order
    r1 = s["requests"]["r1"]
    assert r1["count"] == 3 and r1["duplicates"] == 2 and r1["timestamped"]
    assert r1["first_ms"] == 10.0  # the first receipt by any vehicle, from the send time
    # latencies 10, 20, 30 ms from the send time; duplicates are not latency samples
    assert r1["latency_ms"] == {"p50": 20.0, "p90": 30.0, "p99": 30.0, "max": 30.0}
    # r2 has no send time: measured from its first arrival (60 ms) -> 0 and 30 ms
    assert s["requests"]["r2"] == {"count": 2, "duplicates": 0, "timestamped": False, "first_ms": 0.0,
                                   "latency_ms": {"p50": 0.0, "p90": 30.0, "p99": 30.0, "max": 30.0}}
    assert s["requests"]["r3"]["latency_ms"] == {"p50": 0.0, "p90": 10.0, "p99": 10.0, "max": 10.0}
    # overall: 10 20 30 | 0 30 | 0 10 -> sorted 0 0 10 10 20 30 30
    assert s["latency_ms"] == {"p50": 10.0, "p90": 30.0, "p99": 30.0, "max": 30.0}


def test_percentiles_nearest_rank_on_known_latencies() -> None:
    ledger = Ledger(100)
    for v in range(100):  # vehicle v receives it after (v + 1) ms: latencies 1..100 ms
        ledger.record(v, "req", False, T0 + (v + 1) * 1000, sent_us=T0)
    lat = ledger.summary()["requests"]["req"]["latency_ms"]
    assert lat == {"p50": 50.0, "p90": 90.0, "p99": 99.0, "max": 100.0}
    assert percentile([1, 2, 3, 4, 5, 6, 7, 8, 9, 10], 0.5) == 5
    assert percentile([1, 2, 3, 4, 5, 6, 7, 8, 9, 10], 0.99) == 10
    assert percentile([7], 0.5) == 7
    assert percentile([], 0.5) is None


def test_string_order_and_no_order() -> None:
    ordered = Ledger(1, order=order_by_string)
    for rid in ("req-0001", "req-0003", "req-0002", "req-0004"):
        ordered.record(0, rid, False, T0)
    assert ordered.order_violations == 1
    unordered = Ledger(1)
    for rid in ("b", "a"):
        unordered.record(0, rid, False, T0)
    assert unordered.order_violations == 0
    # ids missing from the queue-order list are unranked, never violations
    partial = Ledger(1, order=order_from_list(["x", "y"]))
    for rid in ("y", "zzz", "x"):
        partial.record(0, rid, False, T0)
    assert partial.order_violations == 1


def test_merge_of_two_processes_is_exact() -> None:
    """Two ledgers (two processes) merge to the figures one ledger would give."""
    a, b, one = Ledger(2), Ledger(2), Ledger(4)
    arrivals = [(0, 5_000), (1, 15_000), (2, 25_000), (3, 35_000)]  # (global vehicle, µs after the first send)
    for vehicle, dt in arrivals:
        part, local = (a, vehicle) if vehicle < 2 else (b, vehicle - 2)
        part.record(local, "r", False, T0 + dt)  # no send time: relative to the earliest arrival overall
        one.record(vehicle, "r", False, T0 + dt)
    b.record(0, "r", True, T0 + 40_000)
    one.record(2, "r", True, T0 + 40_000)
    merged = summarize([a.export(), b.export()])
    assert merged == one.summary()
    assert merged["requests"]["r"]["latency_ms"] == {"p50": 10.0, "p90": 30.0, "p99": 30.0, "max": 30.0}
    assert merged["duplicates"] == {"total": 1, "dup_flag": 1, "no_dup_flag": 0}


def test_bounds_requests_and_samples() -> None:
    ledger = Ledger(1, max_requests=2, max_samples=1)
    assert ledger.record(0, "a", False, T0) == NEW
    assert ledger.record(0, "b", False, T0) == NEW
    assert ledger.record(0, "c", False, T0) == UNTRACKED
    assert ledger.untracked == 1 and ledger.unique == 3
    big = Ledger(10, max_samples=3, seed=1)
    for v in range(10):
        big.record(v, "r", False, T0 + v * 1000, sent_us=T0)
    exported = big.export()["requests"]["r"]
    assert exported[2] == 10 and len(exported[4]) == 3  # count stays exact, samples are a reservoir
    s = summarize([big.export()], max_listed=0)
    assert s["requests"] == {} and s["requests_omitted"] == 1
    with pytest.raises(ValueError):
        Ledger(1, max_requests=0)


def test_payload_header_and_vins() -> None:
    p = stamp(b"body", sent_us=T0)
    assert len(p) == HEADER_SIZE + 4 and sent_time_us(p) == T0 and p.endswith(b"body")
    assert sent_time_us(b"SDVt") is None and sent_time_us(b"x" * 20) is None
    assert len(stamped_random(100)) == 100 and len(stamped_random(3)) == HEADER_SIZE
    assert make_vins("SIM", 3) == ["SIM000000001", "SIM000000002", "SIM000000003"]
    assert make_vins("CAR", 2, start=9, digits=2) == ["CAR09", "CAR10"]
    with pytest.raises(ValueError):
        make_vins("CAR", 2, start=99, digits=2)
    with pytest.raises(ValueError):
        make_vins("bad/prefix", 1)


def test_source_addresses_descriptor_limit_and_options(monkeypatch: pytest.MonkeyPatch) -> None:
    from scripts.fleet import options as fleet_options
    from scripts.fleet.options import FleetError, FleetOptions, raise_nofile, source_addresses

    opts = FleetOptions(per_address=20_000)
    assert source_addresses(opts, "127.0.0.1", 100_000) == [f"127.0.1.{i}" for i in range(1, 6)]
    assert source_addresses(FleetOptions(per_address=1), "127.0.0.1", 256)[-3:] == ["127.0.1.254", "127.0.2.1", "127.0.2.2"]
    assert source_addresses(opts, "10.0.0.5", 100_000) is None  # not loopback: the kernel chooses
    assert source_addresses(FleetOptions(source_addresses="off"), "127.0.0.1", 10) is None
    assert source_addresses(FleetOptions(source_addresses="10.1.0.10", per_address=5), "10.0.0.5", 12) == \
        ["10.1.0.10", "10.1.0.11", "10.1.0.12"]
    monkeypatch.setattr(fleet_options.resource, "getrlimit", lambda _: (1000, 1000))
    with pytest.raises(FleetError, match=r"hard limit is 1000, below the 2064 .*--processes"):
        raise_nofile(2064)
    assert raise_nofile(900) == (1000, 1000)
    for bad in (dict(crash_rate=1.5), dict(port=(1883, 0)), dict(password="x"), dict(topic_prefix="a/+/b"),
                dict(source_addresses="nowhere"), dict(display="fancy")):
        with pytest.raises(FleetError):
            FleetOptions(**bad).validate()
    FleetOptions(port=(1883, 1884)).validate()


def test_processes_needed_keeps_each_share_under_the_descriptor_limit() -> None:
    import resource

    from scripts.fleet.options import FD_MARGIN, processes_needed

    hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
    assert processes_needed(1) == 1
    if hard != resource.RLIM_INFINITY:
        for n in (hard - FD_MARGIN, hard - FD_MARGIN + 1, 100_000):
            p = processes_needed(n)
            assert -(-n // p) <= hard - FD_MARGIN and (p == 1 or -(-n // (p - 1)) > hard - FD_MARGIN)
