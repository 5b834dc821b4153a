"""The configured log level, for hot paths that ask before they log.

An event the level filters out still costs ~3 µs on a cached structlog module logger (the lazy proxy's attribute
look-up, the bound logger, the keyword dict; measured at ``warning`` on a 2-CPU AMD EPYC), and every connect logs
twice at ``info`` (connected, disconnected): ~2 % of a node's CPU per connect in a connection storm. Asking
:func:`enabled` first costs ~0.1 µs. ``fanout.log.configure`` sets the level; it lives here because the MQTT
package imports nothing outside itself.
"""
from __future__ import annotations

import logging

_min_level = logging.NOTSET  # before fanout.log.configure(): structlog's default filters nothing


def set_level(level: int) -> None:
    """The level ``fanout.log.configure`` gave structlog's filtering logger."""
    global _min_level
    _min_level = level


def enabled(level: int) -> bool:
    """Whether an event at ``level`` (``logging.INFO``...) passes the configured level. A process that configured
    structlog another way (a test's own ``structlog.configure``) sees the last ``fanout.log`` level, or True: its
    own filter still decides what is written."""
    return level >= _min_level


__all__ = ["enabled", "set_level"]
