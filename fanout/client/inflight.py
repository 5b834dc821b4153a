"""Bookkeeping of published, not yet acknowledged submissions on one MQTT connection.

Strategy: pure and synchronous (no I/O, the publish function is passed in), so it is unit-tested
without a broker. A submission is done when the PUBACK of every message it needed arrived: its blob
(unless the same ``data_id`` was already published on this connection, in which case it waits for
that earlier PUBLISH's PUBACK instead of sending the blob again) and each trigger chunk. The tracker
is thrown away with its connection: :meth:`reset` returns what was unacknowledged, oldest first, so
the client can put it back in order. Packet ids are paho's (1..65535); the client's window keeps far
fewer in flight, so they never collide.
"""
from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass
from typing import Callable

from fanout.client.submission import Submission, data_topic
from fanout.trigger import TRIGGER_TOPIC

_ACKED = 0
PublishFn = Callable[[str, bytes], int]


@dataclass(slots=True)
class _Entry:
    sub: Submission
    remaining: int
    sent_at: float


class Inflight:
    """Unacknowledged submissions of one connection, in publish order.

    Args:
        blob_cache: how many acknowledged ``data_id`` values are remembered to skip re-sending blobs.
    """

    __slots__ = ("_subs", "_mids", "_blobs", "_blob_of_mid", "_blob_cache", "messages")

    def __init__(self, blob_cache: int = 4096) -> None:
        self._subs: dict[int, _Entry] = {}
        self._mids: dict[int, list[int]] = {}
        self._blobs: OrderedDict[str, int] = OrderedDict()
        self._blob_of_mid: dict[int, str] = {}
        self._blob_cache = blob_cache
        self.messages = 0

    def send(self, sub: Submission, max_batch: int, publish: PublishFn, now: float, max_bytes: int | None = None) -> int:
        """Publish a submission's blob (if needed) and triggers and track their packet ids.

        Args:
            sub: the submission.
            max_batch: most VINs per trigger.
            publish: ``(topic, payload) -> packet id``; may raise, in which case the messages
                published so far stay tracked and the caller should :meth:`forget` ``sub``.
            now: monotonic time, for :meth:`oldest_sent_at`.
            max_bytes: largest trigger payload, or None.

        Returns:
            How many PUBLISH packets were sent.
        """
        entry = _Entry(sub, 0, now)
        self._subs[sub.seq] = entry
        sub.acked_msgs = 0
        sent = 0
        state = self._blobs.get(sub.data_id)
        if state is None:
            mid = publish(data_topic(sub.data_id), sub.payload)
            self._blobs[sub.data_id] = mid
            self._blob_of_mid[mid] = sub.data_id
            self._track(mid, entry)
            sent += 1
        elif state == _ACKED:
            self._blobs.move_to_end(sub.data_id)
        else:
            self._mids[state].append(sub.seq)
            entry.remaining += 1
        triggers = sub.triggers(max_batch, max_bytes)
        sub.total_msgs = entry.remaining + len(triggers)
        for payload in triggers:
            self._track(publish(TRIGGER_TOPIC, payload), entry)
            sent += 1
        return sent

    def _track(self, mid: int, entry: _Entry) -> None:
        self._mids[mid] = [entry.sub.seq]
        entry.remaining += 1
        self.messages += 1

    def ack(self, mid: int) -> list[Submission]:
        """Record the PUBACK of ``mid``.

        Returns:
            The submissions this PUBACK completed (every message acknowledged), possibly empty.
        """
        seqs, data_id = self._answered(mid)
        if data_id is not None:
            self._blobs[data_id] = _ACKED
            self._blobs.move_to_end(data_id)
            self._trim_blobs()
        done: list[Submission] = []
        for seq in seqs:
            entry = self._subs.get(seq)
            if entry is None:
                continue
            entry.remaining -= 1
            entry.sub.acked_msgs += 1
            if entry.remaining <= 0:
                del self._subs[seq]
                done.append(entry.sub)
        return done

    def reject(self, mid: int) -> list[Submission]:
        """Record a negative PUBACK (MQTT 5) of ``mid``: the submissions that needed that message are
        forgotten and returned (later PUBACKs of their other messages are ignored); a refused blob is
        no longer known as sent, so a later submission of its ``data_id`` sends it again."""
        seqs, data_id = self._answered(mid)
        if data_id is not None:
            self._blobs.pop(data_id, None)
        refused: list[Submission] = []
        for seq in seqs:
            entry = self._subs.pop(seq, None)
            if entry is not None:
                refused.append(entry.sub)
        return refused

    def _answered(self, mid: int) -> tuple[list[int], str | None]:
        """Stop tracking message ``mid`` (its PUBACK came): the seqs that needed it, and its data id if it
        was a blob."""
        seqs = self._mids.pop(mid, None)
        if seqs is None:
            return [], None
        self.messages -= 1
        return seqs, self._blob_of_mid.pop(mid, None)

    def _trim_blobs(self) -> None:
        if len(self._blobs) <= self._blob_cache:
            return
        for data_id in [d for d, state in self._blobs.items() if state == _ACKED][: len(self._blobs) - self._blob_cache]:
            del self._blobs[data_id]

    def forget(self, seq: int) -> Submission | None:
        """Stop tracking a submission (rejected, or its publish raised); later PUBACKs are ignored."""
        entry = self._subs.pop(seq, None)
        return None if entry is None else entry.sub

    def reset(self) -> list[Submission]:
        """Forget everything (the connection is gone).

        Returns:
            The unacknowledged submissions, in publish order.
        """
        subs = [e.sub for e in self._subs.values()]
        self._subs.clear()
        self._mids.clear()
        self._blobs.clear()
        self._blob_of_mid.clear()
        self.messages = 0
        return subs

    def find_request(self, request_id: str) -> list[Submission]:
        """Unacknowledged submissions with this request id, oldest first."""
        return [e.sub for e in self._subs.values() if e.sub.request_id == request_id]

    def oldest_sent_at(self) -> float | None:
        """Monotonic publish time of the oldest unacknowledged submission, or None."""
        for entry in self._subs.values():
            return entry.sent_at
        return None

    def oldest_ts_ms(self) -> int | None:
        """Submit time of the oldest unacknowledged submission, or None."""
        return min((e.sub.ts_ms for e in self._subs.values()), default=None)

    def subs(self) -> list[Submission]:
        """Tracked submissions, in publish order."""
        return [e.sub for e in self._subs.values()]

    def seqs(self) -> set[int]:
        """Sequence numbers currently tracked."""
        return set(self._subs)

    def __contains__(self, seq: object) -> bool:
        return seq in self._subs

    def __len__(self) -> int:
        return len(self._subs)
