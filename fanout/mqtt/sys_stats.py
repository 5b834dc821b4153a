"""``$SYS/broker/...`` statistics, published as retained messages every ``mqtt.sys_interval_ms``.

Strategy: the broker keeps plain integer counters on its shared state (one ``+= 1`` on the hot path,
nothing else); :class:`SysStats` reads them when a publish is due, formats values as ASCII payloads and returns
only the topics whose value changed since the last publish (like Mosquitto). Names follow Mosquitto's
``$SYS`` tree so existing tools read them. Two hooks let the fanout layer extend it without touching
this module:

- :meth:`SysStats.add_source`: a callable returning ``{"$SYS/fanout/...": value}`` merged into each
  snapshot (pending rows, in flight, delivered, data blobs);
- :meth:`SysStats.add_listener`: a callable receiving every full snapshot ``{topic: value}`` (to upsert
  it into a metrics table).

Heap is the process RSS: psutil when installed, else ``/proc/self/statm``, else the peak RSS from
``resource`` (the only value available everywhere).
"""
from __future__ import annotations

from typing import Any, Callable

import structlog

log = structlog.get_logger(__name__)

try:
    from importlib.metadata import version as _pkg_version

    VERSION = _pkg_version("sdv-fanout")
except Exception:  # pragma: no cover - not installed as a package
    VERSION = "0.1.0"

SourceFn = Callable[[], dict[str, Any]]
ListenerFn = Callable[[dict[str, Any]], None]


def rss_bytes() -> int:
    """Current resident set size of this process in bytes (peak RSS when nothing better exists)."""
    try:
        import psutil

        return int(psutil.Process().memory_info().rss)
    except Exception:
        pass
    try:
        with open("/proc/self/statm", "rb") as f:
            import os

            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except Exception:
        pass
    import resource

    return int(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss) * 1024


class SysStats:
    """Builds ``$SYS`` snapshots from a broker's counters.

    Args:
        broker: the :class:`~fanout.mqtt.state.BrokerState` (or anything with the same counters) read.
        interval_ms: publish period; 0 disables publishing (snapshots still work).
        start_ms: broker start time on the broker's clock (uptime origin).
    """

    __slots__ = ("_broker", "interval_ms", "_start_ms", "_next_ms", "_last", "_sources", "_listeners")

    def __init__(self, broker: Any, interval_ms: int, start_ms: int) -> None:
        self._broker = broker
        self.interval_ms = interval_ms
        self._start_ms = start_ms
        self._next_ms = start_ms  # first publish at the first tick
        self._last: dict[str, str] = {}
        self._sources: list[SourceFn] = []
        self._listeners: list[ListenerFn] = []

    def add_source(self, fn: SourceFn) -> None:
        """Add a callable returning extra ``{topic: value}`` pairs (e.g. ``$SYS/fanout/pending``)."""
        self._sources.append(fn)

    def add_listener(self, fn: ListenerFn) -> None:
        """Add a callable receiving each full snapshot ``{topic: value}`` after it is published."""
        self._listeners.append(fn)

    def snapshot(self, now_ms: int) -> dict[str, Any]:
        """Every statistic as ``{topic: value}`` (ints, or strings for version and uptime)."""
        b = self._broker
        connected = b.clients_connected
        disconnected = b.sessions_offline
        snap: dict[str, Any] = {
            "$SYS/broker/version": f"sdv-fanout {VERSION}",
            "$SYS/broker/uptime": f"{max(0, now_ms - self._start_ms) // 1000} seconds",
            "$SYS/broker/clients/connected": connected,
            "$SYS/broker/clients/disconnected": disconnected,
            "$SYS/broker/clients/total": connected + disconnected,
            "$SYS/broker/clients/maximum": b.clients_maximum,
            "$SYS/broker/messages/received": b.msgs_received,
            "$SYS/broker/messages/sent": b.msgs_sent,
            "$SYS/broker/publish/messages/received": b.pub_received,
            "$SYS/broker/publish/messages/sent": b.pub_sent,
            "$SYS/broker/publish/messages/dropped": b.pub_dropped,
            "$SYS/broker/publish/messages/denied": b.pub_denied,
            "$SYS/broker/bytes/received": b.bytes_received,
            "$SYS/broker/bytes/sent": b.bytes_sent,
            "$SYS/broker/subscriptions/count": b.subscription_count,
            "$SYS/broker/retained messages/count": len(b.retained),
            "$SYS/broker/retained messages/bytes": b.retained.stored_bytes,
            "$SYS/broker/heap/current": rss_bytes(),
            "$SYS/broker/messages/queued/bytes": b.queue_budget.queued_bytes,
            "$SYS/broker/messages/queued/online bytes": b.queue_budget.online_bytes,
            "$SYS/broker/messages/queued/offline bytes": b.queue_budget.offline_bytes,
            "$SYS/broker/backpressure/episodes": b.pressure.episodes,
            "$SYS/broker/backpressure/pauses": b.pressure.pauses,
            "$SYS/broker/backpressure/paused": len(b.pressure.paused),
            "$SYS/broker/publish/messages/denied_at_delivery": getattr(b, "deliveries_denied", 0),
            "$SYS/broker/clients/mqtt5/connected": getattr(b, "v5_connected", 0),
            "$SYS/broker/publish/messages/expired": getattr(b, "expired_dropped", 0),
            "$SYS/broker/publish/messages/too_large": getattr(b, "too_large_dropped", 0),
        }
        for name, hits in b.caps.hits.items():
            snap[f"$SYS/broker/limits/{name}"] = hits
        guard = getattr(getattr(b, "acl", None), "guard", None)  # fanout.mqtt.login_guard.LoginGuard
        if guard is not None:
            snap["$SYS/broker/auth/failures"] = guard.failures
            snap["$SYS/broker/auth/limited"] = guard.limited
            snap["$SYS/broker/auth/queue_full"] = guard.queue_full
        for fn in self._sources:
            try:
                snap.update(fn())
            except Exception as exc:  # a broken hook must not stop the broker
                log.warning("sys stats source failed", source=repr(fn), error=repr(exc))
        return snap

    def due(self, now_ms: int) -> dict[str, bytes] | None:
        """If a publish is due at ``now_ms``, return the changed ``{topic: payload}`` (may be empty).

        Returns None when publishing is disabled or not yet due. Listeners get the full snapshot.
        """
        if self.interval_ms <= 0 or now_ms < self._next_ms:
            return None
        self._next_ms = now_ms + self.interval_ms
        snap = self.snapshot(now_ms)
        changed: dict[str, bytes] = {}
        last = self._last
        for topic, value in snap.items():
            text = str(value)
            if last.get(topic) != text:
                last[topic] = text
                changed[topic] = text.encode("ascii", "replace")
        for fn in self._listeners:
            try:
                fn(snap)
            except Exception as exc:
                log.warning("sys stats listener failed", listener=repr(fn), error=repr(exc))
        return changed


__all__ = ["SysStats", "rss_bytes", "VERSION"]
