"""The blobs a dispatcher reads: which data ids exist on its shard, and a byte-bounded cache of contents.

Strategy: every delivery batch carries each blob it needs once; the same few blobs serve thousands of
rows (one per request), so they are read from the local store once and kept (with the MQTT 5 Content Type
of their publish, ``blobprops``, which every delivery of the blob carries), up to
:data:`BLOB_CACHE_BYTES` (cleared when full: the working set is a handful of recent requests). Which data
ids exist is asked by every ingest round (``has_data``) and remembered once seen, the
:data:`KNOWN_DATA_IDS` most recent (a forgotten one costs one ``meta`` read when asked again).
"""
from __future__ import annotations

from typing import Any, Iterable

BLOB_CACHE_BYTES = 64 << 20
KNOWN_DATA_IDS = 4096


class BlobCache:
    """Blob contents and known data ids of one shard.

    Args:
        store: the shard's ``ShardStore`` (``get_blob``, ``get_meta``).
        max_bytes: most blob bytes kept.
    """

    __slots__ = ("_store", "_blobs", "_types", "_bytes", "_known", "_max_bytes")

    def __init__(self, store: Any, max_bytes: int = BLOB_CACHE_BYTES) -> None:
        self._store = store
        self._blobs: dict[str, bytes] = {}
        self._types: dict[str, str] = {}  # MQTT 5 Content Type of the cached blobs that have one
        self._bytes = 0
        self._known: dict[str, None] = {}  # insertion-ordered: the oldest is evicted first
        self._max_bytes = max_bytes

    def get(self, data_id: str) -> bytes | None:
        """The blob of ``data_id``, or None when it is not on this shard (garbage-collected)."""
        blob = self._blobs.get(data_id)
        if blob is None:
            blob = self._store.get_blob(data_id)
            if blob is None:
                return None
            if self._bytes + len(blob) > self._max_bytes:
                self._blobs.clear()
                self._types.clear()
                self._bytes = 0
            self._blobs[data_id] = blob
            self._bytes += len(blob)
            content_type = self._store.get_content_type(data_id)
            if content_type is not None:
                self._types[data_id] = content_type
        return blob

    def content_types(self, data_ids: Iterable[str]) -> dict[str, str]:
        """``{data_id: Content Type}`` of those of ``data_ids`` whose blob has one (each read by :meth:`get`
        first, as a delivery batch's payloads are)."""
        types = self._types
        if not types:
            return {}
        return {d: types[d] for d in data_ids if d in types}

    def stored(self, data_ids: Iterable[str]) -> None:
        """These blobs were (re)written: they exist, cached contents may be stale."""
        for data_id in data_ids:
            self._know(data_id)
            old = self._blobs.pop(data_id, None)
            self._types.pop(data_id, None)
            if old is not None:
                self._bytes -= len(old)

    def has_data(self, data_ids: list[str]) -> list[bool]:
        """Whether each data id has a blob on this shard."""
        known = self._known
        out = []
        for d in data_ids:
            ok = d in known
            if not ok and self._store.get_meta(d) is not None:
                ok = True
                self._know(d)
            out.append(ok)
        return out

    def _know(self, data_id: str) -> None:
        known = self._known
        known.pop(data_id, None)
        known[data_id] = None
        if len(known) > KNOWN_DATA_IDS:
            del known[next(iter(known))]

    @property
    def known_data_ids(self) -> int:
        """How many data ids are remembered as present."""
        return len(self._known)

    def forget(self) -> None:
        """Blobs may have been deleted (a GC batch was applied): drop everything."""
        self._known.clear()
        self._blobs.clear()
        self._types.clear()
        self._bytes = 0


__all__ = ["BlobCache", "BLOB_CACHE_BYTES", "KNOWN_DATA_IDS"]
