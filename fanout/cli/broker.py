"""``fanout broker``: run one MQTT node standalone (no Ray), until SIGINT/SIGTERM.

Prints one line on stdout, ``fanout broker ready mqtt://H:P`` (the real port when ``--port 0``), once the
listener accepts connections, then one more per configured extra listener (``fanout broker ready
mqtts://H:P``, ``... ws://H:P/mqtt``, ``... wss://H:P/mqtt``); everything else goes to the structlog stream
on stderr. SIGHUP reloads the TLS certificate files (open connections stay). SIGINT/SIGTERM stops the listener, closes every connection gracefully (wills are not published on a clean stop, see
:mod:`fanout.mqtt.broker`) and exits 0. A port that cannot be bound exits 1 with a message naming it.
"""
from __future__ import annotations

import argparse
import asyncio
import signal
import sys
from typing import Any


def register(sub: Any) -> None:
    p = sub.add_parser("broker", help="run one MQTT broker node standalone (no Ray)")
    p.add_argument("--config", default=None, help="TOML config file")
    p.add_argument("--host", default=None, help="listener address (default mqtt.host)")
    p.add_argument("--port", default=None, type=int, help="listener port, 0 = any free port (default mqtt.port)")
    p.set_defaults(func=_run)


def format_url(host: str, port: int) -> str:
    """``mqtt://host:port`` with IPv6 literals in brackets."""
    return f"mqtt://[{host}]:{port}" if ":" in host else f"mqtt://{host}:{port}"


def _run(args: argparse.Namespace) -> int:
    from fanout.config import listener_settings, load_config, mqtt_settings
    from fanout.mqtt.aio import MQTTServer, run

    cfg = load_config(args.config, overrides={"mqtt": {"host": args.host, "port": args.port}})
    # ConfigError (e.g. non-loopback without users, a certificate file that does not load) -> exit 2 in main
    server = MQTTServer(mqtt_settings(cfg), listeners=listener_settings(cfg))
    return run(lambda: _serve(server))


async def _serve(server: Any) -> int:
    try:
        await server.start()
    except RuntimeError as exc:
        print(f"fanout: {exc}", file=sys.stderr)
        return 1
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    loop.add_signal_handler(signal.SIGHUP, server.reload_tls)
    print(f"fanout broker ready {format_url(server.host, server.port)}", flush=True)
    for url in server.extra_urls:
        print(f"fanout broker ready {url}", flush=True)
    try:
        await stop.wait()
    finally:
        await server.stop(drain=True)
    return 0
