"""Mock platform: send R requests (a blob + a trigger naming every VIN) through the platform client.

Strategy: the real client (:class:`fanout.client.FanoutClient`) does the sending, so this script
exercises exactly what a platform would: blob on ``$SDV-FANOUT/data/<data_id>``, triggers on
``$SDV-FANOUT/trigger`` (split at ``--max-batch`` VINs), QoS 1, durable outbox. The VINs come from the
same generator as ``scripts.mock_vehicles`` (``--vin-prefix``/``--count``) or a file. Each request's payload
is ``--payload-size`` bytes: the 12-byte send-time header of ``scripts/fleet/payload.py`` (stamped just
before ``submit``) then random bytes, so the fleet measures end-to-end latency; ``--payload-file`` is
sent unchanged (the fleet then measures from the first delivery). Request ids are ``<request-id>``
for one request and ``<request-id>-000001``, ``-000002`` ... for several, so they sort in submission
order (the cluster breaks equal timestamps by request id) and ``scripts.mock_vehicles --expect-order``
without a file checks them; ``--order-file`` writes them for ``--expect-order FILE``.

Requests are submitted one after another without waiting (the client keeps them in order and
pipelines the PUBLISHes; ``--sequential`` waits for each acknowledgement first). The outbox is a
fresh temporary directory unless ``--outbox-dir`` is given; it is removed when everything was
acknowledged and kept (path printed) otherwise.

Summary (stdout JSON): submissions, acked, rejected, dead_lettered, timed_out, errors (messages),
vins, payload_bytes, seconds, submit_seconds, requests_per_s, request_ids (first 20), outbox_dir.
Exit status: 0 all acknowledged, 1 a rejection, dead letter, timeout or other error, 2 bad arguments.

Examples::

    python -m scripts.mock_platform --username platform --password platform --count 1000
    python -m scripts.mock_platform --port 1883 --vin-prefix SIM --count 100000 --requests 10 \\
        --payload-size 4096 --request-id bench --order-file order.txt
    python -m scripts.mock_platform --vins vins.txt --payload-file firmware.bin --request-id ota-42
"""
from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

from scripts.fleet.payload import HEADER_SIZE, stamp
from scripts.fleet.vins import add_vin_arguments, vins_from_args

MAX_LISTED_IDS = 20


def build_parser() -> argparse.ArgumentParser:
    """The command-line parser."""
    p = argparse.ArgumentParser(prog="python -m scripts.mock_platform", description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter,
                                epilog="\n\n".join(__doc__.split("\n\n")[1:]))
    p.add_argument("--host", default="127.0.0.1", help="cluster MQTT host (default 127.0.0.1)")
    p.add_argument("--port", type=int, default=1883, help="cluster MQTT port (default 1883)")
    p.add_argument("--username", default=os.environ.get("FANOUT_USERNAME"),
                   help="platform login (env FANOUT_USERNAME; the loopback dev login is platform/platform)")
    p.add_argument("--password", default=os.environ.get("FANOUT_PASSWORD"), help="password (env FANOUT_PASSWORD)")
    add_vin_arguments(p)
    pay = p.add_mutually_exclusive_group()
    pay.add_argument("--payload-size", type=int, default=256, help=f"bytes per blob, >= {HEADER_SIZE} (default 256)")
    pay.add_argument("--payload-file", default=None, help="send this file as the blob, unchanged")
    p.add_argument("--request-id", default=None, help="request id, or the prefix of the ids of --requests (default random)")
    p.add_argument("--requests", type=int, default=1, help="requests to send, each to every VIN (default 1)")
    p.add_argument("--sequential", action="store_true", help="wait for each acknowledgement before the next submit")
    p.add_argument("--data-id", default=None, help="data id of a --payload-file blob (default SHA-1 of the payload)")
    p.add_argument("--max-batch", type=int, default=1_000_000, help="most VINs per trigger (the cluster's fanout.max_batch)")
    p.add_argument("--outbox-dir", default=None, help="client outbox (default a temporary directory)")
    p.add_argument("--durability", choices=("hybrid", "always"), default="hybrid")
    p.add_argument("--timeout", type=float, default=120.0, help="seconds for every acknowledgement (default 120)")
    p.add_argument("--order-file", default=None, help="write the request ids, in submission order, to this file")
    p.add_argument("--quiet", action="store_true", help="no progress display")
    return p


def request_ids(base: str | None, count: int) -> list[str]:
    """``[base]`` for one request, ``base-000001`` ... for several (a random base when None)."""
    base = base or f"mp-{uuid.uuid4().hex[:10]}"
    if count == 1:
        return [base]
    return [f"{base}-{i:06d}" for i in range(1, count + 1)]


