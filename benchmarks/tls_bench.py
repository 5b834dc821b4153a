"""MQTT over TLS: ``fanout broker`` against Mosquitto, each with a TLS listener, in the same run.

Figures, per system, on a fresh broker process per round (rounds interleaved over the systems):

- QoS 1 1 -> 1 throughput and broker CPU per message over TLS, and over plain TCP on the same broker for
  the cost of TLS itself (the lean load generator of :mod:`benchmarks.loadgen`, one process, uvloop).
- Connection storm with TLS handshakes: ``N`` clients connect (TCP + TLS 1.3 handshake + CONNECT/CONNACK),
  ``CONNECT_CONCURRENCY`` at a time; connects per second and broker CPU per connect. The generator pays
  the client side of every handshake in the same process, so its CPU per connect is recorded too: when
  it is close to the wall time per connect, the generator, not the broker, set the rate.

Both brokers get the same certificates (trustme: an ECDSA P-256 CA and a server certificate for
127.0.0.1), no client certificates (``tls_client_auth = "none"``; Mosquitto ``require_certificate false``)
and their defaults otherwise; settings shared with :mod:`benchmarks.broker_bench` come from
:mod:`benchmarks.harness.peers`. Target: TLS throughput >= 0.8x Mosquitto's over TLS.

Run alone: ``python -m benchmarks.tls_bench [--quick]``.
"""
from __future__ import annotations

import functools
import os
import ssl
import statistics
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Callable, Sequence

import trustme

from .broker_bench import WARMUP_MAX_S, _pump
from .harness.peers import FANOUT_BROKER_CONFIG, PeerBroker
from .harness.plots import grouped_bars, machine_title, pyplot, save_figure, system_series
from .harness.processes import HOST, free_port, proc_cpu_seconds, raise_nofile_limit, wait_for_quiet
from .harness.report import ratio
from .harness.results import bench_parser, load_avg, log, log_ratios, result_name, run_header, save_result
from .loadgen import CONNECT_CONCURRENCY, STALL_S, LeanClient, Tally, close_all, connect, connect_many, pubacks, run_async

NAME = "tls_bench"
SYSTEMS: tuple[str, ...] = ("fanout", "mosquitto")
TARGETS = {"tls_throughput_vs_mosquitto_min": 0.8}
FIGURES: tuple[str, ...] = ("throughput_tls_msg_s", "throughput_plain_msg_s", "cpu_us_per_msg_tls",
                            "cpu_us_per_msg_plain", "connects_per_s_tls", "cpu_us_per_connect_tls")


@dataclass(frozen=True)
class Sizes:
    messages: int  # QoS 1 messages per 1 -> 1 run
    warmup: int
    storm_connections: int
    rounds: int
    max_run_s: float
    quiet_wait_s: float


FULL = Sizes(messages=100_000, warmup=3_000, storm_connections=2_000, rounds=3, max_run_s=15.0, quiet_wait_s=10.0)
QUICK = Sizes(messages=2_000, warmup=200, storm_connections=200, rounds=1, max_run_s=10.0, quiet_wait_s=0.0)


class Certificates:
    """A CA and a server certificate for 127.0.0.1 as PEM files readable by Mosquitto's user."""

    def __init__(self) -> None:
        self.dir = Path(tempfile.mkdtemp(prefix="tls-bench-"))
        os.chmod(self.dir, 0o755)  # Mosquitto drops root privileges before it reads the files
        ca = trustme.CA()
        leaf = ca.issue_cert(HOST, "localhost")
        self.ca, self.cert, self.key = self.dir / "ca.pem", self.dir / "server.crt", self.dir / "server.key"
        ca.cert_pem.write_to_path(str(self.ca))
        self.cert.write_bytes(b"".join(p.bytes() for p in leaf.cert_chain_pems))
        self.key.write_bytes(leaf.private_key_pem.bytes())
        for f in (self.ca, self.cert, self.key):
            os.chmod(f, 0o644)

    def client_context(self) -> ssl.SSLContext:
        return ssl.create_default_context(cafile=str(self.ca))

    def broker(self, system: str, tls_port: int) -> PeerBroker:
        """A PeerBroker of ``system`` with an extra TLS listener on ``tls_port``."""
        if system == "fanout":
            conf = (FANOUT_BROKER_CONFIG + f'tls_port = {tls_port}\ntls_cert = "{self.cert}"\n'
                    f'tls_key = "{self.key}"\ntls_client_auth = "none"\n')
            return PeerBroker("fanout", fanout_config=conf)
        extra = (f"listener {tls_port} {HOST}\ncafile {self.ca}\ncertfile {self.cert}\nkeyfile {self.key}\n"
                 "require_certificate false\n")
        return PeerBroker("mosquitto", mosquitto_extra=extra)

    def cleanup(self) -> None:
        for f in self.dir.iterdir():
            f.unlink()
        self.dir.rmdir()


