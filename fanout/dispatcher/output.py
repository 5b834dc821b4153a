"""What one dispatcher tick hands to its actor: per node the deliveries and kicks, and the acked rows.

Strategy: the actor makes ONE ``deliver`` call per node per tick and writes ONE delete batch per tick, so
the tick's output is grouped here: :class:`fanout.records.Delivery` and :class:`fanout.records.Kick` wire
tuples queued per destination node (oldest first; a node's backlog may be taken in parts), and the
machine's ``Delete`` actions in the order they were decided.
"""
from __future__ import annotations

from typing import Any

from fanout.records import Kick

NodeId = str


class TickOutput:
    """Queued deliveries and kicks per node, and deletes."""

    __slots__ = ("_sends", "_kicks", "deletes")

    def __init__(self) -> None:
        self._sends: dict[NodeId, list[tuple]] = {}
        self._kicks: dict[NodeId, list[tuple]] = {}
        self.deletes: list[Any] = []  # fanout.dispatcher.machine.Delete, in decision order

    @property
    def has_work(self) -> bool:
        """Deliveries or kicks to ship, or deletes to write."""
        return bool(self._sends or self._kicks or self.deletes)

    def deliveries_to(self, node: NodeId) -> list[tuple]:
        """The (mutable) delivery queue of ``node``; :meth:`prune` drops it again if it stays empty."""
        queue = self._sends.get(node)
        if queue is None:
            queue = self._sends[node] = []
        return queue

    def prune(self, node: NodeId) -> None:
        """Forget ``node``'s delivery queue if it is empty."""
        if not self._sends.get(node, True):
            del self._sends[node]

    def kick(self, node: NodeId, client_id: str, generation: int | None) -> None:
        """Queue the close of a connection on ``node`` (taken over elsewhere)."""
        self._kicks.setdefault(node, []).append(Kick.build(client_id, generation))

    def nodes(self) -> list[NodeId]:
        """Nodes with deliveries or kicks queued."""
        return list({*self._sends, *self._kicks})

    def take(self, node: NodeId, limit: int | None = None) -> tuple[list[tuple], list[tuple]]:
        """``(deliveries, kicks)`` for one ``deliver`` call to ``node``.

        Args:
            node: the destination.
            limit: at most this many deliveries (the rest stay queued, oldest first); None = all.
        """
        queued = self._sends.pop(node, [])
        if limit is not None and len(queued) > limit:
            sends, self._sends[node] = queued[:limit], queued[limit:]
        else:
            sends = queued
        return sends, self._kicks.pop(node, [])

    def drop_request(self, request_id: str) -> list[tuple[str, int, bytes]]:
        """Remove the queued deliveries of ``request_id`` (it is being cancelled); returns their
        ``(vin, generation, row_key)``."""
        dropped: list[tuple[str, int, bytes]] = []
        for node, queue in list(self._sends.items()):
            kept = [d for d in queue if d[3] != request_id]  # Delivery: (vin, gen, key, request_id, data_id, dup)
            if len(kept) != len(queue):
                dropped += [(d[0], d[1], d[2]) for d in queue if d[3] == request_id]
                self._sends[node] = kept
                self.prune(node)
        return dropped

    def take_deletes(self) -> list[Any]:
        """Every queued delete, oldest first."""
        deletes, self.deletes = self.deletes, []
        return deletes

    def requeue_deletes(self, deletes: list[Any]) -> None:
        """Deletes whose batch failed to apply go back in front (retried with the next batch)."""
        self.deletes[:0] = deletes

    def node_down(self, node: NodeId) -> None:
        """A node is gone: what was queued for it is moot."""
        self._sends.pop(node, None)
        self._kicks.pop(node, None)


__all__ = ["TickOutput"]