async def send(args: argparse.Namespace, vins: list[str], rids: list[str], body: bytes | None, blob: bytes | None,
               outbox_dir: str) -> dict[str, Any]:
    """Submit every request, wait (bounded) for the acknowledgements, return the summary.

    Args:
        args: parsed arguments.
        vins: the VINs of every request.
        rids: the request ids, in submission order.
        body: random bytes after the send-time header (generated payloads), or None.
        blob: the ``--payload-file`` content, or None.
        outbox_dir: the client's outbox directory.

    Returns:
        The summary dict (see the module docstring).
    """
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from fanout.client import FanoutClient, FanoutClosed, FanoutDeadLettered, FanoutError, FanoutRejected

    err = Console(stderr=True)
    result: dict[str, Any] = {"submissions": 0, "acked": 0, "rejected": 0, "dead_lettered": 0, "timed_out": 0,
                              "errors": [], "vins": len(vins), "payload_bytes": len(blob) if blob is not None else len(body or b"") + HEADER_SIZE}
    client = FanoutClient(args.host, args.port, args.username, args.password, outbox_dir=outbox_dir,
                          durability=args.durability, max_batch=args.max_batch)
    await client.start()
    t0 = time.monotonic()
    deadline = t0 + args.timeout
    handles = []
    waiters: list[asyncio.Future[None]] = []
    try:
        with Progress(TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(),
                      TextColumn("{task.fields[state]}"), TimeElapsedColumn(), console=err, disable=args.quiet) as bar:
            task = bar.add_task("acknowledged", total=len(rids), state="")

            def refresh() -> None:
                st = client.status()
                state = (f"{st.mode}, in flight {st.in_flight}, outbox {st.outbox_depth}" if st.connected
                         else f"waiting for mqtt://{args.host}:{args.port} ({st.last_error or 'connecting'})")
                bar.update(task, completed=sum(w.done() for w in waiters), state=state)

            for rid in rids:
                payload = blob if blob is not None else stamp(body or b"")
                try:
                    handle = await client.submit(vins, payload, request_id=rid, data_id=args.data_id)
                except FanoutError as exc:  # SubmissionInvalid and friends: nothing was stored
                    result["errors"].append(f"{rid}: {exc}")
                    break
                result["submissions"] += 1
                handles.append(handle)
                waiters.append(asyncio.ensure_future(handle.acked(max(0.001, deadline - time.monotonic()))))
                if args.sequential:
                    await asyncio.wait({waiters[-1]})
                refresh()
            result["submit_seconds"] = round(time.monotonic() - t0, 3)
            while waiters and not all(w.done() for w in waiters):
                await asyncio.wait(waiters, timeout=0.2, return_when=asyncio.FIRST_COMPLETED)
                refresh()
            refresh()
        for handle, waiter in zip(handles, waiters):
            exc = waiter.exception()
            if exc is None:
                result["acked"] += 1
            elif isinstance(exc, FanoutRejected):
                result["rejected"] += 1
                result["errors"].append(f"{handle.request_id}: rejected: {exc}")
            elif isinstance(exc, FanoutDeadLettered):
                result["dead_lettered"] += 1
                result["errors"].append(f"{handle.request_id}: {exc}")
            elif isinstance(exc, asyncio.TimeoutError):
                result["timed_out"] += 1
            elif isinstance(exc, FanoutClosed):
                result["errors"].append(f"{handle.request_id}: {exc}")
            else:
                result["errors"].append(f"{handle.request_id}: {type(exc).__name__}: {exc}")
        if result["timed_out"]:
            result["errors"].append(f"{result['timed_out']} request(s) not acknowledged within {args.timeout:g} s "
                                    f"({client.status().last_error or 'no error reported'})")
    finally:
        for w in waiters:
            w.cancel()
        await client.close()
    seconds = time.monotonic() - t0
    result["seconds"] = round(seconds, 3)
    result["requests_per_s"] = round(result["acked"] / seconds, 2) if seconds > 0 else None
    result["request_ids"] = rids[:MAX_LISTED_IDS]
    return result


def main(argv: list[str] | None = None) -> int:
    """Send the batch; print the JSON summary on stdout.

    Returns:
        0 when every request was acknowledged, 1 on any error, 2 on bad arguments.
    """
    args = build_parser().parse_args(argv)
    from fanout.log import configure

    configure(level=os.environ.get("FANOUT_LOG_LEVEL", "warning"))
    try:
        vins = vins_from_args(args)
        blob = Path(args.payload_file).read_bytes() if args.payload_file else None
        if not vins:
            raise ValueError("no VINs")
        if args.requests < 1:
            raise ValueError("--requests must be >= 1")
        if blob is None and args.payload_size < HEADER_SIZE:
            raise ValueError(f"--payload-size must be >= {HEADER_SIZE} (the send-time header)")
        if args.data_id is not None and (blob is None or args.requests > 1):
            raise ValueError("--data-id only with --payload-file and one request (generated payloads differ)")
    except (OSError, ValueError) as exc:
        print(f"mock_platform: {exc}", file=sys.stderr)
        return 2
    rids = request_ids(args.request_id, args.requests)
    if args.order_file:
        Path(args.order_file).write_text("".join(f"{rid}\n" for rid in rids))
    body = None if blob is not None else os.urandom(args.payload_size - HEADER_SIZE)
    own_outbox = args.outbox_dir is None
    outbox_dir = args.outbox_dir or tempfile.mkdtemp(prefix="mock-platform-outbox-")
    try:
        result = asyncio.run(send(args, vins, rids, body, blob, outbox_dir))
    except KeyboardInterrupt:
        print(f"mock_platform: interrupted; unacknowledged submissions stay in {outbox_dir}", file=sys.stderr)
        return 1
    ok = not result["errors"] and result["acked"] == len(rids)
    if own_outbox and ok:
        shutil.rmtree(outbox_dir, ignore_errors=True)
        result["outbox_dir"] = None
    else:
        result["outbox_dir"] = outbox_dir
    print(json.dumps(result, indent=2), flush=True)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
