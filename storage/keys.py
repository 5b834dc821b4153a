"""Order-preserving key encodings for the shard tables, and the shard function.

Strategy: LMDB compares keys as unsigned bytes (memcmp, shorter prefix first), so every composite
key is laid out so that byte order equals the order of the tuple it encodes:

- ``ids``  = ``vin`` (ASCII) + ``b"\\x00"`` + ``ts_ms`` (8-byte big-endian) + ``request_id`` (UTF-8).
  The NUL separator sorts below every VIN byte, so ``"A1"`` rows all come before ``"A10"`` rows,
  exactly as ``("A1", ...) < ("A10", ...)``; the fixed-width big-endian time sorts numerically; UTF-8
  preserves code-point order, which is Python's ``str`` order. A cursor ``set_range(vin_prefix(vin))``
  therefore walks one VIN's queue oldest first by ``(ts_ms, request_id)`` and stops at the first key
  that does not start with the prefix (``"A1\\x00"`` is not a prefix of ``"A10\\x00"``).
- ``reqs`` = ``request_id`` (UTF-8) + ``b"\\x00"`` + ``vin``: one request's rows are contiguous.
- ``data``/``meta`` = ``data_id`` (UTF-8); ``metrics`` = name (UTF-8); ``retained`` = topic (UTF-8), or
  ``b"\\x00"`` + SHA-256 of the topic when it is longer than an LMDB key may be (MQTT topic names
  never contain NUL [MQTT-4.7.3-2], so the two forms cannot collide; the topic is kept in the value).

Identifiers must not contain NUL (it is the separator) and must fit LMDB's 511-byte key limit;
violations raise ``ValueError`` naming the field. The shard of a VIN or client id is
``zlib.crc32(key.encode()) % shards``: stable across processes, unlike Python's salted ``hash``.
"""
from __future__ import annotations

import hashlib
import re
import string
import struct
import zlib
from typing import Iterable

SEP = b"\x00"
MAX_VIN_BYTES = 128
MAX_REQUEST_ID_BYTES = 256
MAX_DATA_ID_BYTES = 480
MAX_NAME_BYTES = 480
MAX_TS_MS = (1 << 64) - 1
_TS = struct.Struct(">Q")
_LONG_TOPIC_TAG = b"\x00"


# The one VIN rule of the project (trigger validation, the vehicle role's client id, the dispatchers'
# choice of which client ids are vehicles): a client-id-safe token. ``strict_vins`` in the trigger uses the
# ISO 3779 form instead (17 characters, no I, O or Q). The alphabets and lengths are exported for the
# trigger's bulk check of a million VINs, which cannot afford a regex match per VIN.
VIN_CHARS = string.ascii_letters + string.digits + "_-"
VIN_MAX_LEN = 64
ISO_VIN_CHARS = "ABCDEFGHJKLMNPRSTUVWXYZ0123456789"  # ISO 3779: A-Z except I, O, Q; 0-9
ISO_VIN_LEN = 17
VIN_RE = re.compile(f"[{re.escape(VIN_CHARS)}]{{1,{VIN_MAX_LEN}}}")
ISO_VIN_RE = re.compile(f"[{ISO_VIN_CHARS}]{{{ISO_VIN_LEN}}}")


def is_vin(client_id: str) -> bool:
    """True when ``client_id`` has the form of a VIN (``VIN_RE``): the client ids the fanout serves."""
    return VIN_RE.fullmatch(client_id) is not None


def shard_of(key: str, shards: int) -> int:
    """Shard index of a VIN or client id.

    Args:
        key: the VIN or client id.
        shards: number of shards (>= 1).

    Returns:
        ``zlib.crc32(key.encode()) % shards``.

    Raises:
        ValueError: ``shards`` < 1.
    """
    if shards < 1:
        raise ValueError(f"shards must be >= 1, got {shards}")
    return zlib.crc32(key.encode()) % shards


def split_by_shard(vins: Iterable[str], shards: int) -> list[list[str]]:
    """Bucket VINs by :func:`shard_of`, keeping their order within each bucket (a trigger's VINs).

    Args:
        vins: the VINs of one trigger.
        shards: number of shards (>= 1).

    Returns:
        ``shards`` lists; list ``k`` holds the VINs with ``shard_of(vin, shards) == k``.

    Raises:
        ValueError: ``shards`` < 1.
    """
    if shards < 1:
        raise ValueError(f"shards must be >= 1, got {shards}")
    if shards == 1:
        return [list(vins)]
    buckets: list[list[str]] = [[] for _ in range(shards)]
    appends = [b.append for b in buckets]
    crc = zlib.crc32  # shard_of inlined: a million VINs per trigger
    for vin in vins:
        appends[crc(vin.encode()) % shards](vin)
    return buckets


def check_vin(vin: str) -> bytes:
    """Validate a VIN and return its ASCII bytes.

    Raises:
        ValueError: not a str, empty, not ASCII, contains NUL, or longer than ``MAX_VIN_BYTES``.
    """
    if not isinstance(vin, str) or not vin:
        raise ValueError(f"vin must be a non-empty str, got {vin!r}")
    if not vin.isascii() or "\x00" in vin:
        raise ValueError(f"vin must be ASCII without NUL, got {vin!r}")
    if len(vin) > MAX_VIN_BYTES:
        raise ValueError(f"vin longer than {MAX_VIN_BYTES} bytes: {vin[:40]!r}...")
    return vin.encode("ascii")


def check_vins(vins: list[str]) -> None:
    """Validate many VINs at C speed (one join, no per-VIN Python call on the happy path).

    Raises:
        ValueError: as ``check_vin`` for the first offending VIN.
    """
    if not vins:
        return
    try:
        joined = "".join(vins)
        ok = (
            joined.isascii()
            and "\x00" not in joined
            and min(map(len, vins)) > 0
            and max(map(len, vins)) <= MAX_VIN_BYTES
        )
    except TypeError:
        ok = False
    if not ok:
        for vin in vins:
            check_vin(vin)


