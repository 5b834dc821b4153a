"""Authentication hardening around :class:`fanout.mqtt.auth.AccessControl`: failed-login limits and the
bounded PBKDF2 pool.

Strategy (issue 11: a storm of wrong passwords must not delay valid logins, nor be a CPU amplifier):

- A CONNECT whose credential is answered from memory (a verified-password cache hit, the remembered last
  failure of that user name, the dev login, anonymous, a certificate) is decided on the loop at once, with
  no thread hop (``AccessControl.authenticate_cached``). Only the others need a PBKDF2 run.
- PBKDF2 runs in a small pool (``mqtt.auth_threads``, default 1) with a bounded number of verifications
  waiting or running (``mqtt.auth_queue``): past it a newcomer is refused at once with CONNACK 0x03
  (server unavailable), counted. So wrong passwords cost at most the pool's threads of CPU, however many
  arrive, and the loop keeps serving cached logins and traffic. The pool's threads run at nice +10 (Linux
  sets it per thread), so on a busy machine the loop thread is scheduled first.
- Failed logins (CONNACK 4 after a verification) are counted per source address and overall over
  ``mqtt.auth_fail_window_ms``; past ``mqtt.auth_fail_limit_per_host`` for an address, or
  ``mqtt.auth_fail_limit_total`` overall, further logins that would need a PBKDF2 run are refused with
  CONNACK 0x03 without running it (a cache hit still succeeds: it proves the password cheaply). The first
  refusal of each kind per window is logged as a warning; every one is counted in ``$SYS/broker/auth/...``.
- Unknown users cost the same PBKDF2 run as known ones (a dummy hash, see :mod:`auth`), so the answer time
  does not tell which users exist.

Everything here runs on the loop thread (the broker core's thread); the pool is the only other thread.
"""
from __future__ import annotations

import os
import threading
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import structlog

log = structlog.get_logger(__name__)


def peer_host(peer: Any) -> str:
    """The source address of a connection's ``peer`` (a ``(host, port)`` tuple or an object with ``host``)."""
    if isinstance(peer, (tuple, list)) and peer:
        return str(peer[0])
    host = getattr(peer, "host", None)
    return str(host) if host is not None else str(peer)


def _lower_thread_priority() -> None:
    """Run PBKDF2 at nice +10 (Linux: per thread), so on a busy machine the loop thread gets the CPU first."""
    try:
        os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), 10)
    except (AttributeError, OSError):  # not Linux, or not permitted: the bounded pool still holds
        pass


class LoginGuard:
    """Failed-login windows and the PBKDF2 pool of one broker.

    Args:
        limit_per_host: failures per source address per window before PBKDF2 logins from it are refused.
        limit_total: failures overall per window before every PBKDF2 login is refused.
        window_ms: length of the counting window.
        threads: PBKDF2 threads.
        queue: verifications waiting or running before a newcomer is refused.

    Attributes:
        failures, limited, queue_full: ``$SYS`` counters (failed logins; refusals by the limits; by the queue).
        pending: verifications handed to the pool and not yet answered.
        executor: the pool (the adapter runs the deferred authentication on it).
    """

    def __init__(self, *, limit_per_host: int, limit_total: int, window_ms: int, threads: int, queue: int) -> None:
        self._limit_host = limit_per_host
        self._limit_total = limit_total
        self._window = window_ms
        self._queue = queue
        self._window_start = 0
        self._by_host: dict[str, int] = {}
        self._total = 0
        self._warned: set[str] = set()
        self.failures = 0
        self.limited = 0
        self.queue_full = 0
        self.pending = 0
        self.executor = ThreadPoolExecutor(max_workers=threads, thread_name_prefix="mqtt-pbkdf2",
                                           initializer=_lower_thread_priority)

    def _roll(self, now_ms: int) -> None:
        if now_ms - self._window_start >= self._window:
            self._window_start = now_ms
            self._by_host.clear()
            self._total = 0
            self._warned.clear()

    def admit(self, host: str, now_ms: int) -> str | None:
        """Whether a login from ``host`` may start a PBKDF2 run now; None = yes, else the refusal reason."""
        self._roll(now_ms)
        if self._by_host.get(host, 0) >= self._limit_host:
            return self._refuse(host, "login failures from this address over mqtt.auth_fail_limit_per_host")
        if self._total >= self._limit_total:
            return self._refuse("*", "login failures over mqtt.auth_fail_limit_total")
        if self.pending >= self._queue:
            self.queue_full += 1
            if "queue" not in self._warned:
                self._warned.add("queue")
                log.warning("mqtt login queue full", queue=self._queue, hint="PBKDF2 verifications waiting")
            return "mqtt.auth_queue full"
        self.pending += 1
        return None

    def _refuse(self, key: str, reason: str) -> str:
        self.limited += 1
        if key not in self._warned:
            self._warned.add(key)
            log.warning("mqtt logins limited", host=key, reason=reason, window_ms=self._window,
                        per_host=self._limit_host, total=self._limit_total)
        return reason

    def done(self) -> None:
        """A verification admitted by :meth:`admit` has been answered."""
        self.pending -= 1

    def failed(self, host: str, now_ms: int) -> None:
        """A login from ``host`` was refused for a bad user name or password."""
        self._roll(now_ms)
        self.failures += 1
        self._total += 1
        by_host = self._by_host
        if len(by_host) >= 100_000 and host not in by_host:
            by_host.clear()  # bounded: a spray from very many addresses is caught by the overall limit
        by_host[host] = by_host.get(host, 0) + 1

    def close(self) -> None:
        self.executor.shutdown(wait=False, cancel_futures=True)


__all__ = ["LoginGuard", "peer_host"]
