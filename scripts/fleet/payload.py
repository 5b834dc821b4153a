"""The payload header the mock platform stamps and the mock fleet reads for end-to-end latency.

Format (12 bytes, then the rest of the payload)::

    bytes 0-3   magic b"SDVt"
    bytes 4-11  send time: microseconds since the Unix epoch, unsigned 64-bit big-endian

The magic keeps an arbitrary payload (a real blob, ``--payload-file``) from being read as a time: a
payload that does not start with it has no send time, and the fleet then measures each delivery
against the first delivery of the same request. Wall-clock time, because sender and vehicles are
different processes (possibly machines: their clocks must agree to the precision wanted).
"""
from __future__ import annotations

import os
import struct
import time

MAGIC = b"SDVt"
HEADER = struct.Struct(">4sQ")
HEADER_SIZE = HEADER.size  # 12


def now_us() -> int:
    """Wall-clock microseconds since the epoch."""
    return time.time_ns() // 1000


def stamp(body: bytes, sent_us: int | None = None) -> bytes:
    """Prefix ``body`` with the header.

    Args:
        body: the rest of the payload.
        sent_us: send time (default now).

    Returns:
        ``MAGIC + send time + body``.
    """
    return HEADER.pack(MAGIC, now_us() if sent_us is None else sent_us) + body


def stamped_random(size: int, sent_us: int | None = None) -> bytes:
    """A ``size``-byte payload: the header, then random bytes (at least the header when ``size`` < 12)."""
    return stamp(os.urandom(max(0, size - HEADER_SIZE)), sent_us)


def sent_time_us(payload: bytes) -> int | None:
    """The send time of a stamped payload, or None when it carries no header."""
    if len(payload) >= HEADER_SIZE and payload[:4] == MAGIC:
        return HEADER.unpack_from(payload)[1]
    return None
