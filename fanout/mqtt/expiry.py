"""Which offline persistent sessions have expired: ``mqtt.session_expiry`` for 3.1.1 sessions, the Session
Expiry Interval of each MQTT 5 session (capped by ``mqtt.session_expiry``, see :mod:`link5`).

Strategy: 3.1.1 sessions all share one expiry, so the broker's ``offline`` dict (in disconnect order) is
already sorted by deadline and the scan stops at the first session still within it. MQTT 5 sessions each
have their own interval (``Session.expiry_ms``; -1 = never); they are skipped by that scan and kept in a
heap of (deadline, client id, disconnect time) instead, pushed when the session goes offline. A heap entry
whose session reconnected (or went offline again later) no longer matches its disconnect time and is
dropped when it comes up.
"""
from __future__ import annotations

import heapq
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .session import Session


class SessionExpiry:
    """Finds expired offline sessions of one broker.

    Args:
        state: the broker's :class:`~fanout.mqtt.state.BrokerState` (``sessions``, ``offline``).
        default_ms: ``mqtt.session_expiry`` in ms (0 = 3.1.1 sessions never expire).
    """

    def __init__(self, state: Any, default_ms: int) -> None:
        self._st = state
        self._default = default_ms
        self._heap: list[tuple[int, str, int]] = []

    def went_offline(self, s: Any, now_ms: int) -> None:
        """``s`` lost its connection at ``now_ms`` and is kept: remember its own deadline, if it has one."""
        if s.expiry_ms is not None and s.expiry_ms >= 0:
            heapq.heappush(self._heap, (now_ms + s.expiry_ms, s.client_id, now_ms))

    def expired(self, now_ms: int) -> list[Session]:
        """The offline sessions whose expiry has passed (the caller discards them)."""
        st = self._st
        sessions = st.sessions
        out: list[Session] = []
        heap = self._heap
        while heap and heap[0][0] <= now_ms:
            _, cid, since = heapq.heappop(heap)
            s = sessions.get(cid)
            if s is not None and s.conn is None and s.disconnected_ms == since and s.expiry_ms is not None:
                out.append(s)
        expiry = self._default
        if not expiry or not st.offline:
            return out
        for cid in st.offline:
            s = sessions[cid]
            if s.expiry_ms is not None:
                continue  # an MQTT 5 session: the heap above
            if now_ms - s.disconnected_ms < expiry:
                break
            out.append(s)
        return out


__all__ = ["SessionExpiry"]
