"""``fanout up``: start (or join) Ray, place the fanout actors, run until SIGINT/SIGTERM.

Prints one line on stdout, ``fanout ready mqtt://H:P`` (the first node's listener, the real port when
``--port 0``), once every node accepts connections, then one more per extra listener of that node
(``fanout ready mqtts://H:P``, ``fanout ready ws://H:P/mqtt``, ``fanout ready wss://H:P/mqtt``), then
``fanout console http://H:P/`` when the HTTP listener is on (``[http] port``, 0 = off; ``https`` with the MQTT
certificate); logs go to stderr. SIGHUP reloads the TLS certificate files on every connection node (a Ray call, ``reload_tls``:
actors install no signal handlers); open connections stay. SIGINT/SIGTERM drains the nodes,
closes the stores, kills the actors and shuts Ray down (exit 0). A port that cannot be bound, or no Ray
node with the ``fanout_node`` resource, exits 1 with a message; a bad config exits 2 before Ray starts.

The Ray address is written to ``<data_dir>/ray_address``; ``fanout status`` and ``fanout inspect`` with
the same ``--data-dir``/config find the cluster through it. The process holds the data dir lock
(:mod:`storage.data_dir_lock`) for its whole life: offline ``fanout gc`` refuses that directory meanwhile,
and ``fanout up`` refuses (exit 1, before Ray starts) a directory that offline GC or another ``fanout up``
holds.
"""
from __future__ import annotations

import argparse
import signal
import sys
import threading
from pathlib import Path
from typing import Any

import structlog

log = structlog.get_logger(__name__)


def register(sub: Any) -> None:
    p = sub.add_parser("up", help="start (or join) Ray and run the fanout cluster until SIGINT/SIGTERM")
    p.add_argument("--config", default=None, help="TOML config file")
    p.add_argument("--host", default=None, help="MQTT listener address (default mqtt.host)")
    p.add_argument("--port", default=None, type=int, help="MQTT port of the first node, 0 = any free port")
    p.add_argument("--data-dir", default=None, help="root of the LMDB shards (default storage.data_dir)")
    p.add_argument("--address", default=None, help="Ray: local (default), auto or HOST:PORT")
    p.set_defaults(func=_run)


def _run(args: argparse.Namespace) -> int:
    from fanout.config import listener_settings, load_config, mqtt_settings
    from fanout.mqtt.auth import AccessControl, is_loopback_host
    from fanout.mqtt.tls import build_context

    cfg = load_config(args.config, overrides={
        "mqtt": {"host": args.host, "port": args.port},
        "storage": {"data_dir": args.data_dir},
        "cluster": {"address": args.address},
    })
    from cluster.http.auth import check_http_config

    # Listener policy errors (e.g. non-loopback without users) are config errors: exit 2 before Ray starts.
    AccessControl(mqtt_settings(cfg), listener_is_loopback=is_loopback_host(cfg.mqtt.host))
    listeners = listener_settings(cfg)
    if listeners.tls is not None:
        build_context(listeners.tls)  # a certificate file that does not load names its key here
    check_http_config(cfg)

    from storage.data_dir_lock import DataDirBusy, DataDirLock

    data_dir = Path(cfg.storage.data_dir)
    data_dir.mkdir(parents=True, exist_ok=True)
    try:
        lock = DataDirLock(data_dir, "fanout up").acquire()
    except DataDirBusy as exc:
        print(f"fanout: {exc}; retry when it has finished", file=sys.stderr)
        return 1
    with lock:
        return _serve(cfg)


def _serve(cfg: Any) -> int:
    import ray

    from cluster.runtime import init_ray, start_fanout

    address = cfg.cluster.address
    try:
        init_ray(cfg, address)
    except Exception as exc:
        print(f"fanout: cannot start or join Ray at {address!r}: {str(exc).strip().splitlines()[0]}", file=sys.stderr)
        return 1
    stop = threading.Event()
    reload = threading.Event()

    def on_signal(signum: int, frame: Any) -> None:
        (reload if signum == signal.SIGHUP else stop).set()

    # after ray.init, which installs its own SIGTERM handler in the driver
    previous = {sig: signal.signal(sig, on_signal) for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)}
    try:
        try:
            cluster = start_fanout(cfg, detached=address != "local")
        except RuntimeError as exc:
            print(f"fanout: {exc}", file=sys.stderr)
            return 1
        try:
            if not stop.is_set():
                print(f"fanout ready {cluster.url}", flush=True)
                for url in cluster.nodes[0].get("urls", ()):
                    print(f"fanout ready {url}", flush=True)
                if cluster.info.get("http"):
                    print(f"fanout console {cluster.info['http']}", flush=True)
            while not stop.wait(0.5):
                if reload.is_set():
                    reload.clear()
                    _reload_tls(cluster)
            log.info("fanout stopping", reason="signal")
        finally:
            cluster.stop(shutdown_ray=False)
            log.info("fanout stopped")
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        ray.shutdown()
    return 0


def _reload_tls(cluster: Any, timeout_s: float = 30.0) -> None:
    """Forward SIGHUP: every connection node reloads its certificate files (results logged)."""
    import ray

    try:
        nodes = ray.get(cluster.controller.handles.remote(), timeout=timeout_s)["nodes"]
        results = ray.get([h.reload_tls.remote() for h in nodes.values()], timeout=timeout_s)
    except Exception as exc:  # a reload must never stop the cluster
        log.error("tls reload failed", error=str(exc)[:300])
        return
    log.info("tls reload", nodes=dict(zip(nodes, results)))
