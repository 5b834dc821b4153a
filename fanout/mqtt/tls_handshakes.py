"""What became of the TLS handshakes of a listener: counted by outcome, logged, and bounded in number.

Strategy: asyncio's and uvloop's SSL transports run the handshake before the protocol sees the connection,
and drop a failed one without telling it or the loop's exception handler (an ``ssl.SSLError`` is an
``OSError``, which both log at debug level at most). A listener's clients with an expired certificate or
the wrong CA were therefore invisible. Both transports create their ``ssl.SSLObject`` through the
context's ``sslobject_class`` (the documented hook of ``SSLContext.wrap_bio``) and drive the handshake by
calling its ``do_handshake`` until it stops raising ``SSLWantReadError``; :meth:`HandshakeStats.install`
sets that class to one that counts how each handshake ended:

- ``completed``;
- ``failed/certificate``: the client's certificate was refused (no chain to the CA, expired, ...);
- ``failed/protocol``: any other TLS error (not TLS at all, a version below the minimum, no shared cipher,
  an alert from the client);
- ``abandoned``: the object went away mid-handshake: the handshake timeout, or the client left (a client
  refusing the server's certificate usually just closes). Counted when the object is freed, which uvloop
  does at once (reference counting) and asyncio's own loop at its next garbage collection;
- ``refused``: over the bound below, never started.

Failures are logged at most once per kind per ``log_interval_s`` (10 s), each line with the details of the
failure at hand and how many of that kind came since the previous line, so a misconfigured fleet costs a
line per ten seconds, not a line per vehicle; the counters have every one. The peer's address is not known
at this layer (the SSL object has no socket).

Bound: a handshake in progress holds the SSL state and buffers of its connection (~50 KiB measured with
uvloop, ~300 KiB with asyncio's loop) until it completes or times out, so a client that opens sockets and
sends nothing could hold up to RLIMIT_NOFILE of them. At most ``limit`` handshakes run at once: the first
``do_handshake`` of one more raises ``ssl.SSLError``, which closes that connection at once.
"""
from __future__ import annotations

import ssl
import time
from typing import Any, Callable

import structlog

log = structlog.get_logger(__name__)

_NOT_STARTED, _RUNNING, _ENDED = 0, 1, 2
_WANT = (ssl.SSLWantReadError, ssl.SSLWantWriteError)
FAILURES = ("certificate", "protocol")


class HandshakeRefused(ssl.SSLError):
    """Raised by the first ``do_handshake`` of a connection when ``limit`` handshakes are already running."""


def failure_kind(exc: BaseException) -> str:
    """``certificate`` for a refused client certificate, else ``protocol``."""
    return "certificate" if isinstance(exc, ssl.SSLCertVerificationError) else "protocol"


def failure_detail(exc: BaseException) -> str:
    """The most telling words of a handshake error: OpenSSL's verify message, else its reason, else the text."""
    return str(getattr(exc, "verify_message", None) or getattr(exc, "reason", None) or exc)


class _CountingSSLObject(ssl.SSLObject):
    """An ``SSLObject`` that reports how its handshake ended to ``_stats`` (set per subclass)."""

    _stats: "HandshakeStats"
    _hs = _NOT_STARTED

    def do_handshake(self) -> None:
        stats = self._stats
        if self._hs == _NOT_STARTED:
            if stats.running >= stats.limit:
                self._hs = _ENDED
                try:
                    stats.refuse()
                except Exception:  # only an SSLError from here closes the connection: never raise another
                    log.exception("tls handshake refusal not counted", listener=stats.name)
                raise HandshakeRefused(f"{stats.running} TLS handshakes in progress, the most allowed ({stats.setting})")
            self._hs = _RUNNING
            stats.running += 1
        try:
            super().do_handshake()
        except _WANT:
            raise
        except BaseException as exc:
            if self._hs == _RUNNING:
                self._hs = _ENDED
                stats.running -= 1
                try:
                    stats.failed(exc)
                except Exception:  # the handshake's own error must reach the transport, which closes on it
                    log.exception("tls handshake failure not counted", listener=stats.name)
            raise
        if self._hs == _RUNNING:
            self._hs = _ENDED
            stats.running -= 1
            stats.completed += 1

    def __del__(self) -> None:
        if self._hs == _RUNNING:
            self._hs = _ENDED
            stats = self._stats
            stats.running -= 1
            stats.abandoned += 1


