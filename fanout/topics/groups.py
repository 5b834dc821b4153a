"""Consumer groups of durable topics: the sans-I/O state of one (topic, group) over one dispatcher's partitions.

Strategy: a durable topic's log is split in partitions; partition ``p`` lives in store shard ``p % shards``,
and the dispatcher owning that shard keeps one :class:`GroupCore` per (topic, group) for its partitions.
Nothing here reads the store, writes it or talks to a node: the caller feeds what happened (members
joining and leaving, appends, acknowledgements, failed sends) and asks what to do (:meth:`GroupCore.plan`:
which offsets go to which member now; :meth:`GroupCore.take_commits`: which offsets to write).

Rule 1 (one owner per partition): each partition is served by ONE member at a time, so its messages go
out in offset order. The owner is ``sorted(members)[p % len(members)]``: every dispatcher learns the same
members (a join or leave is sent to each of them) and so computes the same assignment without talking to
the others, and the members share the partitions.
Rule 2 (handover): when the assignment changes while the old owner is still a member (a join rebalanced),
the partition stops sending and moves once its in-flight messages are acknowledged, so two members never
hold messages of one partition at once.
Rule 3 (at least once): per partition, the messages in flight are exactly the offsets ``committed + 1 ..
next - 1`` not yet acknowledged; ``committed`` is the highest offset up to which everything is acknowledged
(acks out of order wait in ``acked``). When the owner leaves (or a send to it fails), ``next`` goes back to
``committed + 1``: its unacknowledged messages are sent again, to whoever owns the partition then.
Rule 4 (window): a member has at most ``window`` messages in flight over the partitions it owns here (its
MQTT Receive Maximum / session window, capped by ``topics`` config), and a partition at most
``max_inflight``.
Rule 5 (commits): an acknowledgement only moves ``committed`` in memory; :meth:`take_commits` hands each
partition's new ``committed`` at most once per call (the caller calls it once per tick and writes one
``topic_commit`` op per partition), so a burst of PUBACKs costs one write per partition.
Races handled: an acknowledgement from a member that no longer owns the partition (it left and came back,
or the partition moved) is ignored: the offset is, or will be, sent again to the owner (at least once).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Iterator

START_EARLIEST = "earliest"
START_LATEST = "latest"


def parse_start(value: str | int | None) -> str | int:
    """``earliest`` | ``latest`` | an offset >= 0 (a subscription's ``start`` User Property, ``--from``).

    Raises:
        ValueError: anything else (the message names the value).
    """
    if value is None:
        return START_LATEST
    if isinstance(value, int) and not isinstance(value, bool):
        if value < 0:
            raise ValueError(f"start offset {value} is negative")
        return value
    text = str(value).strip().lower()
    if text in (START_EARLIEST, START_LATEST):
        return text
    if text.isdigit():
        return int(text)
    raise ValueError(f"start {value!r}: expected earliest, latest or an offset")


def start_offset(start: str | int, low: int, high: int) -> int:
    """The first offset to read for a group without commits: ``low`` (first retained), ``high`` (next to be
    appended) or the given offset clamped to ``[low, high]``."""
    if start == START_EARLIEST:
        return low
    if start == START_LATEST:
        return high
    return min(max(int(start), low), high)


@dataclass(slots=True)
class Member:
    """One consumer of the group: a client's subscription on one node (one connection generation)."""

    client_id: str
    node: str
    generation: int
    window: int  # messages it may have in flight over this dispatcher's partitions
    inflight: int = 0


@dataclass(slots=True)
class PartitionState:
    """The group's position in one partition (Rule 3)."""

    partition: int
    committed: int  # last offset up to which everything is acknowledged (-1: none yet)
    next: int  # next offset to send
    high: int  # next offset the log will assign (exclusive end of what can be sent)
    written: int  # last ``committed`` handed out by take_commits (-1: none)
    owner: str | None = None
    acked: set[int] = field(default_factory=set)  # acknowledged offsets above committed + 1

    @property
    def inflight(self) -> int:
        return self.next - self.committed - 1 - len(self.acked)


@dataclass(slots=True, frozen=True)
class Send:
    """Offsets ``first .. last`` of ``partition`` go to ``member`` now (read them from the log in order)."""

    member: Member
    partition: int
    first: int
    last: int


class GroupCore:
    """One (topic, group) over the partitions one dispatcher owns (module docstring, rules 1-5).

    Args:
        topic, group: names (for the caller's records).
        max_inflight: messages of one partition in flight at once (config bound).
    """

    def __init__(self, topic: str, group: str, max_inflight: int) -> None:
        if max_inflight < 1:
            raise ValueError("max_inflight must be >= 1")
        self.topic = topic
        self.group = group
        self.max_inflight = max_inflight
        self.members: dict[str, Member] = {}
        self.parts: dict[int, PartitionState] = {}
        self._order: list[str] = []  # sorted member ids (Rule 1)

    # -- positions ----------------------------------------------------------------------------------------

    def open_partition(self, partition: int, committed: int | None, low: int, high: int,
                       start: str | int = START_LATEST) -> PartitionState:
        """Track ``partition`` from its stored position: after ``committed`` when the group has committed
        there, else from ``start`` (:func:`start_offset`). A group without commits gets its starting
        position committed (``next - 1``, when above -1) at the next :meth:`take_commits`, so it resumes
        there after every member left or the cluster restarted."""
        if committed is not None:
            nxt = max(committed + 1, low)
            ps = PartitionState(partition, nxt - 1, nxt, max(high, nxt), committed)
        else:
            nxt = start_offset(start, low, high)
            ps = PartitionState(partition, nxt - 1, nxt, high, -1)
        self.parts[partition] = ps
        self._assign()
        return ps

    def appended(self, partition: int, high: int) -> None:
        """The log of ``partition`` now ends before ``high`` (its next offset to assign)."""
        ps = self.parts.get(partition)
        if ps is not None and high > ps.high:
            ps.high = high

    def skipped(self, partition: int, upto: int) -> None:
        """Offsets up to ``upto`` are gone from the log (pruned by retention): count them as consumed."""
        ps = self.parts.get(partition)
        if ps is None or upto <= ps.committed:
            return
        ps.acked = {o for o in ps.acked if o > upto}
        ps.committed = upto
        if ps.next <= upto:
            ps.next = upto + 1
        self._settle(ps)
        self._recount()

    # -- members ------------------------------------------------------------------------------------------

    def join(self, client_id: str, node: str, generation: int, window: int) -> None:
        """A member subscribed (or reconnected: a newer generation replaces the old one, which leaves)."""
        old = self.members.get(client_id)
        if old is not None and (old.node, old.generation) != (node, generation):
            self.leave(client_id, old.node, old.generation)
            old = None
        if old is not None:
            old.window = max(1, window)
            return
        self.members[client_id] = Member(client_id, node, generation, max(1, window))
        self._order = sorted(self.members)
        self._assign()

    def leave(self, client_id: str, node: str | None = None, generation: int | None = None) -> bool:
        """A member unsubscribed or disconnected (``node``/``generation`` None: whichever it is). Its
        partitions go back to ``committed + 1`` and to other members (Rule 3). True when it was a member."""
        m = self.members.get(client_id)
        if m is None or (node is not None and m.node != node) or (generation is not None and m.generation != generation):
            return False
        del self.members[client_id]
        self._order = sorted(self.members)
        for ps in self.parts.values():
            if ps.owner == client_id:
                self._rewind(ps)
                ps.owner = None
        self._assign()
        return True

    def members_on(self, node: str) -> list[str]:
        """Client ids of the members connected through ``node``."""
        return [m.client_id for m in self.members.values() if m.node == node]

    # -- acknowledgements -----------------------------------------------------------------------------------

    def ack(self, client_id: str, generation: int, partition: int, offset: int) -> bool:
        """The owner acknowledged ``offset`` of ``partition``; True when it counted (Rule 3, races)."""
        ps = self.parts.get(partition)
        m = self.members.get(client_id)
        if ps is None or m is None or m.generation != generation or ps.owner != client_id:
            return False
        if not ps.committed < offset < ps.next or offset in ps.acked:
            return False
        ps.acked.add(offset)
        m.inflight -= 1
        while ps.committed + 1 in ps.acked:
            ps.committed += 1
            ps.acked.discard(ps.committed)
        self._settle(ps)
        return True

    def commit_external(self, partition: int, upto: int) -> None:
        """An explicit commit up to ``upto`` (``client.ack``, ``fanout consume --ack``), written by the caller:
        everything up to it counts as acknowledged."""
        ps = self.parts.get(partition)
        if ps is None or upto <= ps.committed:
            return
        ps.acked = {o for o in ps.acked if o > upto}
        ps.committed = upto
        ps.written = max(ps.written, upto)
        if ps.next <= upto:
            ps.next = upto + 1
        while ps.committed + 1 in ps.acked:
            ps.committed += 1
            ps.acked.discard(ps.committed)
        self._settle(ps)
        self._recount()

    def failed(self, client_id: str, generation: int, partition: int, offset: int, evict: bool = False) -> None:
        """A send to ``client_id`` was not taken (its session dropped it, or it is gone): the partition goes
        back to ``committed + 1``. ``evict``: the member cannot take this topic (ACL at delivery, too
        large): it leaves the group here."""
        m = self.members.get(client_id)
        ps = self.parts.get(partition)
        if m is None or m.generation != generation:
            return
        if evict:
            self.leave(client_id, m.node, generation)
            return
        if ps is not None and ps.owner == client_id and ps.committed < offset < ps.next:
            self._rewind(ps)
            self._assign()

    def shorten(self, partition: int, next_offset: int) -> None:
        """Of the last plan, only offsets before ``next_offset`` went out (the read hit a byte bound): the
        rest is sent later, in order."""
        ps = self.parts.get(partition)
        if ps is None or not ps.committed < next_offset < ps.next:
            return
        m = self.members.get(ps.owner) if ps.owner is not None else None
        if m is not None:
            m.inflight -= ps.next - next_offset
        ps.next = next_offset

    # -- what to do now --------------------------------------------------------------------------------------

    def plan(self) -> list[Send]:
        """The sends to make now: per owned partition, the offsets from ``next`` that fit the partition's and
        the member's windows (Rule 4). The caller reads them from the log and hands them to the member's
        node; they count as in flight from here."""
        sends: list[Send] = []
        for ps in self.parts.values():
            if ps.owner is None or ps.next >= ps.high or ps.owner != self._want(ps.partition):
                continue  # nobody to send to, nothing new, or a handover waiting for acks (Rule 2)
            m = self.members[ps.owner]
            room = min(self.max_inflight - ps.inflight, m.window - m.inflight, ps.high - ps.next)
            if room <= 0:
                continue
            sends.append(Send(m, ps.partition, ps.next, ps.next + room - 1))
            ps.next += room
            m.inflight += room
        return sends

    def take_commits(self) -> list[tuple[int, int]]:
        """``(partition, committed)`` of every partition whose ``committed`` moved since the last call (Rule 5)."""
        out = []
        for ps in self.parts.values():
            if ps.committed > ps.written:
                out.append((ps.partition, ps.committed))
                ps.written = ps.committed
        return out

    def lag(self) -> dict[int, tuple[int, int]]:
        """``{partition: (committed, high)}``."""
        return {p: (ps.committed, ps.high) for p, ps in self.parts.items()}

    @property
    def idle(self) -> bool:
        """No member and nothing left to write: the caller may forget the group."""
        return not self.members and all(ps.written >= ps.committed for ps in self.parts.values())

    # -- internals -------------------------------------------------------------------------------------------

    def _rewind(self, ps: PartitionState) -> None:
        if ps.owner is not None:
            m = self.members.get(ps.owner)
            if m is not None:
                m.inflight -= ps.inflight
        ps.acked.clear()
        ps.next = ps.committed + 1

    def _settle(self, ps: PartitionState) -> None:
        """A partition whose in-flight messages are all acknowledged may move to its assigned owner (Rule 2)."""
        if ps.inflight == 0:
            want = self._want(ps.partition)
            if want != ps.owner:
                ps.owner = want

    def _want(self, partition: int) -> str | None:
        order = self._order
        return order[partition % len(order)] if order else None

    def _assign(self) -> None:
        for ps in self.parts.values():
            want = self._want(ps.partition)
            if ps.owner == want:
                continue
            if ps.owner is None or ps.owner not in self.members or ps.inflight == 0:
                if ps.owner is not None and ps.owner not in self.members:
                    self._rewind(ps)
                ps.owner = want
            # else: Rule 2, the old owner keeps it until its in-flight messages are acknowledged

    def _recount(self) -> None:
        counts = dict.fromkeys(self.members, 0)
        for ps in self.parts.values():
            if ps.owner in counts:
                counts[ps.owner] += ps.inflight
        for cid, n in counts.items():
            self.members[cid].inflight = n

    def iter_partitions(self) -> Iterator[PartitionState]:
        return iter(self.parts.values())


__all__ = ["GroupCore", "Member", "PartitionState", "Send", "parse_start", "start_offset",
           "START_EARLIEST", "START_LATEST"]
