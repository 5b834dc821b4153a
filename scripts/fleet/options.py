"""Fleet options, source addresses over 127.0.0.0/8, and the descriptor limit.

Strategy:

- 127.0.0.0/8: a TCP client socket needs a distinct (source address, source port) per destination,
  and one source address has only the ephemeral port range (``ip_local_port_range``, ~28k here). Linux
  routes all of 127/8 to ``lo`` without configuration, so when the broker is on a loopback address,
  vehicle ``i`` (global index over all processes) binds to ``127.0.<1 + k // 254>.<1 + k % 254>`` with
  ``k = i // per_address`` before connecting. The socket sets ``IP_BIND_ADDRESS_NO_PORT`` first, so the
  kernel picks the port at connect time by the whole 4-tuple instead of reserving one at bind time.
- ``RLIMIT_NOFILE``: the soft limit is raised to the hard limit; a hard limit below what the process
  needs (its vehicles plus a margin) stops the run before any connect with a message saying so.
"""
from __future__ import annotations

import ipaddress
import resource
import socket
from dataclasses import dataclass

IP_BIND_ADDRESS_NO_PORT = getattr(socket, "IP_BIND_ADDRESS_NO_PORT", 24)  # Linux >= 4.2
FD_MARGIN = 64  # descriptors a fleet process needs besides its vehicles
MAX_ERROR_KINDS = 50


class FleetError(Exception):
    """The fleet cannot run as configured (the message says why and what to change)."""


@dataclass(slots=True)
class FleetOptions:
    """Everything a fleet run needs (the CLI flags of ``python -m scripts.mock_vehicles``, same names).

    ``vins`` None means generated from ``vin_prefix``/``count``/``vin_start``/``vin_digits``.
    ``order_ids`` (with ``expect_order``) is the platform's queue order; None orders request ids as strings.
    ``port`` may list several listeners (e.g. the nodes of a cluster, or brokers each under its own
    descriptor limit): vehicle ``i`` (global index) connects to ``port[i % len(port)]``.
    Durations are seconds; ``connect_rate`` (fleet-wide, shared equally by the processes) 0 is
    unlimited; ``connect_concurrency`` is per process; ``duration``/``expect`` None are unset.
    """

    host: str = "127.0.0.1"
    port: int | tuple[int, ...] = 1883
    vins: list[str] | None = None
    vin_prefix: str = "SIM"
    count: int = 10
    vin_start: int = 1
    vin_digits: int = 9
    username: str | None = None
    password: str | None = None
    persistent: bool = False
    keepalive: int = 60
    topic_prefix: str = "agent/{VIN}/proxy/request"
    heartbeat_interval: float = 30.0
    heartbeat_qos: int = 0
    ack_delay: float = 0.0
    ack_jitter: float = 0.0
    crash_rate: float = 0.0
    reconnect_delay: float = 1.0
    reconnect_max: float = 30.0
    connect_rate: float = 1000.0
    connect_concurrency: int = 256
    connect_timeout: float = 10.0
    processes: int = 1
    source_addresses: str = "auto"
    per_address: int = 20_000
    expect_order: bool = False
    order_ids: list[str] | None = None
    duration: float | None = None
    expect: int | None = None
    timeout: float = 300.0
    linger: float = 0.0
    max_requests: int = 10_000
    max_samples: int = 200_000
    max_packet_size: int = 16 * 1024 * 1024
    summary_requests: int = 1000
    display: str = "auto"
    seed: int | None = None

    def ports(self) -> list[int]:
        """``port`` as a list."""
        return [self.port] if isinstance(self.port, int) else list(self.port)

    def validate(self) -> None:
        """Raise :class:`FleetError` naming the first option out of range."""
        checks = [
            (0 <= self.crash_rate <= 1, "crash_rate must be in [0, 1]"),
            (bool(self.ports()) and all(0 < p < 65536 for p in self.ports()), "port must be in 1..65535"),
            (self.heartbeat_qos in (0, 1), "heartbeat_qos must be 0 or 1"),
            (0 <= self.keepalive <= 0xFFFF, "keepalive must be in 0..65535"),
            (self.processes >= 1, "processes must be >= 1"),
            (self.connect_concurrency >= 1, "connect_concurrency must be >= 1"),
            (self.connect_rate >= 0, "connect_rate must be >= 0 (0 = unlimited)"),
            (self.per_address >= 1, "per_address must be >= 1"),
            (self.source_addresses in ("auto", "off") or _is_ipv4(self.source_addresses),
             "source_addresses must be auto, off or a first IPv4 address"),
            (self.reconnect_delay >= 0 and self.reconnect_max >= self.reconnect_delay,
             "reconnect_delay must be >= 0 and <= reconnect_max"),
            (self.password is None or self.username is not None, "a password needs a username"),
            (self.display in ("auto", "live", "lines", "off"), "display must be auto, live, lines or off"),
            ("+" not in self.topic_prefix and "#" not in self.topic_prefix, "topic_prefix cannot hold wildcards"),
        ]
        for ok, message in checks:
            if not ok:
                raise FleetError(message)


def _is_ipv4(text: str) -> bool:
    try:
        ipaddress.IPv4Address(text)
    except ValueError:
        return False
    return True


def source_addresses(opts: FleetOptions, target: str, vehicles: int) -> list[str] | None:
    """The source addresses vehicles bind to, ``per_address`` consecutive vehicles each.

    Args:
        opts: ``source_addresses`` (``auto``: spread over 127/8 when ``target`` is IPv4 loopback;
            ``off``; or the first address of a consecutive range) and ``per_address``.
        target: the resolved broker address.
        vehicles: the whole fleet's size (over every process).

    Returns:
        The addresses, or None to let the kernel choose.
    """
    if opts.source_addresses == "off":
        return None
    if opts.source_addresses == "auto":
        if not (_is_ipv4(target) and ipaddress.IPv4Address(target).is_loopback):
            return None
        # 127.0.<1 + k // 254>.<1 + k % 254>: skips .0 and .255 in the last byte
        n = max(1, -(-vehicles // opts.per_address))
        return [f"127.0.{1 + k // 254}.{1 + k % 254}" for k in range(n)]
    first = int(ipaddress.IPv4Address(opts.source_addresses))
    return [str(ipaddress.IPv4Address(first + k)) for k in range(max(1, -(-vehicles // opts.per_address)))]


def processes_needed(connections: int, margin: int = FD_MARGIN, at_least: int = 1) -> int:
    """Processes that keep each one's share of ``connections`` sockets (plus ``margin`` other
    descriptors) under the hard ``RLIMIT_NOFILE``, which an unprivileged process cannot raise."""
    hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
    if hard == resource.RLIM_INFINITY:
        return at_least
    return max(at_least, -(-connections // max(1, hard - margin)))


def raise_nofile(needed: int) -> tuple[int, int]:
    """Raise the soft ``RLIMIT_NOFILE`` to the hard limit.

    Args:
        needed: descriptors this process needs.

    Returns:
        (soft, hard) after raising.

    Raises:
        FleetError: the hard limit is below ``needed`` (names both and the ways out).
    """
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and hard < needed:
        raise FleetError(
            f"RLIMIT_NOFILE hard limit is {hard}, below the {needed} descriptors this process needs: "
            f"split the fleet with --processes (each process needs its share + {FD_MARGIN}) or raise the hard "
            f"limit (ulimit -Hn, systemd LimitNOFILE, docker --ulimit nofile=...). A local broker needs as many.")
    if soft != hard:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    return hard, hard
