"""Persistent MQTT session state: everything that must survive a reconnect of one client id.

Strategy: a :class:`Session` is a slotted bag of state with small, allocation-free methods; the broker
decides *when* to call them and does the encoding and the writing. What lives here (MQTT-3.1.2-4):

- subscriptions: ``subs`` maps topic filter -> granted QoS (the broker mirrors them in its trie);
- outbound QoS 1/2 messages in flight: ``inflight`` maps packet id -> :class:`OutMsg`, in send order
  (dict order), bounded by ``limits.max_inflight`` messages and, with the queue, by ``limits.max_bytes``
  (``bytes``: topic + payload of every message held). A QoS 2 message moves from state ``SENT`` (awaiting
  PUBREC) to ``RELEASED`` (PUBREL sent, awaiting PUBCOMP). On resume, ``SENT`` messages are resent with
  DUP=1 and ``RELEASED`` ones get their PUBREL again (MQTT-4.4.0-1);
- the queue: QoS 1/2 messages that could not be sent (client offline, or window full), in arrival
  order, bounded by ``limits.max_queued`` messages, by ``limits.max_bytes`` for the session (queued + in
  flight) and by the node-wide :class:`QueueBudget` shared by every session of a broker (queued bytes of
  all sessions; offline sessions' queues have their own part of it, trimmed to it when a connection ends,
  and the connected ones are kept under it by the read back-pressure of :mod:`backpressure`). When a message does not fit, ``limits.drop_oldest`` selects what is dropped: the oldest
  queued messages until it fits, or the new one. A session holding nothing accepts one message of any
  size, so a message bigger than the session bound is still delivered to a client that keeps up. Every
  drop is counted here (``dropped``, ``dropped_unreported`` and the bound in ``drop_reason``); the
  broker counts them globally and logs them, aggregated per sweep;
- inbound QoS 2: packet ids whose PUBLISH was received (and routed, "method A" of the spec's figure
  4.3) but whose PUBREL has not arrived, so a DUP resend is not routed twice (MQTT-4.3.3-2).

Containers that most sessions never need (queue, inbound QoS 2 set) are created lazily to keep idle
sessions small. Packet ids are allocated round-robin skipping ids still in flight (MQTT-2.3.1-2).
"""
from __future__ import annotations

import sys
from collections import deque
from dataclasses import dataclass
from typing import Any, Callable, Hashable, Iterator

from .settings import MQTTSettings

# OutMsg states
SENT = 0  # PUBLISH written, awaiting PUBACK (QoS 1) or PUBREC (QoS 2)
RELEASED = 1  # QoS 2: PUBREC received and PUBREL written, awaiting PUBCOMP


class OutMsg:
    """One outbound QoS 1/2 application message held by a session (in flight or queued).

    Attributes:
        topic: topic name.
        payload: message bytes.
        qos: delivery QoS (1 or 2), already min(publish QoS, granted QoS).
        retain: RETAIN flag to send (only set for retained messages replayed on subscribe).
        tag: opaque value from :meth:`Broker.deliver`, reported back when acknowledged; None otherwise.
        state: :data:`SENT` or :data:`RELEASED`.
        dup: send the first PUBLISH with DUP=1 (the fanout layer knows it may be a redelivery of the
            same application message on an earlier session; resends within a session always set it).
        size: what it counts against the byte bounds: topic length + payload length.
        props: MQTT 5 properties the message carries from its publisher
            (:class:`~fanout.mqtt.message5.MsgProps`), or None.
        sub_ids: MQTT 5 Subscription Identifiers of the receiver's matching subscriptions.
    """

    __slots__ = ("topic", "payload", "qos", "retain", "tag", "state", "dup", "size", "props", "sub_ids")

    def __init__(self, topic: str, payload: bytes, qos: int, retain: bool = False, tag: Hashable = None,
                 dup: bool = False, props: Any = None, sub_ids: tuple[int, ...] = ()) -> None:
        self.topic = topic
        self.payload = payload
        self.qos = qos
        self.retain = retain
        self.tag = tag
        self.state = SENT
        self.dup = dup
        self.size = len(topic) + len(payload)
        self.props = props
        self.sub_ids = sub_ids

    def __repr__(self) -> str:
        return f"OutMsg({self.topic!r}, {len(self.payload)} bytes, qos={self.qos}, retain={self.retain}, tag={self.tag!r}, state={self.state})"


