"""``fanout outbox status|dead-letters|replay``: inspect and repair a platform client's outbox.

``status`` and ``dead-letters`` only read (LMDB readers never block the client using the outbox).
``replay`` moves dead letters back into the outbox with their attempts reset; it needs the outbox's
one-client lock, so it refuses while a client runs on it (that client can call
``replay_dead_letters()`` itself). Replayed items are sent by the next client that opens the outbox.
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any


def register(sub: Any) -> None:
    p = sub.add_parser("outbox", help="inspect a platform client's durable outbox and dead letters")
    osub = p.add_subparsers(dest="outbox_command", metavar="ACTION")
    osub.required = True
    for name, func, help_text in (
        ("status", _status, "depth, retrying items, dead letters, oldest item"),
        ("dead-letters", _dead_letters, "list dead letters with their last error"),
        ("replay", _replay, "move dead letters back into the outbox (attempts reset)"),
    ):
        q = osub.add_parser(name, help=help_text)
        q.add_argument("--outbox-dir", default=None, help="outbox directory (default ~/.local/state/sdv-fanout/outbox)")
        q.set_defaults(func=func)
        if name != "replay":
            q.add_argument("--json", action="store_true", help="print JSON")
        if name == "dead-letters":
            q.add_argument("--limit", type=int, default=None, help="most listed")
        if name == "replay":
            q.add_argument("--seq", type=int, action="append", help="only this dead letter (repeatable; default all)")


def _open(args: argparse.Namespace, exclusive: bool) -> Any:
    from fanout.client.outbox import DEFAULT_OUTBOX_DIR, Outbox

    path = Path(args.outbox_dir) if args.outbox_dir else DEFAULT_OUTBOX_DIR
    if not (path / "data.mdb").exists():
        print(f"fanout outbox: no outbox at {path}", file=sys.stderr)
        return None
    return Outbox(path, exclusive=exclusive)


def _age(ts_ms: int | None) -> str:
    if ts_ms is None:
        return "-"
    return f"{max(0.0, time.time() - ts_ms / 1000):.1f}s"


def _status(args: argparse.Namespace) -> int:
    ob = _open(args, exclusive=False)
    if ob is None:
        return 1
    try:
        st = ob.status()
    finally:
        ob.close()
    if args.json:
        print(json.dumps(asdict(st)))
        return 0
    print(f"outbox        {st.path}")
    print(f"depth         {st.depth}")
    print(f"retrying      {st.retrying}")
    print(f"dead letters  {st.dead_letters}")
    print(f"oldest item   {_age(st.oldest_ts_ms)}")
    return 0


def _dead_letters(args: argparse.Namespace) -> int:
    ob = _open(args, exclusive=False)
    if ob is None:
        return 1
    try:
        letters = ob.dead_letters(args.limit)
    finally:
        ob.close()
    if args.json:
        print(json.dumps([asdict(d) for d in letters]))
        return 0
    if not letters:
        print("no dead letters")
        return 0
    from rich.console import Console
    from rich.table import Table

    table = Table("seq", "request_id", "data_id", "vins", "bytes", "attempts", "dead for", "last error")
    for d in letters:
        table.add_row(str(d.seq), d.request_id, d.data_id[:12], str(d.vins), str(d.payload_bytes), str(d.attempts),
                      _age(d.dead_at_ms), d.last_error)
    Console().print(table)
    return 0


def _replay(args: argparse.Namespace) -> int:
    from fanout.client.errors import OutboxLocked

    try:
        ob = _open(args, exclusive=True)
    except OutboxLocked as exc:
        print(f"fanout outbox: {exc}; stop it or call replay_dead_letters() in that client", file=sys.stderr)
        return 1
    if ob is None:
        return 1
    try:
        moved = ob.replay_dead_letters(args.seq)
    finally:
        ob.close()
    print(f"replayed {len(moved)} dead letter(s){': seq ' + ', '.join(map(str, moved)) if moved else ''}; "
          "the next client that opens this outbox sends them")
    return 0
