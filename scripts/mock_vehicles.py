"""Mock vehicle fleet: N simulated vehicles on the project's MQTT codec, with delivery accounting.

Each vehicle (client id = VIN) connects, subscribes ``<topic prefix>/+`` at QoS 1, publishes
``ecp/<VIN>/online`` once subscribed, then ``ecp/<VIN>/heartbeat`` every ``--heartbeat-interval``
(jittered), and PUBACKs every delivery after ``--ack-delay``. ``--crash-rate p`` drops the socket, with
probability p, on the first receipt of a request before its PUBACK and reconnects after
``--reconnect-delay`` (redeliveries never crash, so p=1 still converges). Any other connection loss
reconnects with exponential backoff; every connect goes through a ``--connect-rate`` limiter.

Why it scales (see ``scripts/fleet/``): one slotted ``asyncio.Protocol`` per vehicle, no thread or task
per vehicle, uvloop when installed; source addresses spread over 127.0.0.0/8 so 100,000 connections do
not run out of ephemeral ports (one source address has ~28k); ``--processes P`` splits the fleet over
P processes that report to this one (default: as many as the hard ``RLIMIT_NOFILE`` needs, 6 for
100,000 vehicles under a 20,000 limit). ``RLIMIT_NOFILE`` is raised to its hard limit; a hard limit
below a process's share of vehicles stops the run with a message.

Latency uses the payload header of ``scripts/fleet/payload.py`` (12 bytes: ``b"SDVt"`` + send time in
µs since the epoch, big-endian) that ``scripts.mock_platform`` stamps; a delivery without it is measured from
the first delivery of the same request.

Summary (stdout, and ``--summary FILE``): vehicles, seconds, stop_reason (expect, duration, timeout,
signal, external, error), complete, connected and subscribed at the stop, connects, connect_errors,
errors (by kind), reconnects, crashes, connection_losses, received, unique, duplicates {total,
dup_flag, no_dup_flag}, order_violations, latency_ms {p50, p90, p99, max}, requests {request id:
{count, duplicates, timestamped, first_ms, latency_ms}}, connect {first_connects, seconds, rate_per_s}, rss
{total_bytes, per_vehicle_bytes, per_connection_bytes, per_process}, heartbeats, pubacks,
inflight_overlaps (a delivery received while an earlier one to the same vehicle was unacknowledged).
Exit status: 0 complete, 1 an ``--expect`` not reached or a process failed, 2 bad options.

Examples::

    python -m scripts.mock_vehicles --count 1000 --duration 60
    python -m scripts.mock_vehicles --count 100000 --connect-rate 5000 --heartbeat-interval 60
    python -m scripts.mock_vehicles --vin-prefix CAR --count 10000 --expect 100000 --timeout 600 \\
        --expect-order --summary fleet.json
    python -m scripts.mock_vehicles --count 50 --persistent --crash-rate 0.1 --ack-delay 0.05 --ack-jitter 0.02
"""
from __future__ import annotations

import argparse
import json
import sys

from scripts.fleet.options import FleetError, FleetOptions, processes_needed
from scripts.fleet.runner import run_fleet
from scripts.fleet.vins import add_vin_arguments, vins_from_args

__all__ = ["run_fleet", "FleetOptions", "FleetError", "main", "options_from_args"]


