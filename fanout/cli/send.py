"""``fanout send``: submit one batch (blob + VINs) with the platform client, with a progress bar.

Defaults for host, port and ``max_batch`` come from the config (``--config``, ``FANOUT_MQTT_PORT``,
...), so the command talks to the cluster the config describes. The submission goes through the
same durable outbox as any client (``--outbox-dir``): if the cluster is unreachable it is kept there
and sent by the next ``fanout send`` (or client) that opens that outbox, and leftovers of an earlier
run are sent first. Exit codes: 0 acknowledged, 1 rejected or dead-lettered, 2 bad arguments or
config, 3 not acknowledged within ``--timeout`` (it stays in the outbox).
"""
from __future__ import annotations

import argparse
import asyncio
import os
import sys
from pathlib import Path
from typing import Any


def register(sub: Any) -> None:
    p = sub.add_parser("send", help="submit a data blob and a trigger naming VINs")
    p.add_argument("--config", default=None, help="TOML config file (defaults for host, port, max_batch)")
    p.add_argument("--host", default=None, help="cluster MQTT host (default mqtt.host)")
    p.add_argument("--port", default=None, type=int, help="cluster MQTT port (default mqtt.port)")
    p.add_argument("--username", default=os.environ.get("FANOUT_USERNAME"), help="login (env FANOUT_USERNAME)")
    p.add_argument("--password", default=os.environ.get("FANOUT_PASSWORD"), help="password (env FANOUT_PASSWORD)")
    p.add_argument("--client-id", default=None, help="MQTT client id (default: random)")
    vins = p.add_mutually_exclusive_group(required=True)
    vins.add_argument("--vins", metavar="FILE", help="file with one VIN per line ('-' = stdin; blank and # lines skipped)")
    vins.add_argument("--vin", action="append", metavar="VIN", help="a VIN (repeatable)")
    p.add_argument("--payload-file", required=True, metavar="F", help="the data blob")
    p.add_argument("--request-id", default=None, help="request id (default: random)")
    p.add_argument("--data-id", default=None, help="data id (default: SHA-1 of the payload)")
    p.add_argument("--max-batch", default=None, type=int, help="most VINs per trigger (default fanout.max_batch)")
    p.add_argument("--outbox-dir", default=None, help="durable outbox directory (default ~/.local/state/sdv-fanout/outbox)")
    p.add_argument("--durability", choices=("hybrid", "always"), default="hybrid", help="'always' fsyncs before sending")
    p.add_argument("--timeout", default=60.0, type=float, help="seconds to wait for the acknowledgements")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    p.set_defaults(func=_run)


def read_vins(source: str) -> list[str]:
    """VINs from a file (one per line, blank lines and ``#`` comments skipped) or ``-`` for stdin."""
    text = sys.stdin.read() if source == "-" else Path(source).read_text(encoding="utf-8")
    return [line.strip() for line in text.splitlines() if line.strip() and not line.lstrip().startswith("#")]


def _run(args: argparse.Namespace) -> int:
    from fanout.config import load_config

    cfg = load_config(args.config, overrides={"mqtt": {"host": args.host, "port": args.port}})
    try:
        vins = args.vin if args.vin else read_vins(args.vins)
        payload = Path(args.payload_file).read_bytes()
    except OSError as exc:
        print(f"fanout send: {exc}", file=sys.stderr)
        return 2
    if not vins:
        print("fanout send: no VINs given", file=sys.stderr)
        return 2
    return asyncio.run(_send(args, cfg.mqtt.host, cfg.mqtt.port, args.max_batch or cfg.fanout.max_batch,
                             cfg.mqtt.max_packet_size_bytes, vins, payload))


async def _send(args: argparse.Namespace, host: str, port: int, max_batch: int, max_packet: int, vins: list[str],
                payload: bytes) -> int:
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from fanout.client import FanoutClient, FanoutDeadLettered, OutboxLocked, SubmissionInvalid

    err = Console(stderr=True)
    kwargs: dict[str, Any] = dict(host=host, port=port, username=args.username, password=args.password,
                                  client_id=args.client_id, durability=args.durability, max_batch=max_batch,
                                  max_packet_bytes=max_packet)
    if args.outbox_dir:
        kwargs["outbox_dir"] = args.outbox_dir
    try:
        client = FanoutClient(**kwargs)
        await client.start()
    except OutboxLocked as exc:
        err.print(f"fanout send: {exc}")
        return 2
    try:
        try:
            handle = await client.submit(vins, payload, request_id=args.request_id, data_id=args.data_id)
        except SubmissionInvalid as exc:
            err.print(f"fanout send: invalid {exc}")
            return 2
        triggers = len(handle._sub.triggers(max_batch, client._max_trigger_bytes)) if handle._sub is not None else -(-len(vins) // max_batch)
        waiter = asyncio.ensure_future(handle.acked(args.timeout))
        with Progress(TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(), TextColumn("{task.fields[state]}"),
                      TimeElapsedColumn(), console=err, disable=args.quiet, transient=False) as bar:
            task = bar.add_task(f"{handle.request_id}", total=triggers + 1, state=handle.mode)
            while not waiter.done():
                done, total = handle.progress()
                st = client.status()
                state = "connected" if st.connected else f"waiting for mqtt://{host}:{port} (outbox {st.outbox_depth})"
                bar.update(task, completed=done, total=max(total, 1) if total else triggers + 1, state=state)
                await asyncio.wait({waiter}, timeout=0.1)
            done, total = handle.progress()
            bar.update(task, completed=total or done, total=total or triggers + 1, state="")
        try:
            waiter.result()
        except FanoutDeadLettered as exc:
            err.print(f"fanout send: {exc}")
            err.print(f"  kept as a dead letter in {client.outbox_dir}; `fanout outbox replay --seq {exc.seq}` sends it again")
            return 1
        except asyncio.TimeoutError:
            st = client.status()
            err.print(f"fanout send: not acknowledged within {args.timeout:g}s ({st.last_error or 'no error'}); "
                      f"it stays in the outbox {client.outbox_dir} and is sent by the next client that opens it")
            return 3
        print(f"sent {handle.request_id}: {len(vins)} VINs in {triggers} trigger(s), data_id {handle.data_id}, {len(payload)} bytes")
        if not await client.drain(min(args.timeout, 30.0)):
            err.print(f"fanout send: {client.status().outbox_depth} older submission(s) still in the outbox {client.outbox_dir}")
        return 0
    finally:
        await client.close()