@dataclass(frozen=True, slots=True)
class SessionLimits:
    """Limits shared by every session of one broker (from the MQTT settings).

    Attributes:
        max_inflight: unacknowledged outbound QoS 1/2 messages per session (``mqtt.max_inflight``).
        max_queued: queued messages per session (``mqtt.max_offline_messages``); 0 queues nothing.
        drop_oldest: True drops the oldest queued message when full, False drops the new one
            (``mqtt.offline_drop`` = ``oldest`` / ``newest``).
        max_bytes: bytes of messages per session, queued + in flight (``mqtt.max_session_bytes``).
    """

    max_inflight: int = 32
    max_queued: int = 1000
    drop_oldest: bool = True
    max_bytes: int = sys.maxsize

    @classmethod
    def from_settings(cls, settings: MQTTSettings) -> "SessionLimits":
        """Build from the broker's :class:`MQTTSettings`."""
        return cls(settings.max_inflight, settings.max_offline_messages, settings.offline_drop == "oldest",
                   settings.max_session_bytes)


class QueueBudget:
    """The node-wide bound on queued bytes, shared by every session of one broker (``mqtt.max_queued_bytes``).

    The queued bytes are accounted in two parts, by whether their session has a live connection: a session's
    queue counts as ``online_bytes`` while it is connected and as ``offline_bytes`` while not (moved at
    :meth:`Session.attach` / :meth:`Session.detach`). Offline queues may hold ``offline_max_bytes`` together
    (``mqtt.offline_queued_fraction`` of the bound; past it the offline drop policy applies), so the rest of
    the bound is left to the queues of connected sessions, whose fill the read back-pressure
    (:mod:`backpressure`) watches: persistent sessions nobody comes back for cannot hold it.

    Attributes:
        max_bytes: the bound (online + offline).
        offline_max_bytes: the part offline queues may hold.
        online_bytes: bytes queued (not in flight) in connected sessions now.
        offline_bytes: bytes queued in sessions without a connection now.
    """

    __slots__ = ("max_bytes", "offline_max_bytes", "online_bytes", "offline_bytes")

    def __init__(self, max_bytes: int = sys.maxsize, offline_max_bytes: int | None = None) -> None:
        self.max_bytes = max_bytes
        self.offline_max_bytes = max_bytes if offline_max_bytes is None else offline_max_bytes
        self.online_bytes = 0
        self.offline_bytes = 0

    @classmethod
    def from_settings(cls, settings: MQTTSettings) -> "QueueBudget":
        """Build from the broker's :class:`MQTTSettings`."""
        total = settings.max_queued_bytes
        return cls(total, int(total * settings.offline_queued_fraction))

    @property
    def queued_bytes(self) -> int:
        """Bytes of the messages queued (not in flight) in all sessions now."""
        return self.online_bytes + self.offline_bytes


