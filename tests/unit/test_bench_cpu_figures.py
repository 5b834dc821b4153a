"""benchmarks.harness.report.busy_us_per: the server CPU per event that server_bench and fleet_bench report, idle
share subtracted. A window whose CPU is not above the idle share gives no figure and says why, never a negative
number (server_bench's heartbeat and connect figures could, before they used it)."""
from __future__ import annotations

from benchmarks.harness.report import busy_us_per


def test_the_idle_share_is_subtracted_per_event():
    figure, error = busy_us_per(2.0, 0.1, 10.0, 50_000, "deliveries")  # (2.0 - 1.0) s over 50,000
    assert (figure, error) == (20.0, None)


def test_no_idle_rate_means_nothing_subtracted():
    assert busy_us_per(0.5, None, 10.0, 1_000, "connects") == (500.0, None)


def test_a_window_not_above_the_idle_share_gives_no_figure_but_the_reason():
    figure, error = busy_us_per(1.2, 0.15, 10.0, 1_000, "heartbeats")  # 1.2 s of CPU, 1.5 s idle share
    assert figure is None
    assert "1.200 s" in error and "1.500 s" in error and "1000 heartbeats" in error


def test_no_events_gives_no_figure():
    assert busy_us_per(1.0, 0.0, 1.0, 0, "connects") == (None, None)
