"""CONNACKs held until the embedding registered the connection (a cluster-wide takeover registry).

Why: in a cluster, two connections of one client id on two nodes are told apart by the one shard that
sees both connect reports, in the order they arrive. A report held up (a busy node, a slow Ray call)
beyond the client's next connect on another node would let the older connection win and kick the newer
one, and the older one would stay. A client sends its next CONNECT only after it saw a CONNACK (or lost
the connection), so writing the CONNACK once the registration is applied makes the reports arrive in the
order the client made its connects: the newest always wins. (EMQX registers a client id under a
cluster lock before its CONNACK for the same reason.)

While a CONNACK is held, it and whatever is written after it wait in ``Connection.held_output``, and
nothing more is decoded from the client (its bytes are buffered under the pre-authentication cap), so no
reply can overtake the CONNACK. A hold the embedding does not release within ``max_hold_ms`` ends on
the broker's tick, with a warning: the client then gets in under arrival order rather than wait for a
registry that is gone.
"""
from __future__ import annotations

from typing import Any, Callable

from .connection import CLOSED, Connection

#: A registration is one Ray round trip (milliseconds); five seconds means the registry is restarting.
DEFAULT_MAX_HOLD_MS = 5_000

HoldGate = Callable[[str, Any], bool]


class ConnackHolds:
    """The connections whose CONNACK waits for :meth:`release`.

    Attributes:
        gate: ``(client_id, principal) -> bool``: whether an accepted connection must be registered
            before its CONNACK; None (the default) holds nothing.
        max_hold_ms: how long a hold may last before :meth:`overdue` reports it.
    """

    __slots__ = ("gate", "max_hold_ms", "_deadlines", "released_late")

    def __init__(self, max_hold_ms: int = DEFAULT_MAX_HOLD_MS) -> None:
        self.gate: HoldGate | None = None
        self.max_hold_ms = max_hold_ms
        self._deadlines: dict[Connection, int] = {}
        self.released_late = 0

    def __len__(self) -> int:
        return len(self._deadlines)

    def hold(self, conn: Connection, now_ms: int) -> None:
        """Start holding the output of ``conn`` (call before its CONNACK is written)."""
        conn.held_output = []
        self._deadlines[conn] = now_ms + self.max_hold_ms

    def release(self, conn: Connection) -> list[bytes]:
        """Stop holding ``conn``; returns what was held, in order (the CONNACK first)."""
        self._deadlines.pop(conn, None)
        held = conn.held_output or []
        conn.held_output = None
        return held

    def overdue(self, now_ms: int) -> list[Connection]:
        """Live held connections past their deadline; closed ones are forgotten on the way."""
        late: list[Connection] = []
        for conn, deadline in list(self._deadlines.items()):
            if conn.state >= CLOSED:
                del self._deadlines[conn]
                conn.held_output = None
            elif deadline <= now_ms:
                late.append(conn)
        return late


__all__ = ["ConnackHolds", "DEFAULT_MAX_HOLD_MS", "HoldGate"]
