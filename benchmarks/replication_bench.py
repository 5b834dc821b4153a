"""Replication benchmark (issue 4): ingest throughput with 0, 1 and 2 replicas, and failover time.

- ``ingest``: one local Ray instance (as ``fanout up`` embeds it) running three fanout clusters side by side
  with ``fanout.replicas`` = 0, 1, 2 (and ``min_replicas_to_ack`` = replicas, so every PUBACK waits for every
  replica; on one machine the replicas share the node). After a warm-up each, ``repeats`` rounds interleaved
  r0, r1, r2, r0, ... (a shared machine's drifting load hits all three alike): the platform publishes ``triggers`` triggers of ``vins_per_trigger`` fresh VINs
  (a window of ``WINDOW`` PUBLISHes in flight, QoS 1) and the round's rows/s = VINs / (last PUBACK - first
  PUBLISH); a PUBACK means fsynced on the primary and on every replica. The median round is reported.
  Replication cost = 1 - rows/s(replicas) / rows/s(0 replicas). Target: <= 30%.
- ``failover``: a 3-node ``ray.cluster_utils.Cluster`` (2 shards, 1 replica each on another node), vehicles of
  the victim shard connected to the head node; the platform keeps publishing one-VIN-per-vehicle triggers;
  the Ray node holding the victim shard's primary is killed (SIGKILL of its raylet and workers). Failover
  time = kill -> first delivery (to a vehicle of that shard) of a trigger written on the new primary. Also
  the controller's own promotion time (detection excluded). Target: <= 5 s. Run ``failover_repeats`` times
  (a fresh 3-node cluster each), the median reported.

The machine is shared (2 cores): the load average at start and end is recorded.

Run alone: ``python -m benchmarks.replication_bench [--quick]``; normally ``python -m benchmarks.run --only replication``.
"""
from __future__ import annotations

import os
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from .harness.plots import grouped_bars, pyplot, save_figure
from .harness.results import bench_parser, load_avg, log, result_name, save_result

NAME = "replication_bench"
WINDOW = 8
TARGET_COST = 0.30
TARGET_FAILOVER_S = 5.0
FIGURES = ("rows_per_s_r0", "rows_per_s_r1", "rows_per_s_r2", "cost_r1", "cost_r2", "failover_s",
           "promotion_s")
FAILOVER_TIMEOUT = "1500ms"


def _cfg(tmp: Path, **fanout: Any) -> Any:
    from fanout.config import load_config

    cfg = load_config(None, env={})
    cfg = cfg.replace("mqtt", host="127.0.0.1", port=0, sys_interval="0s")
    cfg = cfg.replace("storage", data_dir=str(tmp / "data"))
    return cfg.replace("fanout", dispatchers=2, gc_interval="0s", **fanout)


def _ingest_round(port: int, tag: str, triggers: int, per: int) -> float:
    """Publish ``triggers`` triggers of ``per`` fresh VINs with ``WINDOW`` in flight; returns rows/s."""
    import json

    from fanout.mqtt.packets import Puback, Publish
    from tests.integration.fanout_harness import platform

    c = platform(port, f"bench-{tag}")
    try:
        c.publish("$SDV-FANOUT/data/dbench", b"B" * 512, pid=1)
        assert isinstance(c.expect(Puback), Puback)
        payloads = [json.dumps({"ids": [f"B{tag}{t:03d}{j:06d}" for j in range(per)], "request_id": f"{tag}-{t}",
                                "data_id": "dbench"}).encode() for t in range(triggers)]
        started = time.perf_counter()
        sent = acked = 0
        while acked < triggers:
            while sent < triggers and sent - acked < WINDOW:
                c.send(Publish("$SDV-FANOUT/trigger", payloads[sent], 1, False, False, 2 + sent))
                sent += 1
            p = c.recv(60)
            assert isinstance(p, Puback), f"expected PUBACK, got {p!r}"
            acked += 1
        return triggers * per / (time.perf_counter() - started)
    finally:
        c.disconnect()