class HandshakeStats:
    """Outcomes of the handshakes of the listeners whose context it is installed on.

    Args:
        name: what the listeners are, for the log (``mqtt``, ``channel``, ``http``).
        limit: handshakes in progress at most (see the module's strategy).
        setting: the configuration key of ``limit``, named in the error and the log.
        on_refused: called for each connection refused over ``limit`` (e.g. the broker's limit counters),
            instead of the log line this class would write.
        log_interval_s: a line per kind of failure at most this often.
        clock: seconds, monotonic (tests pass their own).
    """

    __slots__ = ("name", "limit", "setting", "on_refused", "running", "completed", "abandoned", "refused",
                 "failures", "log_interval_s", "_clock", "_next_log", "_unlogged", "_object_class")

    def __init__(self, name: str, limit: int, setting: str = "", on_refused: Callable[[], None] | None = None,
                 log_interval_s: float = 10.0, clock: Callable[[], float] = time.monotonic) -> None:
        if limit < 1:
            raise ValueError(f"{setting or 'limit'}: must be at least 1, got {limit}")
        self.name = name
        self.limit = limit
        self.setting = setting or "limit"
        self.on_refused = on_refused
        self.running = 0
        self.completed = 0
        self.abandoned = 0
        self.refused = 0
        self.failures: dict[str, int] = dict.fromkeys(FAILURES, 0)
        self.log_interval_s = log_interval_s
        self._clock = clock
        self._next_log: dict[str, float] = {}  # kind -> when its next line may be written
        self._unlogged: dict[str, int] = {}  # kind -> failures since its last line
        self._object_class = type("CountingSSLObject", (_CountingSSLObject,), {"_stats": self})

    def install(self, ctx: ssl.SSLContext) -> ssl.SSLContext:
        """Count the handshakes of the connections ``ctx`` will serve (set it before the listener starts)."""
        ctx.sslobject_class = self._object_class
        return ctx

    def failed(self, exc: BaseException) -> None:
        kind = failure_kind(exc)
        self.failures[kind] += 1
        self._log(kind, "tls handshake failed", kind=kind, error=failure_detail(exc), total=self.failures[kind])

    def refuse(self) -> None:
        self.refused += 1
        if self.on_refused is not None:
            self.on_refused()
        else:
            self._log("refused", "tls handshake refused", running=self.running, setting=self.setting,
                      total=self.refused)

    def _log(self, what: str, event: str, **details: Any) -> None:
        now = self._clock()
        if now < self._next_log.get(what, now):
            self._unlogged[what] = self._unlogged.get(what, 0) + 1
            return
        self._next_log[what] = now + self.log_interval_s
        log.warning(event, listener=self.name, since_last_line=self._unlogged.pop(what, 0), **details)

    def figures(self) -> dict[str, int]:
        """``{"running", "completed", "abandoned", "refused", "failed/certificate", "failed/protocol"}``."""
        out = {"running": self.running, "completed": self.completed, "abandoned": self.abandoned,
               "refused": self.refused}
        for kind, n in self.failures.items():
            out[f"failed/{kind}"] = n
        return out

    def sys_values(self, prefix: str = "$SYS/broker/tls/handshakes/") -> dict[str, Any]:
        """:meth:`figures` as ``$SYS`` topics under ``prefix``."""
        return {prefix + k: v for k, v in self.figures().items()}


__all__ = ["HandshakeStats", "HandshakeRefused", "failure_kind", "failure_detail", "FAILURES"]