def build_parser() -> argparse.ArgumentParser:
    """The command-line parser (flags mirror :class:`FleetOptions`)."""
    p = argparse.ArgumentParser(prog="python -m scripts.mock_vehicles", description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter,
                                epilog="\n\n".join(__doc__.split("\n\n")[1:]))
    d = FleetOptions()
    b = p.add_argument_group("broker")
    b.add_argument("--host", default=d.host, help=f"broker address (default {d.host})")
    b.add_argument("--port", default=str(d.port),
                   help=f"broker port, or several comma-separated (vehicle i uses the i-th modulo; default {d.port})")
    b.add_argument("--username", default=None, help="MQTT user name (e.g. a user with role vehicle)")
    b.add_argument("--password", default=None, help="MQTT password")
    add_vin_arguments(p)
    v = p.add_argument_group("vehicle behaviour")
    v.add_argument("--persistent", action="store_true", help="clean_session=0 (the broker keeps sessions)")
    v.add_argument("--keepalive", type=int, default=d.keepalive, help=f"seconds (default {d.keepalive}; 0 = off)")
    v.add_argument("--topic-prefix", default=d.topic_prefix, help=f"delivery topic prefix (default {d.topic_prefix})")
    v.add_argument("--heartbeat-interval", type=float, default=d.heartbeat_interval,
                   help=f"seconds between heartbeats, +-10%% (default {d.heartbeat_interval:g}; 0 = none)")
    v.add_argument("--heartbeat-qos", type=int, choices=(0, 1), default=d.heartbeat_qos)
    v.add_argument("--ack-delay", type=float, default=d.ack_delay, help="seconds before each PUBACK (default 0)")
    v.add_argument("--ack-jitter", type=float, default=d.ack_jitter, help="+- seconds on the ack delay")
    v.add_argument("--crash-rate", type=float, default=d.crash_rate,
                   help="probability of dropping the socket on a new delivery before its PUBACK")
    v.add_argument("--reconnect-delay", type=float, default=d.reconnect_delay,
                   help=f"seconds before reconnecting after a crash; first backoff step (default {d.reconnect_delay:g})")
    v.add_argument("--reconnect-max", type=float, default=d.reconnect_max, help="backoff cap, seconds")
    c = p.add_argument_group("connections")
    c.add_argument("--connect-rate", type=float, default=d.connect_rate,
                   help=f"connects per second, whole fleet (default {d.connect_rate:g}; 0 = unlimited)")
    c.add_argument("--connect-concurrency", type=int, default=d.connect_concurrency,
                   help=f"handshakes (TCP connect to SUBACK) in progress per process (default {d.connect_concurrency})")
    c.add_argument("--connect-timeout", type=float, default=d.connect_timeout, help="TCP connect, CONNACK and SUBACK deadline")
    c.add_argument("--processes", type=int, default=0,
                   help="split the fleet over P processes (default 0: as many as the descriptor limit needs)")
    c.add_argument("--source-addresses", default=d.source_addresses,
                   help="auto (spread over 127.0.0.0/8 for a loopback broker), off, or a first IPv4 address")
    c.add_argument("--per-address", type=int, default=d.per_address, help="vehicles per source address")
    s = p.add_argument_group("accounting and stopping")
    s.add_argument("--expect-order", nargs="?", const="", default=None, metavar="FILE",
                   help="count order violations; FILE lists request ids in queue order, else ids compare as strings")
    s.add_argument("--duration", type=float, default=None, help="stop after S seconds")
    s.add_argument("--expect", type=int, default=None, help="stop once N unique deliveries arrived")
    s.add_argument("--timeout", type=float, default=d.timeout, help="give up on --expect after S seconds")
    s.add_argument("--linger", type=float, default=d.linger, help="seconds to keep counting after --expect is met")
    s.add_argument("--max-requests", type=int, default=d.max_requests, help="distinct request ids tracked")
    s.add_argument("--max-samples", type=int, default=d.max_samples, help="latency samples kept per request and process")
    s.add_argument("--summary-requests", type=int, default=d.summary_requests, help="requests listed in the summary")
    s.add_argument("--summary", metavar="FILE", default=None, help="also write the JSON summary to FILE")
    s.add_argument("--display", choices=("auto", "live", "lines", "off"), default=d.display, help="progress on stderr")
    s.add_argument("--seed", type=int, default=None, help="seed of jitter and crash choices")
    s.add_argument("--log-level", default="warning", help="structlog level (default warning)")
    return p


def options_from_args(args: argparse.Namespace) -> FleetOptions:
    """Build :class:`FleetOptions` from parsed arguments.

    Raises:
        FleetError: an option is out of range or a file cannot be read.
    """
    try:
        ports = tuple(int(p) for p in args.port.split(","))
        vins = vins_from_args(args)
        order_ids = read_vins_order(args.expect_order) if args.expect_order else None
    except (OSError, ValueError) as exc:
        raise FleetError(str(exc)) from exc
    opts = FleetOptions(
        host=args.host, port=ports, vins=vins, username=args.username, password=args.password,
        persistent=args.persistent, keepalive=args.keepalive, topic_prefix=args.topic_prefix,
        heartbeat_interval=args.heartbeat_interval, heartbeat_qos=args.heartbeat_qos, ack_delay=args.ack_delay,
        ack_jitter=args.ack_jitter, crash_rate=args.crash_rate, reconnect_delay=args.reconnect_delay,
        reconnect_max=args.reconnect_max, connect_rate=args.connect_rate, connect_concurrency=args.connect_concurrency,
        connect_timeout=args.connect_timeout, processes=args.processes or processes_needed(len(vins)), source_addresses=args.source_addresses,
        per_address=args.per_address, expect_order=args.expect_order is not None, order_ids=order_ids,
        duration=args.duration, expect=args.expect, timeout=args.timeout, linger=args.linger,
        max_requests=args.max_requests, max_samples=args.max_samples, summary_requests=args.summary_requests,
        display=args.display, seed=args.seed,
    )
    opts.validate()
    return opts


def read_vins_order(path: str) -> list[str]:
    """Request ids in queue order from ``path`` (one per line; blank lines and ``#`` comments skipped)."""
    with open(path) as f:
        return [rid for rid in (line.split("#", 1)[0].strip() for line in f) if rid]


def main(argv: list[str] | None = None) -> int:
    """Run the fleet from the command line; print the JSON summary on stdout.

    Returns:
        0 when complete, 1 when ``--expect`` was not reached or a process failed, 2 on bad options.
    """
    args = build_parser().parse_args(argv)
    from fanout.log import configure

    configure(level=args.log_level)
    try:
        summary = run_fleet(options_from_args(args), log_level=args.log_level)
    except FleetError as exc:
        print(f"mock_vehicles: {exc}", file=sys.stderr)
        return 2
    text = json.dumps(summary, indent=2)
    if args.summary:
        with open(args.summary, "w") as f:
            f.write(text + "\n")
    print(text, flush=True)
    return 0 if summary["complete"] else 1


if __name__ == "__main__":
    sys.exit(main())
