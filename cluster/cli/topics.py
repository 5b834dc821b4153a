"""``fanout topics create|list|show``: the durable topics of a running cluster.

- ``create NAME --filter F [--partitions N] [--retention 7d] [--retention-bytes 1GiB]``: the topic is created in
  every shard's store (replicated) and every connection node starts appending the publishes matching ``F``
  (checked here first, as the ``[[topics]]`` config tables are; running it again with the same partition count is
  harmless and updates the retention);
- ``list [--json]``: one line per topic: filter, partitions, messages appended, retained, groups with their lag;
- ``show NAME [--json]``: partitions with their first retained and next offset, groups with committed offset and
  lag per partition.

Exit 1 with a message when no cluster is found, 2 for an unknown topic or an invalid one.
"""
from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from cluster.cli.status import _call, _common

UNKNOWN_EXIT = 2


def register(sub: Any) -> None:
    p = sub.add_parser("topics", help="create, list or show the durable topics of the running cluster")
    verbs = p.add_subparsers(dest="verb", required=True, metavar="create|list|show")
    create = verbs.add_parser("create", help="create a durable topic: publishes matching its filter are kept")
    create.add_argument("name", metavar="NAME")
    create.add_argument("--filter", required=True, help="MQTT topic filter, e.g. ecp/+/response")
    create.add_argument("--partitions", type=int, default=0, help="partitions (default 0: one per store shard)")
    create.add_argument("--retention", default="7d", help="keep messages this long (default 7d)")
    create.add_argument("--retention-bytes", default="1GiB", help="keep at most this much per partition (default 1GiB)")
    ls = verbs.add_parser("list", help="every durable topic with its groups' lag")
    show = verbs.add_parser("show", help="one topic's partitions and groups")
    show.add_argument("name", metavar="NAME")
    for q in (create, ls, show):
        q.add_argument("--json", action="store_true", help="print JSON")
        _common(q)
    create.set_defaults(func=_create)
    ls.set_defaults(func=_list)
    show.set_defaults(func=_show)


def table(topics: list[dict[str, Any]]) -> str:
    """One line per topic: name, filter, partitions, high, retained, groups (name:lag)."""
    out = [f"{'topic':<20} {'filter':<28} {'parts':>5} {'high':>10} {'retained':>10}  groups (lag)"]
    for t in topics:
        groups = ", ".join(f"{g['group']}:{g['lag']}" for g in t["groups"]) or "-"
        out.append(f"{t['name']:<20} {t['filter']:<28} {len(t['partitions']):>5} {t['high']:>10} {t['retained']:>10}"
                   f"  {groups}")
    return "\n".join(out)


def detail(t: dict[str, Any]) -> str:
    """One topic: its spec, then a line per partition, then per group and partition."""
    lines = [f"topic       {t['name']}", f"filter      {t['filter']}",
             f"retention   {t['retention_ms']} ms, {t['retention_bytes']} bytes per partition",
             f"high        {t['high']}", f"retained    {t['retained']}", "", "partition       low      next"]
    lines += [f"{p['partition']:>9} {p['low']:>9} {p['next']:>9}" for p in t["partitions"]]
    for g in t["groups"]:
        lines += ["", f"group {g['group']}: lag {g['lag']}", "partition committed       lag"]
        lines += [f"{x['partition']:>9} {'-' if x['committed'] is None else x['committed']:>9} {x['lag']:>9}"
                  for x in g["partitions"]]
    return "\n".join(lines)


def _render(args: argparse.Namespace, text: Any) -> Any:
    return (lambda result: json.dumps(result, indent=2, default=str)) if args.json else text


class _Unknown(Exception):
    """The cluster answered None: no such topic."""


def _create(args: argparse.Namespace) -> int:
    from fanout.topics.settings import make_spec

    make_spec(args.name, args.filter, args.partitions, args.retention, args.retention_bytes)  # ConfigError: exit 2
    return _call(args, "create_topic", args.name, args.filter, args.partitions, args.retention, args.retention_bytes,
                 render=_render(args, detail))


def _list(args: argparse.Namespace) -> int:
    return _call(args, "list_topics", render=_render(args, table))


def _show(args: argparse.Namespace) -> int:
    def render(result: Any) -> str:
        if result is None:
            raise _Unknown
        return _render(args, detail)(result)

    try:
        return _call(args, "show_topic", args.name, render=render)
    except _Unknown:
        print(f"fanout: no durable topic {args.name!r}", file=sys.stderr)
        return UNKNOWN_EXIT
