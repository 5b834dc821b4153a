"""``/metrics`` latency with many requests known: the issue-15 bound (<= 50 ms with 1,000 requests).

An embedded cluster (local Ray, 2 dispatchers, HTTP on a free loopback port) is given ``--requests``
requests of ``--vins`` VINs each through the platform client (acknowledged: durable), a few of them partly
delivered, one cancelled; then ``/metrics`` is scraped ``--scrapes`` times, one after the other, and the
wall time of each answer is reported (median, p90, max) with the controller's own gathering time
(``fanout_metrics_collect_seconds``) and the ``fanout_requests{state}`` figures.

    python -m benchmarks.metrics_bench [--requests 1000] [--vins 3] [--scrapes 50]
"""
from __future__ import annotations

import argparse
import asyncio
import json
import os
import socket
import statistics
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any, Sequence

from prometheus_client.parser import text_string_to_metric_families


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


async def _submit(port: int, outbox: Path, requests: int, vins: int) -> None:
    from fanout.client import FanoutClient

    async with FanoutClient(port=port, username="platform", password="platform", outbox_dir=outbox) as client:
        handles = [await client.submit([f"MB{r:04d}V{v}" for v in range(vins)], b"BLOB", request_id=f"req-{r:04d}",
                                       data_id="blob-1") for r in range(requests)]
        await asyncio.gather(*(h.acked() for h in handles))


def _scrape(url: str) -> tuple[float, bytes]:
    started = time.perf_counter()
    with urllib.request.urlopen(url, timeout=30) as res:
        body = res.read()
    return (time.perf_counter() - started) * 1000, body


def measure(requests: int, vins: int, scrapes: int) -> dict[str, Any]:
    import ray

    from cluster.runtime import start_fanout
    from fanout import log
    from fanout.config import load_config

    log.configure(json=True, level="warning")
    with tempfile.TemporaryDirectory(prefix="metrics-bench-") as tmp:
        cfg = load_config(None, env={})
        cfg = cfg.replace("mqtt", host="127.0.0.1", port=0).replace("http", port=_free_port())
        cfg = cfg.replace("storage", data_dir=str(Path(tmp) / "data")).replace("fanout", dispatchers=2)
        cluster = start_fanout(cfg, address="local", log_to_driver=False)
        try:
            t0 = time.perf_counter()
            asyncio.run(_submit(cluster.port, Path(tmp) / "outbox", requests, vins))
            submit_s = time.perf_counter() - t0
            ray.get(cluster.controller.cancel_request.remote("req-0000"))
            url = cluster.info["http"] + "metrics"
            _scrape(url)  # warm
            took, body = [], b""
            for _ in range(scrapes):
                ms, body = _scrape(url)
                took.append(ms)
            took.sort()
            states: dict[str, float] = {}
            collect_s = None
            for family in text_string_to_metric_families(body.decode()):
                for sample in family.samples:
                    if sample.name == "fanout_requests":
                        states[sample.labels["state"]] = sample.value
                    elif sample.name == "fanout_metrics_collect_seconds":
                        collect_s = sample.value
            return {"requests": requests, "vins_per_request": vins, "scrapes": scrapes,
                    "submit_s": round(submit_s, 1), "median_ms": round(statistics.median(took), 1),
                    "p90_ms": round(took[int(0.9 * len(took)) - 1], 1), "max_ms": round(took[-1], 1),
                    "last_collect_ms": None if collect_s is None else round(collect_s * 1000, 1),
                    "fanout_requests": states, "body_bytes": len(body), "loadavg": list(os.getloadavg())}
        finally:
            cluster.stop(shutdown_ray=True)


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--requests", type=int, default=1000)
    ap.add_argument("--vins", type=int, default=3)
    ap.add_argument("--scrapes", type=int, default=50)
    args = ap.parse_args(argv)
    print(json.dumps(measure(args.requests, args.vins, args.scrapes)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
