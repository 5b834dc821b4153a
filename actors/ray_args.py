"""Large call arguments as several small ones, so that Ray sends them inline with the call.

Why: Ray inlines an argument in the task RPC only when it is at most ``max_direct_call_object_size`` (100 KB
by default); a bigger one is put in the plasma object store first (a shared-memory object, a raylet round
trip, a pin and a release). A durable-topic append call of a few hundred 1 KB messages, and the replication
call carrying it on to the replicas, are just over that size: measured on the topics benchmark (window 256,
~190 KB per call) the raylet spent ~23 µs per appended message on them. Split into chunks of
:data:`INLINE_ARG_BYTES` the same bytes travel inside the call (up to Ray's per-call inline limit, 10 MB,
beyond which Ray falls back to plasma by itself).
"""
from __future__ import annotations

INLINE_ARG_BYTES = 64 << 10  # below Ray's 100 KB max_direct_call_object_size, with room for the pickle header


def chunked(data: bytes, size: int = INLINE_ARG_BYTES) -> list[bytes]:
    """``data`` in pieces of at most ``size`` bytes (one piece, not copied, when it fits)."""
    if len(data) <= size:
        return [data]
    view = memoryview(data)
    return [bytes(view[i:i + size]) for i in range(0, len(data), size)]


def joined(parts: tuple[bytes, ...] | list[bytes]) -> bytes:
    """Inverse of :func:`chunked`."""
    return parts[0] if len(parts) == 1 else b"".join(parts)


def split_entries(entries: list[tuple[int, bytes]]) -> tuple[list[tuple[int, int]], list[bytes]]:
    """Replication log entries ``(seq, data)`` as an index ``(seq, number of chunks)`` and the chunks."""
    index: list[tuple[int, int]] = []
    chunks: list[bytes] = []
    for seq, data in entries:
        parts = chunked(data)
        index.append((seq, len(parts)))
        chunks.extend(parts)
    return index, chunks


def joined_entries(index: list[tuple[int, int]], chunks: tuple[bytes, ...] | list[bytes]) -> list[tuple[int, bytes]]:
    """Inverse of :func:`split_entries`.

    Raises:
        ValueError: the index does not account for every chunk.
    """
    out: list[tuple[int, bytes]] = []
    i = 0
    for seq, n in index:
        if n < 1 or i + n > len(chunks):
            raise ValueError(f"entry {seq}: {n} chunks at {i} of {len(chunks)}")
        out.append((seq, joined(chunks[i:i + n])))
        i += n
    if i != len(chunks):
        raise ValueError(f"{len(chunks)} chunks for an index of {i}")
    return out


__all__ = ["INLINE_ARG_BYTES", "chunked", "joined", "split_entries", "joined_entries"]
