"""The takeover registry of one shard: where each client id of the shard has its live connection.

Strategy: the shard of ``crc32(client_id)`` sees every connect of that client id, on any node, so it is
the one place that can tell two live connections of one client id apart. When two nodes report a live
connection, the one reported last wins and the other is kicked (MQTT: a second CONNECT with the same
client id closes the first, on any node; :mod:`fanout.generations` explains why arrival is the order, and
the CONNACK hold of :mod:`fanout.mqtt.connack_hold` why it is the client's order);
the caller queues the kick for the next ``deliver`` call to that connection's node. Every client id is
registered, vehicle or not; an entry lives as long as its connection.
"""
from __future__ import annotations

from fanout.generations import newer

NodeId = str


class TakeoverRegistry:
    """client id -> ``(node, generation)`` of its live connection."""

    __slots__ = ("_clients", "takeovers")

    def __init__(self) -> None:
        self._clients: dict[str, tuple[NodeId, int]] = {}
        self.takeovers = 0

    def register(self, node: NodeId, client_id: str, generation: int) -> tuple[bool, tuple[NodeId, int] | None]:
        """Record a connect.

        Returns:
            ``(accepted, kick)``: ``accepted`` is False when this connect is already superseded;
            ``kick`` is ``(node, generation)`` of the connection to close, or None.
        """
        prev = self._clients.get(client_id)
        if prev is None:
            self._clients[client_id] = (node, generation)
            return True, None
        if prev[0] != node:  # a takeover from another node: the later report wins
            self.takeovers += 1
            self._clients[client_id] = (node, generation)
            return True, prev
        if newer(generation, prev[1]):
            self._clients[client_id] = (node, generation)
        return True, None

    def unregister(self, node: NodeId, client_id: str, generation: int) -> None:
        """A disconnect: forget the connection if it is the registered one."""
        if self._clients.get(client_id) == (node, generation):
            del self._clients[client_id]

    def node_down(self, node: NodeId) -> None:
        """Forget every connection of a node that died or restarted. O(clients)."""
        for cid in [c for c, (n, _g) in self._clients.items() if n == node]:
            del self._clients[cid]

    def connection(self, client_id: str) -> tuple[NodeId, int] | None:
        """``(node, generation)`` of the live connection of ``client_id``, or None."""
        return self._clients.get(client_id)

    def __len__(self) -> int:
        return len(self._clients)


__all__ = ["TakeoverRegistry"]