async def one_to_one(broker: PeerBroker, port: int, ctx: ssl.SSLContext | None, sizes: Sizes, label: str) -> dict[str, Any]:
    """QoS 1, one publisher, one subscriber, one topic (over TLS when ``ctx`` is given)."""
    tally = Tally()
    sub = await connect(broker.host, port, lambda: LeanClient(f"sub-{label}", tally), STALL_S, ctx)
    pub = await connect(broker.host, port, lambda: LeanClient(f"pub-{label}"), STALL_S, ctx)
    try:
        await sub.subscribe("bench/one", STALL_S)
        await _pump(broker, pub, tally, sizes.warmup, [b"bench/one"], "warmup", WARMUP_MAX_S)
        got = await _pump(broker, pub, tally, sizes.messages, [b"bench/one"], label, sizes.max_run_s)
        return {k: v for k, v in got.items() if "warmup" not in k}
    finally:
        close_all([pub, sub])


async def storm(broker: PeerBroker, port: int, ctx: ssl.SSLContext, n: int) -> dict[str, Any]:
    """``n`` TLS connects (handshake + CONNECT/CONNACK), ``CONNECT_CONCURRENCY`` at a time."""
    progress = [0]
    factories = [functools.partial(LeanClient, f"storm-{i}") for i in range(n)]
    cpu0, gen0, t0 = proc_cpu_seconds(broker.pid), time.process_time(), time.perf_counter()
    clients = await connect_many(broker.host, port, factories, progress, ssl=ctx)
    elapsed = time.perf_counter() - t0
    cpu, gen = proc_cpu_seconds(broker.pid) - cpu0, time.process_time() - gen0
    close_all(clients)
    return {"connects_per_s_tls": n / elapsed, "cpu_us_per_connect_tls": cpu / n * 1e6,
            "generator_cpu_us_per_connect_tls": gen / n * 1e6, "storm_duration_s": elapsed, "storm_connections": n}


def _attempt(system: str, what: str, figures: dict[str, Any], errors: dict[str, str],
             fn: Callable[[], dict[str, Any]]) -> None:
    """Run one measurement; a failure is recorded under ``errors`` and the other figures still run."""
    t0 = time.monotonic()
    try:
        got = fn()
    except Exception as exc:
        errors[what] = f"{type(exc).__name__}: {exc}"
        log(NAME, f"{system:9s} {what}: FAILED {errors[what]}")
        return
    figures.update(got)
    shown = {k: v for k, v in got.items() if k in FIGURES or k.startswith("generator_cpu_us_per_connect")}
    log(NAME, f"{system:9s} {what} ({time.monotonic() - t0:.1f} s): "
        + ", ".join(f"{k}={v:,.1f}" for k, v in shown.items()))


def bench_round(system: str, certs: Certificates, sizes: Sizes) -> dict[str, Any]:
    figures: dict[str, Any] = {}
    errors: dict[str, str] = {}
    if sizes.quiet_wait_s > 0:
        figures["machine_busy_pct_before"] = wait_for_quiet(sizes.quiet_wait_s)
    tls_port = free_port()
    ctx = certs.client_context()
    try:
        with certs.broker(system, tls_port) as broker:
            figures["version"] = broker.version()
            _attempt(system, "1to1 tls", figures, errors, lambda: run_async(one_to_one(broker, tls_port, ctx, sizes, "tls")))
            _attempt(system, "1to1 plain", figures, errors,
                     lambda: run_async(one_to_one(broker, broker.port, None, sizes, "plain")))
            _attempt(system, "tls storm", figures, errors,
                     lambda: run_async(storm(broker, tls_port, ctx, sizes.storm_connections)))
    except Exception as exc:  # broker did not start (e.g. Mosquitto not installed)
        errors["broker"] = f"{type(exc).__name__}: {exc}"
        log(NAME, f"{system:9s} FAILED {errors['broker']}")
    if errors:
        figures["errors"] = errors
    return figures


def aggregate(rounds: list[dict[str, Any]]) -> dict[str, Any]:
    """Medians over rounds of every numeric figure; each round's values under ``rounds``."""
    out: dict[str, Any] = {"rounds": rounds}
    keys = {k for r in rounds for k, v in r.items() if isinstance(v, (int, float)) and not isinstance(v, bool)}
    for k in sorted(keys):
        values = [r[k] for r in rounds if isinstance(r.get(k), (int, float))]
        out[k] = statistics.median(values) if values else None
    out["version"] = next((r["version"] for r in rounds if r.get("version")), None)
    return out


