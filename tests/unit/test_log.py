"""fanout.log: loggers keep working when sys.stderr is replaced after configure()."""
from __future__ import annotations

import io
import logging
import sys

import pytest
import structlog

from fanout import log
from fanout.mqtt import log_level


@pytest.fixture(autouse=True)
def _restore_structlog():
    """These tests reconfigure structlog; give later tests their defaults back."""
    yield
    structlog.reset_defaults()
    log_level.set_level(logging.NOTSET)  # structlog's defaults filter nothing


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


def test_enabled_follows_the_configured_level():
    """``enabled`` answers what structlog's filter would: hot paths skip building events only when it would drop them."""
    log.configure(json=True, level="warning")
    assert not log.enabled(logging.INFO) and log.enabled(logging.WARNING) and log.enabled(logging.ERROR)
    log.configure(json=True, level="debug")
    assert log.enabled(logging.DEBUG) and log.enabled(logging.INFO)


def test_connect_and_disconnect_are_logged_at_info_and_skipped_at_warning(monkeypatch):
    """The broker's per-connect events still reach the log at ``info``; at ``warning`` they are not even built (the
    guard in ``Lifecycle``: a filtered call costs ~3 µs per connect)."""
    from fanout.config import load_config, mqtt_settings
    from fanout.mqtt.auth import AccessControl
    from fanout.mqtt.broker import Broker
    from fanout.mqtt.codec import encode
    from fanout.mqtt.packets import Connect, Disconnect

    built: list[str] = []

    def counting_info(event, **kw):
        built.append(event)

    def one_connect() -> None:
        settings = mqtt_settings(load_config(None, env={}))
        broker = Broker(settings, AccessControl(settings, listener_is_loopback=True), None, now_ms=0)
        conn = broker.connection_made(0, ("127.0.0.1", 40000))
        broker.data_received(conn, encode(Connect("car-1", True, 60, None, None, None)), 0)
        broker.data_received(conn, encode(Disconnect()), 1)

    import fanout.mqtt.lifecycle as lifecycle
    monkeypatch.setattr(lifecycle.log, "info", counting_info, raising=False)
    log.configure(json=True, level="info")
    one_connect()
    assert built == ["mqtt client connected", "mqtt client disconnected"]
    built.clear()
    log.configure(json=True, level="warning")
    one_connect()
    assert built == []
