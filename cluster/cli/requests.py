"""``fanout requests list|show ID|cancel ID``: the request lifecycle of a running cluster.

Each subcommand calls the running cluster's Controller (as ``fanout status`` does, see
:mod:`cluster.cli.status`), which asks every shard and sums its counters (:mod:`actors.requests`):

- ``list [--limit N] [--json]``: one line per request (by request id): VINs, delivered, pending, in flight,
  expired, discarded, cancelled, state;
- ``show ID [--json]``: one request, with its first and last delivery time and its expiry;
- ``cancel ID [--json]``: nothing more of the request is delivered, its pending rows are removed (a message
  in flight may still arrive; its PUBACK is recorded); prints the status after the cancel.

Exit 1 with a message when no cluster is found, 2 when the request is unknown.
"""
from __future__ import annotations

import argparse
import datetime as dt
import json
import sys
from typing import Any

from cluster.cli.status import _call, _common

COLUMNS = ("vins", "delivered", "pending", "inflight", "expired", "discarded", "cancelled")
UNKNOWN_EXIT = 2


def register(sub: Any) -> None:
    p = sub.add_parser("requests", help="list, show or cancel requests of the running cluster")
    verbs = p.add_subparsers(dest="verb", required=True, metavar="list|show|cancel")
    ls = verbs.add_parser("list", help="every request known to the cluster (by request id)")
    ls.add_argument("--limit", type=int, default=100, help="at most this many requests (default 100)")
    show = verbs.add_parser("show", help="one request's counters and times")
    cancel = verbs.add_parser("cancel", help="stop delivering a request; its pending rows are removed")
    for q in (show, cancel):
        q.add_argument("request_id", metavar="ID")
    for q in (ls, show, cancel):
        q.add_argument("--json", action="store_true", help="print JSON")
        _common(q)
    ls.set_defaults(func=_list)
    show.set_defaults(func=_show)
    cancel.set_defaults(func=_cancel)


def _time(ms: int | None) -> str:
    if ms is None:
        return "-"
    return dt.datetime.fromtimestamp(ms / 1000, dt.timezone.utc).isoformat(timespec="milliseconds")


def table(rows: list[dict[str, Any]]) -> str:
    """One line per request: id, the counters of :data:`COLUMNS`, state."""
    width = max([len("request_id"), *(len(r["request_id"]) for r in rows)])
    out = [f"{'request_id':<{width}}  " + "  ".join(f"{c:>9}" for c in COLUMNS) + "  state"]
    for r in rows:
        out.append(f"{r['request_id']:<{width}}  " + "  ".join(f"{r[c]:>9}" for c in COLUMNS) + f"  {r['state']}")
    return "\n".join(out)


def detail(r: dict[str, Any]) -> str:
    """One request, a field per line."""
    lines = [f"request_id       {r['request_id']}", f"state            {r['state']}"]
    lines += [f"{c:<16} {r[c]}" for c in COLUMNS]
    lines += [f"first_delivery   {_time(r['first_delivery_ms'])}", f"last_delivery    {_time(r['last_delivery_ms'])}",
              f"expires          {_time(r['expires_ms'])}"]
    return "\n".join(lines)


def _render(args: argparse.Namespace, text: Any) -> Any:
    return (lambda result: json.dumps(result, indent=2, default=str)) if args.json else text


class _Unknown(Exception):
    """The cluster answered None: no such request."""


def _one(args: argparse.Namespace, method: str) -> int:
    def render(result: Any) -> str:
        if result is None:
            raise _Unknown
        return _render(args, detail)(result)

    try:
        return _call(args, method, args.request_id, render=render)
    except _Unknown:
        print(f"fanout: no request {args.request_id!r} is known to the cluster", file=sys.stderr)
        return UNKNOWN_EXIT


def _list(args: argparse.Namespace) -> int:
    return _call(args, "list_requests", args.limit, render=_render(args, table))


def _show(args: argparse.Namespace) -> int:
    return _one(args, "request_status")


def _cancel(args: argparse.Namespace) -> int:
    return _one(args, "cancel_request")