def compute_ratios(systems: dict[str, dict[str, Any]]) -> dict[str, float | None]:
    """fanout / mosquitto, median of the per-round ratios."""
    f, m = systems.get("fanout", {}), systems.get("mosquitto", {})

    def per_round(key: str) -> float | None:
        pairs = [ratio(a.get(key), b.get(key)) for a, b in zip(f.get("rounds", []), m.get("rounds", []))]
        pairs = [p for p in pairs if p is not None]
        return statistics.median(pairs) if pairs else None

    return {"throughput_tls_vs_mosquitto": per_round("throughput_tls_msg_s"),
            "throughput_plain_vs_mosquitto": per_round("throughput_plain_msg_s"),
            "cpu_us_per_msg_tls_vs_mosquitto": per_round("cpu_us_per_msg_tls"),
            "connects_per_s_tls_vs_mosquitto": per_round("connects_per_s_tls"),
            "cpu_us_per_connect_tls_vs_mosquitto": per_round("cpu_us_per_connect_tls")}


def plot(result: dict[str, Any], name: str, out_dir: str | Path | None) -> Path:
    fig, axes = pyplot().subplots(1, 3, figsize=(15, 4.8))
    series = functools.partial(system_series, result["systems"])
    grouped_bars(axes[0], ["TLS", "plain TCP"], series(["throughput_tls_msg_s", "throughput_plain_msg_s"]),
                 ylabel="QoS 1 messages / s", title="QoS 1 1 -> 1 throughput (target fanout >= 0.8x mosquitto over TLS)")
    grouped_bars(axes[1], ["TLS", "plain TCP"], series(["cpu_us_per_msg_tls", "cpu_us_per_msg_plain"]),
                 ylabel="broker CPU us / message", title="Broker CPU per QoS 1 message (lower is better)", fmt="{:,.1f}")
    n = result["params"]["storm_connections"]
    grouped_bars(axes[2], ["connects / s", "broker\nCPU us / connect", "generator\nCPU us / connect"],
                 series(["connects_per_s_tls", "cpu_us_per_connect_tls", "generator_cpu_us_per_connect_tls"]),
                 ylabel="(log)", log=True, title=f"TLS connection storm ({n:,} clients)")
    machine_title(fig, result, name, "broker and load generator share the machine")
    return save_figure(fig, name, out_dir)


def run(quick: bool = False, *, systems: Sequence[str] = SYSTEMS, out_dir: str | Path | None = None) -> dict[str, Any]:
    """Run every figure for every system; write ``<results>/tls_bench[_quick].json`` and ``.png``."""
    sizes = QUICK if quick else FULL
    name = result_name(NAME, quick, partial=set(systems) != set(SYSTEMS))
    raise_nofile_limit()
    pubacks()
    started = time.time()
    result: dict[str, Any] = {
        **run_header(name, quick, started),
        "load_avg_1m_start": load_avg()[0],
        "params": {**asdict(sizes), "connect_concurrency": CONNECT_CONCURRENCY, "qos": 1,
                   "certificates": "trustme ECDSA P-256 CA + server certificate, no client certificates",
                   "client": "asyncio + uvloop lean load generator, ssl.create_default_context()"},
        "targets": TARGETS,
        "notes": [
            "Each broker runs in its own process on 127.0.0.1 and shares the 2-core machine with the one "
            "load-generator process, which also does the client side of every TLS handshake and record.",
            f"{sizes.rounds} round(s) interleaved over the systems, each on a fresh broker; figures are medians "
            "over rounds, ratios medians of per-round ratios.",
        ],
        "systems": {},
    }
    certs = Certificates()
    try:
        log(NAME, f"mode={result['mode']} systems={list(systems)} sizes={asdict(sizes)} "
                  f"load {result['load_avg_1m_start']}")
        rounds: dict[str, list[dict[str, Any]]] = {s: [] for s in systems}
        for r in range(sizes.rounds):
            log(NAME, f"round {r + 1}/{sizes.rounds}")
            for system in systems:
                rounds[system].append(bench_round(system, certs, sizes))
    finally:
        certs.cleanup()
    result["load_avg_1m_end"] = load_avg()[0]
    for system in systems:
        result["systems"][system] = aggregate(rounds[system])
    result["ratios"] = compute_ratios(result["systems"])
    tls_ratio = result["ratios"]["throughput_tls_vs_mosquitto"]
    result["targets_met"] = {"tls_throughput_vs_mosquitto_min":
                             None if tls_ratio is None else tls_ratio >= TARGETS["tls_throughput_vs_mosquitto_min"]}
    save_result(name, result, plot, out_dir, started=started)
    return result


def main(argv: Sequence[str] | None = None) -> int:
    parser = bench_parser(NAME, __doc__)
    parser.add_argument("--systems", nargs="+", choices=SYSTEMS, default=list(SYSTEMS))
    args = parser.parse_args(argv)
    result = run(args.quick, systems=args.systems, out_dir=args.out_dir)
    log_ratios(NAME, result["ratios"])
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
