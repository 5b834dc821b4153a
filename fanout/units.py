"""Human units for config values: durations (``20s``, ``1h``, ``7d``) and sizes (``1MiB``).

Parsed once at config load into integers (milliseconds, bytes); the rest of the code only sees
numbers whose names carry the unit (``retention_ms``, ``max_packet_size_bytes``).
"""
from __future__ import annotations

import re
from typing import Any, Callable

_DURATION_MS = {"ms": 1, "s": 1_000, "m": 60_000, "min": 60_000, "h": 3_600_000, "d": 86_400_000, "w": 604_800_000}
_SIZE_BYTES = {
    "b": 1, "kb": 1_000, "mb": 1_000_000, "gb": 1_000_000_000,
    "kib": 1 << 10, "mib": 1 << 20, "gib": 1 << 30, "tib": 1 << 40,
    "k": 1 << 10, "m": 1 << 20, "g": 1 << 30,
}
_NUMBER_UNIT = re.compile(r"^\s*([0-9]+(?:\.[0-9]+)?)\s*([a-zA-Z]*)\s*$")


class UnitError(ValueError):
    """A value that is not a number with a known unit."""


def parse_duration_ms(value: str | int | float, *, default_unit: str = "s") -> int:
    """``"20s"`` -> 20000. A bare number is read in ``default_unit``.

    Raises:
        UnitError: unknown unit, negative or malformed value.
    """
    return _parse(value, _DURATION_MS, default_unit, "duration", "ms, s, m, h, d, w")


def parse_size_bytes(value: str | int | float, *, default_unit: str = "b") -> int:
    """``"1MiB"`` -> 1048576. A bare number is read in ``default_unit``.

    Raises:
        UnitError: unknown unit, negative or malformed value.
    """
    return _parse(value, _SIZE_BYTES, default_unit, "size", "B, KB, MB, GB, KiB, MiB, GiB, TiB")


def _parse(value: str | int | float, table: dict[str, int], default_unit: str, what: str, known: str) -> int:
    if isinstance(value, bool):
        raise UnitError(f"expected a {what}, got a boolean")
    if isinstance(value, (int, float)):
        if value < 0:
            raise UnitError(f"a {what} cannot be negative: {value}")
        return int(value * table[default_unit])
    if not isinstance(value, str):
        raise UnitError(f"expected a {what} such as '20s' or '1MiB', got {type(value).__name__}")
    m = _NUMBER_UNIT.match(value)
    if not m:
        raise UnitError(f"{value!r} is not a {what} (number followed by one of {known})")
    number, unit = m.groups()
    factor = table.get(unit.lower() if unit else default_unit)
    if factor is None:
        raise UnitError(f"{value!r}: unknown {what} unit {unit!r} (use one of {known})")
    return int(float(number) * factor)


def format_duration_ms(ms: int) -> str:
    """Inverse of parse_duration_ms for display: the largest unit that divides exactly."""
    for unit in ("d", "h", "m", "s"):
        factor = _DURATION_MS[unit]
        if ms and ms % factor == 0:
            return f"{ms // factor}{unit}"
    return f"{ms}ms"


def format_size_bytes(n: int) -> str:
    """Inverse of parse_size_bytes for display."""
    for unit in ("TiB", "GiB", "MiB", "KiB"):
        factor = _SIZE_BYTES[unit.lower()]
        if n and n % factor == 0:
            return f"{n // factor}{unit}"
    return f"{n}B"


def duration_parser(lo_ms: int = 0, hi_ms: int | None = None) -> Callable[[Any], int]:
    """A config value parser: a duration (``"7d"``, or seconds as a number) in milliseconds within the bounds.

    The parser raises ValueError with what was wrong (the config loader adds the key's name).
    """
    return _bounded(parse_duration_ms, format_duration_ms, lo_ms, hi_ms)


def size_parser(lo: int = 0, hi: int | None = None) -> Callable[[Any], int]:
    """A config value parser: a size (``"1GiB"``, or bytes as a number) in bytes within the bounds."""
    return _bounded(parse_size_bytes, format_size_bytes, lo, hi)


def _bounded(parse_unit: Callable[[Any], int], shown: Callable[[int], str], lo: int,
             hi: int | None) -> Callable[[Any], int]:
    def parse(value: Any) -> int:
        try:
            n = parse_unit(value)
        except UnitError as exc:
            raise ValueError(str(exc)) from None
        if n < lo:
            raise ValueError(f"must be at least {shown(lo)}, got {value!r}")
        if hi is not None and n > hi:
            raise ValueError(f"must be at most {shown(hi)}, got {value!r}")
        return n

    return parse
