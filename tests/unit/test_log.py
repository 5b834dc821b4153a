"""fanout.log: loggers keep working when sys.stderr is replaced after configure()."""
from __future__ import annotations

import io
import sys

import pytest
import structlog

from fanout import log


@pytest.fixture(autouse=True)
def _restore_structlog():
    """These tests reconfigure structlog; give later tests their defaults back."""
    yield
    structlog.reset_defaults()


def test_logs_follow_the_current_stderr(monkeypatch):
    log.configure(json=True, level="info")
    logger = structlog.get_logger("test.follow")
    first, second = io.StringIO(), io.StringIO()
    monkeypatch.setattr(sys, "stderr", first)
    logger.info("one", n=1)
    first.close()  # a closed capture must not break later logging
    monkeypatch.setattr(sys, "stderr", second)
    logger.info("two", n=2)
    assert '"event": "two"' in second.getvalue()


def test_level_filters_and_bad_level(monkeypatch):
    out = io.StringIO()
    monkeypatch.setattr(sys, "stderr", out)
    log.configure(json=True, level="warning")
    structlog.get_logger("test.level").info("hidden")
    structlog.get_logger("test.level").warning("shown")
    assert "hidden" not in out.getvalue() and "shown" in out.getvalue()
    try:
        log.configure(level="loud")
    except ValueError as exc:
        assert "loud" in str(exc)
    else:
        raise AssertionError("bad level accepted")


def test_ensure_configured_caches_loggers_and_they_still_filter_and_follow_stderr(monkeypatch):
    """The actors' configuration: each module logger is bound once (no re-bind per call), and the cached
    logger still filters by level and writes to whatever sys.stderr is at write time."""
    monkeypatch.setattr(log, "_configured", False)
    monkeypatch.setenv("FANOUT_LOG_JSON", "1")
    monkeypatch.setenv("FANOUT_LOG_LEVEL", "warning")
    log.ensure_configured()
    assert structlog.get_config()["cache_logger_on_first_use"] is True
    proxy = structlog.get_logger("test.cached")
    first, second = io.StringIO(), io.StringIO()
    monkeypatch.setattr(sys, "stderr", first)
    proxy.info("hidden")
    proxy.warning("one")
    assert "hidden" not in first.getvalue() and '"event": "one"' in first.getvalue()
    assert "bind" in vars(proxy), "the proxy did not cache its bound logger"
    monkeypatch.setattr(sys, "stderr", second)
    proxy.warning("two")
    assert '"event": "two"' in second.getvalue() and "two" not in first.getvalue()


def test_configure_does_not_cache_by_default():
    """Tests and the CLI reconfigure and capture logs: their loggers must see a later configure()."""
    log.configure(json=True, level="warning")
    assert structlog.get_config()["cache_logger_on_first_use"] is False