def ingest_phase(quick: bool, repeats: int) -> dict[str, Any]:
    """Three clusters (0, 1, 2 replicas) side by side on one Ray; rounds interleaved r0, r1, r2, r0, ... so that
    the load of a shared machine drifting over the run hits every configuration alike."""
    import contextlib

    import ray

    from actors.ray_observability import quiet_system_config
    from cluster.runtime import start_fanout

    triggers, per = (5, 2_000) if quick else (20, 10_000)
    out: dict[str, Any] = {"triggers": triggers, "vins_per_trigger": per, "window": WINDOW, "repeats": repeats,
                           "interleaved": True, "runs": {f"r{r}": [] for r in (0, 1, 2)}, "load_avg_1m": []}
    ray.init(address="local", num_cpus=2, include_dashboard=False, object_store_memory=200 << 20,
             resources={"fanout_node": 3}, log_to_driver=False, configure_logging=False,
             _system_config=quiet_system_config())  # as `fanout up` starts Ray
    try:
        with contextlib.ExitStack() as stack:
            clusters = {}
            for replicas in (0, 1, 2):
                tmp = stack.enter_context(tempfile.TemporaryDirectory(prefix="repl-bench-"))
                cfg = _cfg(Path(tmp), replicas=replicas, min_replicas_to_ack=replicas)
                fanout = start_fanout(cfg, name=f"repl-bench-{replicas}", log_to_driver=False)
                stack.callback(fanout.stop, shutdown_ray=False)
                clusters[replicas] = fanout
                _ingest_round(fanout.port, f"w{replicas}", max(2, triggers // 4), per)  # warm-up
            for i in range(repeats):
                for replicas, fanout in clusters.items():
                    out["runs"][f"r{replicas}"].append(round(_ingest_round(fanout.port, f"r{replicas}x{i}", triggers, per)))
                out["load_avg_1m"].append(load_avg()[0])
                log(NAME, f"round {i}: " + ", ".join(f"{k}={v[-1]:,}" for k, v in out["runs"].items()))
            for replicas, fanout in clusters.items():
                out[f"replication_r{replicas}"] = ray.get(fanout.controller.replication.remote(), timeout=30)
    finally:
        ray.shutdown()
    for replicas in (0, 1, 2):
        out[f"rows_per_s_r{replicas}"] = round(statistics.median(out["runs"][f"r{replicas}"]))
    base = out["rows_per_s_r0"]
    for r in (1, 2):
        out[f"cost_r{r}"] = round(1 - out[f"rows_per_s_r{r}"] / base, 3) if base else None
    return out


def _failover_once(tmp: Path) -> dict[str, Any]:
    from storage.keys import shard_of
    from tests.fault.harness import Fleet, Publisher, handles, kill_node, port_of, three_node_ray
    from tests.integration.fanout_harness import running_cluster

    with three_node_ray() as cluster:
        cfg = _cfg(tmp, replicas=1, failover_timeout=FAILOVER_TIMEOUT, heartbeat_interval="200ms")
        with running_cluster(cfg) as fanout:
            h = handles(fanout)
            head = cluster.head_node.node_id
            k = next(i for i, n in enumerate(h["primary_ray_nodes"]) if n != head)
            vins = [v for v in (f"FOV{i:04d}" for i in range(400)) if shard_of(v, 2) == k][:4]
            port = port_of(fanout, head)
            fleet = Fleet(port, vins)
            pub = Publisher(port)
            stop = threading.Event()

            def keep_publishing() -> None:
                t = 0
                while not stop.is_set():
                    pub.trigger(f"fo-{t:05d}", vins)
                    t += 1
                    time.sleep(0.05)

            try:
                pub.trigger("fo-first", vins)
                deadline = time.monotonic() + 30
                while not fleet.has_all(["fo-first"]) and time.monotonic() < deadline:
                    time.sleep(0.02)
                sent_before = len(pub.acked)
                worker = threading.Thread(target=keep_publishing, daemon=True)
                killed = time.monotonic()
                kill_node(cluster, fanout, h["primary_ray_nodes"][k])  # kill -9 its actors, SIGKILL its raylet
                worker.start()
                first = None
                deadline = killed + 60
                seen_before = {v: len(fleet.requests(v)) for v in vins}
                while first is None and time.monotonic() < deadline:
                    # The old primary's node is gone: a delivery to a vehicle of its shard comes from the new one.
                    if any(len(fleet.requests(v)) > seen_before[v] for v in vins):
                        first = time.monotonic()
                    time.sleep(0.005)
                fo = handles(fanout)["failovers"]
                promoted = fo[0] if fo else {}
                stop.set()
                worker.join(60)
                return {"failover_s": round(first - killed, 3) if first else None,
                        "promotion_s": promoted.get("seconds"), "detected_after_s": promoted.get("reason"),
                        "acked_before_kill": sent_before, "acked_total": len(pub.acked), "resends": pub.resends}
            finally:
                stop.set()
                pub.close()
                fleet.close()


def failover_phase(repeats: int) -> dict[str, Any]:
    runs = []
    for i in range(repeats):
        with tempfile.TemporaryDirectory(prefix="repl-fo-") as tmp:
            r = _failover_once(Path(tmp))
        log(NAME, f"failover run {i}: {r}")
        runs.append(r)
    ok = [r for r in runs if r["failover_s"] is not None]
    return {"runs": runs, "failover_timeout": FAILOVER_TIMEOUT, "heartbeat_interval": "200ms",
            "failover_s": statistics.median(r["failover_s"] for r in ok) if ok else None,
            "promotion_s": statistics.median(r["promotion_s"] for r in ok) if ok else None}


def plot(result: dict[str, Any], name: str, out_dir: str | Path | None) -> Path:
    plt = pyplot()
    fig, (a, b) = plt.subplots(1, 2, figsize=(10, 4))
    ing = result["ingest"]
    grouped_bars(a, ["0 replicas", "1 replica", "2 replicas"],
                 {"fanout": [ing.get("rows_per_s_r0"), ing.get("rows_per_s_r1"), ing.get("rows_per_s_r2")]},
                 ylabel="rows/s (PUBACK = on every replica)", title="Ingest throughput by replica count",
                 target=(ing.get("rows_per_s_r0") or 0) * (1 - TARGET_COST) or None, target_label="-30% of 0 replicas")
    fo = result["failover"]
    grouped_bars(b, ["kill -> first delivery", "promotion only"],
                 {"fanout": [fo.get("failover_s"), fo.get("promotion_s")]}, ylabel="seconds",
                 title=f"Failover (failover_timeout {fo.get('failover_timeout')})", target=TARGET_FAILOVER_S,
                 target_label="5 s target", fmt="{:.2f}")
    return save_figure(fig, name, out_dir)


def run(quick: bool = False, *, out_dir: str | Path | None = None) -> dict[str, Any]:
    os.environ.setdefault("FANOUT_LOG_LEVEL", "warning")
    os.environ.setdefault("RAY_DEDUP_LOGS", "0")
    from fanout import log as fanout_log

    fanout_log.configure(level=os.environ["FANOUT_LOG_LEVEL"])
    started = time.perf_counter()
    load_start = load_avg()[0]
    result: dict[str, Any] = {"mode": "quick" if quick else "full"}
    result["ingest"] = ingest_phase(quick, repeats=1 if quick else 7)
    result["failover"] = failover_phase(repeats=1 if quick else 3)
    ing, fo = result["ingest"], result["failover"]
    result["systems"] = {"fanout": {k: (ing.get(k) if k in ing else fo.get(k)) for k in FIGURES}}
    result["ratios"] = {"cost_r1": ing.get("cost_r1"), "cost_r2": ing.get("cost_r2")}
    result["targets_met"] = {
        "replication_cost_le_30pct": all(c is not None and c <= TARGET_COST for c in (ing["cost_r1"], ing["cost_r2"])),
        "failover_le_5s": fo["failover_s"] is not None and fo["failover_s"] <= TARGET_FAILOVER_S,
    }
    result["load_avg_1m_start"], result["load_avg_1m_end"] = load_start, load_avg()[0]
    result["duration_s"] = round(time.perf_counter() - started, 1)
    result["command"] = "python -m benchmarks.replication_bench" + (" --quick" if quick else "")
    save_result(result_name(NAME, quick), result, plot, out_dir)
    return result


def main(argv: list[str] | None = None) -> int:
    args = bench_parser(NAME, __doc__).parse_args(argv)
    r = run(args.quick, out_dir=args.out_dir)
    for k, v in {**r["systems"]["fanout"], **r["targets_met"]}.items():
        print(f"{k}: {v}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