class Session:
    """State of one client id, kept across connections when ``clean`` is False.

    Args:
        client_id: the client identifier.
        clean: the CONNECT's clean session flag (a clean session ends with its connection).
        limits: shared :class:`SessionLimits`.
        budget: the broker's shared :class:`QueueBudget` (default: a budget of its own, unbounded).
        principal: the principal that made the session (None in tests that need no ACL).
    """

    __slots__ = (
        "client_id", "clean", "limits", "budget", "subs", "inflight", "queue", "last_pid", "conn",
        "inbound_qos2", "bytes", "dropped", "dropped_unreported", "drop_reason", "disconnected_ms", "principal",
        "opts", "expiry_ms", "inflight_cap", "read_principal", "read_filter", "read_ok",
    )

    def __init__(self, client_id: str, clean: bool, limits: SessionLimits, budget: QueueBudget | None = None,
                 principal: Any = None) -> None:
        self.client_id = client_id
        # the principal that made this session (fanout.mqtt.auth.Principal): it alone resumes it, and
        # every message given to the session is checked against its read rights (ACL at delivery)
        self.principal = principal
        # the ACL at delivery decided once for every topic one level under P/ of a covering filter P/+
        # (Delivery.deliver): for which principal (stale once the session's principal changes), which filter,
        # and the answer. Three slots, not a tuple: a tuple per session is one more object for every GC pass.
        self.read_principal: Any = None
        self.read_filter: str | None = None
        self.read_ok = False
        self.clean = clean
        self.limits = limits
        self.budget = budget if budget is not None else QueueBudget()
        self.bytes = 0  # topic + payload bytes of the messages held, queued and in flight
        self.subs: dict[str, int] = {}
        self.inflight: dict[int, OutMsg] = {}
        self.queue: deque[OutMsg] | None = None
        self.last_pid = 0
        self.conn: Any = None  # the live Connection, or None while offline
        self.inbound_qos2: set[int] | None = None
        self.dropped = 0  # messages dropped by the queue bound, over the session's life
        self.dropped_unreported = 0  # drops not yet logged by the broker
        self.drop_reason = ""  # the bound that made the last drop: mqtt.max_offline_messages, ...
        self.disconnected_ms = 0  # when the last connection ended (expiry of offline sessions)
        # MQTT 5: None for a 3.1.1 session; else filter -> SubOpts of the subscriptions with options
        # (No Local, Retain As Published, Subscription Identifier); such a session's messages take the
        # MQTT 5 delivery path
        self.opts: dict[str, Any] | None = None
        self.expiry_ms: int | None = None  # MQTT 5 Session Expiry Interval; None = mqtt.session_expiry
        self.inflight_cap = limits.max_inflight  # lowered to an MQTT 5 client's Receive Maximum

    def __repr__(self) -> str:
        return (f"Session({self.client_id!r}, clean={self.clean}, subs={len(self.subs)}, "
                f"inflight={len(self.inflight)}, queued={len(self.queue) if self.queue else 0}, "
                f"connected={self.conn is not None})")

    # -- outbound ----------------------------------------------------------------------------

    def alloc_pid(self) -> int:
        """Return the next free packet id (1..65535, round-robin, skipping ids in flight).

        The inflight window (at most 65535) guarantees a free id exists.
        """
        inflight = self.inflight
        pid = self.last_pid + 1
        if pid > 0xFFFF:
            pid = 1
        while pid in inflight:
            pid = pid + 1 if pid < 0xFFFF else 1
        self.last_pid = pid
        return pid

    def window_open(self, size: int = 0) -> bool:
        """True when a new QoS 1/2 message of ``size`` bytes may be sent now: connected, nothing queued,
        window not full, and within the session's byte bound (or the session holds nothing)."""
        return (self.conn is not None and not self.queue and len(self.inflight) < self.inflight_cap
                and (self.bytes + size <= self.limits.max_bytes or not self.bytes))

    def send(self, msg: OutMsg) -> int:
        """Put ``msg`` in flight and return its new packet id (the caller writes the PUBLISH)."""
        pid = self.alloc_pid()
        self.inflight[pid] = msg
        self.bytes += msg.size
        return pid

    def enqueue(self, msg: OutMsg) -> tuple[OutMsg, ...]:
        """Queue ``msg`` behind earlier ones, applying the bounds.

        Args:
            msg: the message that cannot be sent now.

        Returns:
            The messages dropped to respect ``limits.max_queued``, ``limits.max_bytes`` and the node's
            budget (the oldest queued ones, or ``msg`` itself, per ``limits.drop_oldest``); empty when
            nothing was dropped. ``drop_reason`` names the bound of the last drop.
        """
        q = self.queue
        if q is None:
            q = self.queue = deque()
        size = msg.size
        online = self.conn is not None
        reason = self._over(len(q), size, online)
        if reason is None:
            q.append(msg)
            self.bytes += size
            self._account(size, online)
            return ()
        dropped: list[OutMsg] = []
        if self.limits.drop_oldest:
            while q and reason is not None:
                old = q.popleft()
                self.bytes -= old.size
                self._account(-old.size, online)
                dropped.append(old)
                self.drop_reason = reason
                reason = self._over(len(q), size, online)
            if reason is None:
                q.append(msg)
                self.bytes += size
                self._account(size, online)
        if reason is not None:
            dropped.append(msg)
            self.drop_reason = reason
            if not q:
                self.queue = None
        self.dropped += len(dropped)
        self.dropped_unreported += len(dropped)
        return tuple(dropped)

    def _account(self, delta: int, online: bool) -> None:
        """Add ``delta`` queued bytes to the node budget's online or offline part."""
        if online:
            self.budget.online_bytes += delta
        else:
            self.budget.offline_bytes += delta

    def _over(self, queued: int, size: int, online: bool) -> str | None:
        """The bound a new queued message of ``size`` bytes would break (setting name), or None."""
        limits = self.limits
        if queued >= limits.max_queued:
            return "mqtt.max_offline_messages"
        if self.bytes + size > limits.max_bytes and self.bytes:
            return "mqtt.max_session_bytes"
        budget = self.budget
        if budget.online_bytes + budget.offline_bytes + size > budget.max_bytes:
            return "mqtt.max_queued_bytes"
        if not online and budget.offline_bytes + size > budget.offline_max_bytes:
            return "mqtt.offline_queued_fraction"
        return None

    def attach(self, conn: Any) -> None:
        """A connection takes the session: what it has queued now counts in the node's online bytes."""
        if self.conn is None and self.queue:
            n = sum(m.size for m in self.queue)
            self.budget.offline_bytes -= n
            self.budget.online_bytes += n
        self.conn = conn

    def detach(self) -> tuple[OutMsg, ...]:
        """The connection ended: the queue counts in the node's offline bytes, trimmed (oldest or newest
        first, per ``limits.drop_oldest``) to fit the offline part of the budget unless the session is
        clean (it is discarded next).

        Returns:
            The messages dropped to fit (counted in ``dropped``, ``drop_reason`` set), oldest first.
        """
        q = self.queue
        self.conn = None
        if not q:
            return ()
        budget = self.budget
        n = sum(m.size for m in q)
        budget.online_bytes -= n
        budget.offline_bytes += n
        if self.clean or budget.offline_bytes <= budget.offline_max_bytes:
            return ()
        dropped: list[OutMsg] = []
        take = q.popleft if self.limits.drop_oldest else q.pop
        while q and budget.offline_bytes > budget.offline_max_bytes:
            m = take()
            self.bytes -= m.size
            budget.offline_bytes -= m.size
            dropped.append(m)
        if not q:
            self.queue = None
        if not self.limits.drop_oldest:
            dropped.reverse()
        self.drop_reason = "mqtt.offline_queued_fraction"
        self.dropped += len(dropped)
        self.dropped_unreported += len(dropped)
        return tuple(dropped)

    def next_sendable(self) -> OutMsg | None:
        """Pop the oldest queued message when connected and the window has room, else None (pass it to
        :meth:`send`)."""
        q = self.queue
        if q and self.conn is not None and len(self.inflight) < self.inflight_cap:
            msg = q.popleft()
            self.budget.online_bytes -= msg.size
            self.bytes -= msg.size  # send() counts it again, in flight
            if not q:
                self.queue = None
            return msg
        return None

    def acked(self, pid: int, qos: int) -> OutMsg | None:
        """Handle PUBACK (``qos`` 1) or PUBCOMP (``qos`` 2) for ``pid``.

        Returns:
            The completed message, or None when ``pid`` is not in flight at that QoS/state (a stray
            or duplicate acknowledgement, ignored).
        """
        msg = self.inflight.get(pid)
        if msg is None or msg.qos != qos or (qos == 2 and msg.state != RELEASED):
            return None
        del self.inflight[pid]
        self.bytes -= msg.size
        return msg

    def pubrec(self, pid: int) -> bool:
        """Handle PUBREC for ``pid``: the message moves to ``RELEASED``.

        Returns:
            True when a PUBREL must be sent: the id is a QoS 2 message in flight (also when already
            released: a duplicate PUBREC gets its PUBREL again); False for an unknown id.
        """
        msg = self.inflight.get(pid)
        if msg is None or msg.qos != 2:
            return False
        msg.state = RELEASED
        return True

    def resend_order(self) -> Iterator[tuple[int, OutMsg]]:
        """(packet id, message) pairs in flight, oldest first, for a session resume."""
        return iter(list(self.inflight.items()))

    def tags(self) -> tuple[tuple[Hashable, ...], tuple[Hashable, ...]]:
        """(tags in flight, tags queued) of messages that carry a tag."""
        inflight = tuple(m.tag for m in self.inflight.values() if m.tag is not None)
        queued = tuple(m.tag for m in self.queue if m.tag is not None) if self.queue else ()
        return inflight, queued

    def drop_where(self, stale: Callable[[OutMsg], bool]) -> int:
        """Remove the messages, in flight or queued, for which ``stale(msg)`` is true, releasing their bytes
        from the session's and the node's budgets.

        Returns:
            How many were removed.
        """
        dropped = [pid for pid, m in self.inflight.items() if stale(m)]
        for pid in dropped:
            self.bytes -= self.inflight.pop(pid).size
        n = len(dropped)
        q = self.queue
        if q:
            kept = [m for m in q if not stale(m)]
            online = self.conn is not None
            for m in q:
                if stale(m):
                    self.bytes -= m.size
                    self._account(-m.size, online)
            n += len(q) - len(kept)
            q.clear()
            q.extend(kept)
            if not kept:
                self.queue = None
        return n

    def queued_count(self) -> int:
        """Messages waiting in the queue."""
        return len(self.queue) if self.queue else 0

    # -- inbound QoS 2 -----------------------------------------------------------------------

    def qos2_received(self, pid: int) -> bool:
        """Record an inbound QoS 2 PUBLISH; True when it is new (route it), False for a duplicate."""
        s = self.inbound_qos2
        if s is None:
            s = self.inbound_qos2 = set()
        elif pid in s:
            return False
        s.add(pid)
        return True

    def qos2_released(self, pid: int) -> None:
        """Forget an inbound QoS 2 packet id on PUBREL (a PUBCOMP is sent either way, MQTT-4.3.3-2)."""
        s = self.inbound_qos2
        if s is not None:
            s.discard(pid)
            if not s:
                self.inbound_qos2 = None

    def clear_messages(self) -> int:
        """Drop every held message (inflight and queued); return how many there were."""
        n = len(self.inflight) + self.queued_count()
        if self.queue:
            self._account(-sum(m.size for m in self.queue), self.conn is not None)
        self.inflight.clear()
        self.queue = None
        self.bytes = 0
        return n


__all__ = ["Session", "SessionLimits", "QueueBudget", "OutMsg", "SENT", "RELEASED"]
