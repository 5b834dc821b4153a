"""What travels between the fanout actors: plain tuples, lists and strings, never per-row objects.

Strategy: every Ray call carries a batch (DESIGN.md "Rules"), and the cost of such a call is dominated
by pickling its argument. Tuples of ``str``/``bytes``/``int`` pickle at C speed, dataclasses do not, so
the hot-path records are positional tuples whose layout is defined here, once, for both ends:

ConnectionNode -> Dispatcher ``events(node_id, events)``, one list per dispatcher per tick:

- ``(EV_CONNECT, client_id, generation, session_present, subscribed, inflight_key | None)``
- ``(EV_DISCONNECT, client_id, generation)``
- ``(EV_SUBSCRIBED, client_id, generation, subscribed[, at_us])`` - the "covers the delivery filter"
  boolean changed; ``at_us`` (wall clock) when it became true, so that rows written after it are sent
- ``(EV_HEARTBEAT, client_id, generation)`` - ``ecp/<VIN>/online`` or ``ecp/<VIN>/heartbeat``
- ``(EV_ACK, client_id, generation, row_key)`` - PUBACK of a fanout message
- ``(EV_FAILED, client_id, generation, row_key)`` - the node dropped a fanout message (full queue)
- ``(EV_SYNC, client_id, generation, subscribed, inflight_key | None)`` - a live connection, resent after the
  dispatcher restarted; unlike a connect it is a dispatch trigger (rows may have arrived meanwhile)

Dispatcher -> ConnectionNode ``deliver(sends, payloads, kicks)``, one call per node per tick:

- ``sends``: ``(vin, generation, row_key, request_id, data_id)``; ``payloads``: ``{data_id: blob}`` (each
  blob once per call); ``kicks``: ``(client_id, generation)`` connections taken over on another node.
- the reply lists only the sends that failed: ``(vin, generation, row_key, DeliverStatus)``.

ConnectionNode -> Dispatcher ingest: ``put_blobs([(data_id, blob, ts_ms)])`` and
``ingest([(request_id, data_id, vins, ts_ms)])`` where ``vins`` is ONE string, the shard's VINs joined by
``"\\n"`` (a million VINs pickle as one 18 MB string in milliseconds; a list of a million ``str`` takes
~20x longer).

Both hot calls carry ONE ``bytes`` argument made by :func:`pack_batch` (C ``pickle`` of the lists above):
Ray serialises a list of tuples through msgpack with a cloudpickle fallback per element, which cost
~10-20 % of each actor's CPU under load; a ``bytes`` argument is copied as is. The receivers accept
the unpacked form too (:func:`unpack_batch` passes non-bytes through).

Generations are cluster-wide: a node maps its broker's local connection counter to a wall-clock
microsecond number (:class:`GenerationClock`), so a takeover on another node always carries a larger
generation than the connection it replaces (clocks of one machine, or NTP-synchronised machines, are
assumed to be closer than the time a client needs to reconnect).
"""
from __future__ import annotations

import pickle
import time
import zlib
from typing import Any, Callable, Iterable

EV_CONNECT = 0
EV_DISCONNECT = 1
EV_SUBSCRIBED = 2
EV_HEARTBEAT = 3
EV_ACK = 4
EV_FAILED = 5
EV_SYNC = 6

VIN_SEPARATOR = "\n"

Event = tuple
SendTuple = tuple  # (vin, generation, row_key, request_id, data_id)
FailureTuple = tuple  # (vin, generation, row_key, status)
BlobItem = tuple  # (data_id, blob, ts_ms)
IngestItem = tuple  # (request_id, data_id, joined_vins, ts_ms)


def shard_of(client_id: str, shards: int) -> int:
    """``crc32(client_id) % shards`` (same function as ``storage.keys.shard_of``, without its checks)."""
    return zlib.crc32(client_id.encode()) % shards


def split_by_shard(vins: Iterable[str], shards: int) -> list[list[str]]:
    """Bucket VINs by shard, keeping their order within each bucket.

    Args:
        vins: the VINs of one trigger.
        shards: number of shards (>= 1).

    Returns:
        ``shards`` lists; list ``k`` holds the VINs with ``shard_of(vin) == k``.
    """
    if shards == 1:
        return [list(vins)]
    buckets: list[list[str]] = [[] for _ in range(shards)]
    appends = [b.append for b in buckets]
    crc = zlib.crc32
    for vin in vins:
        appends[crc(vin.encode()) % shards](vin)
    return buckets


def join_vins(vins: list[str]) -> str:
    """One string for a VIN list (VINs never contain the separator; see ``fanout.trigger``)."""
    return VIN_SEPARATOR.join(vins)


def split_vins(joined: str) -> list[str]:
    """Inverse of :func:`join_vins` (an empty string is an empty list)."""
    return joined.split(VIN_SEPARATOR) if joined else []


def pack_batch(obj: object) -> bytes:
    """One ``bytes`` for a hot-path batch (tuples of str/bytes/int/bool/None; pickled at C speed)."""
    return pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)


def unpack_batch(data: object) -> Any:
    """Inverse of :func:`pack_batch`; anything that is not bytes is returned unchanged."""
    if isinstance(data, (bytes, bytearray, memoryview)):
        return pickle.loads(data)
    return data


class GenerationClock:
    """Cluster-wide connection generations: wall-clock microseconds, strictly increasing per node.

    Args:
        clock_us: time source in microseconds (tests inject a counter).
    """

    __slots__ = ("_last", "_clock")

    def __init__(self, clock_us: Callable[[], int] | None = None) -> None:
        self._last = 0
        self._clock = clock_us or (lambda: time.time_ns() // 1000)

    def next(self) -> int:
        """A generation larger than every one returned before by this clock."""
        g = self._clock()
        if g <= self._last:
            g = self._last + 1
        self._last = g
        return g


__all__ = [
    "EV_CONNECT", "EV_DISCONNECT", "EV_SUBSCRIBED", "EV_HEARTBEAT", "EV_ACK", "EV_FAILED", "EV_SYNC", "GenerationClock",
    "shard_of", "split_by_shard", "join_vins", "split_vins", "VIN_SEPARATOR", "pack_batch", "unpack_batch",
]