def _check_text(value: str, field: str, max_bytes: int) -> bytes:
    if not isinstance(value, str) or not value:
        raise ValueError(f"{field} must be a non-empty str, got {value!r}")
    if "\x00" in value:
        raise ValueError(f"{field} must not contain NUL (it is the key separator): {value!r}")
    raw = value.encode("utf-8")
    if len(raw) > max_bytes:
        raise ValueError(f"{field} longer than {max_bytes} bytes UTF-8: {value[:40]!r}...")
    return raw


def check_request_id(request_id: str) -> bytes:
    """Validate a request id and return its UTF-8 bytes.

    Raises:
        ValueError: not a non-empty str, contains NUL, or longer than ``MAX_REQUEST_ID_BYTES``.
    """
    return _check_text(request_id, "request_id", MAX_REQUEST_ID_BYTES)


def check_data_id(data_id: str) -> bytes:
    """Validate a data id and return its UTF-8 bytes (the ``data``/``meta`` key).

    Raises:
        ValueError: not a non-empty str, contains NUL, or longer than ``MAX_DATA_ID_BYTES``.
    """
    return _check_text(data_id, "data_id", MAX_DATA_ID_BYTES)


def check_ts_ms(ts_ms: int, field: str = "ts_ms") -> int:
    """Validate a millisecond timestamp (unsigned 64-bit).

    Raises:
        ValueError: not an int or out of ``0 .. 2**64-1``.
    """
    if not isinstance(ts_ms, int) or isinstance(ts_ms, bool) or not 0 <= ts_ms <= MAX_TS_MS:
        raise ValueError(f"{field} must be an int in 0..2**64-1, got {ts_ms!r}")
    return ts_ms


def ids_key(vin: str, ts_ms: int, request_id: str) -> bytes:
    """Encode an ``ids`` key.

    Args:
        vin: vehicle id (ASCII, no NUL).
        ts_ms: enqueue time in ms.
        request_id: request id (UTF-8, no NUL).

    Returns:
        ``vin + b"\\x00" + ts_ms(8 bytes BE) + request_id``.

    Raises:
        ValueError: any part invalid.
    """
    return check_vin(vin) + SEP + _TS.pack(check_ts_ms(ts_ms)) + check_request_id(request_id)


def decode_ids_key(key: bytes) -> tuple[str, int, str]:
    """Decode an ``ids`` key into ``(vin, ts_ms, request_id)``.

    Raises:
        ValueError: the bytes are not an ``ids`` key.
    """
    key = bytes(key)
    cut = key.find(SEP)
    if cut <= 0 or len(key) < cut + 1 + _TS.size:
        raise ValueError(f"not an ids key: {key!r}")
    (ts_ms,) = _TS.unpack_from(key, cut + 1)
    return key[:cut].decode("ascii"), ts_ms, key[cut + 1 + _TS.size :].decode("utf-8")


def vin_prefix(vin: str) -> bytes:
    """Prefix shared by all ``ids`` keys of one VIN, and only them (``vin + b"\\x00"``).

    Raises:
        ValueError: invalid VIN.
    """
    return check_vin(vin) + SEP


def reqs_key(request_id: str, vin: str) -> bytes:
    """Encode a ``reqs`` key: ``request_id + b"\\x00" + vin``.

    Raises:
        ValueError: invalid request id or VIN.
    """
    return check_request_id(request_id) + SEP + check_vin(vin)


def decode_reqs_key(key: bytes) -> tuple[str, str]:
    """Decode a ``reqs`` key into ``(request_id, vin)``.

    Raises:
        ValueError: the bytes are not a ``reqs`` key.
    """
    key = bytes(key)
    cut = key.find(SEP)
    if cut <= 0 or cut == len(key) - 1:
        raise ValueError(f"not a reqs key: {key!r}")
    return key[:cut].decode("utf-8"), key[cut + 1 :].decode("ascii")


def request_prefix(request_id: str) -> bytes:
    """Prefix shared by all ``reqs`` keys of one request (``request_id + b"\\x00"``).

    Raises:
        ValueError: invalid request id.
    """
    return check_request_id(request_id) + SEP


def data_key(data_id: str) -> bytes:
    """Encode a ``data``/``meta`` key (the data id's UTF-8 bytes).

    Raises:
        ValueError: invalid data id.
    """
    return check_data_id(data_id)


def name_key(name: str) -> bytes:
    """Encode a ``metrics`` or ``sys`` key (UTF-8 name).

    Raises:
        ValueError: empty, NUL, or longer than ``MAX_NAME_BYTES``.
    """
    return _check_text(name, "name", MAX_NAME_BYTES)


def retained_key(topic: str) -> bytes:
    """Encode a ``retained`` key: the topic, or NUL + SHA-256 of it when it is too long for LMDB.

    Raises:
        ValueError: empty topic or a topic containing NUL.
    """
    if not isinstance(topic, str) or not topic:
        raise ValueError(f"topic must be a non-empty str, got {topic!r}")
    if "\x00" in topic:
        raise ValueError(f"topic must not contain NUL [MQTT-4.7.3-2]: {topic[:40]!r}")
    raw = topic.encode("utf-8")
    if len(raw) <= MAX_NAME_BYTES:
        return raw
    return _LONG_TOPIC_TAG + hashlib.sha256(raw).digest()


def key_after(key: bytes) -> bytes:
    """Smallest key strictly greater than ``key`` (for resuming a scan after it)."""
    return bytes(key) + SEP
