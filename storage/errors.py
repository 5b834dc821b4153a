"""Errors raised by the storage layer.

Strategy: one base class, ``StoreError``, so callers (actors, CLI) can catch everything the store
raises on purpose with one clause; subclasses name the conditions a caller reacts to differently:
a full store (alert, stop ingest), a fenced writer (step down), a sequence gap (catch up), a
snapshot invalidated under a reader (retry the export). Bad arguments to key encoders and batch
builders are plain ``ValueError``: they are programming or input errors, not store states.
"""
from __future__ import annotations


class StoreError(Exception):
    """Base class of every error the storage layer raises on purpose."""


class StoreFullError(StoreError):
    """The store cannot take the batch: the map reached ``max_map_size_bytes`` or the disk is full.

    Nothing of the batch was written.
    """


class FencedError(StoreError):
    """A write carried an epoch lower than the one the store already knows (a deposed primary)."""

    def __init__(self, message: str, *, epoch: int, known_epoch: int) -> None:
        super().__init__(message)
        self.epoch = epoch
        self.known_epoch = known_epoch

    def __reduce__(self) -> tuple:  # keyword-only fields: pickled whole (it crosses actor channels)
        return (_rebuild, (type(self), self.args, self.__dict__))


class SequenceError(StoreError):
    """An explicit ``seq`` was not ``applied_seq + 1`` (replicas apply the primary's seqs in order)."""

    def __init__(self, message: str, *, seq: int, applied_seq: int) -> None:
        super().__init__(message)
        self.seq = seq
        self.applied_seq = applied_seq

    def __reduce__(self) -> tuple:
        return (_rebuild, (type(self), self.args, self.__dict__))


class BatchFormatError(StoreError):
    """Serialised batch bytes that are not a WriteBatch of a known version, or an unknown op."""


class SnapshotInvalidatedError(StoreError):
    """A snapshot view's read transaction was invalidated (the map grew); start the read again."""


class StoreClosedError(StoreError):
    """The store was used after ``close()``."""


def _rebuild(cls: type, args: tuple, state: dict) -> BaseException:
    exc = Exception.__new__(cls)
    exc.args = args
    exc.__dict__.update(state)
    return exc
