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
