"""``fanout status`` and ``fanout inspect vin|data|request ID``: query a running fanout cluster (JSON).

Both join the cluster's Ray instance and call the named ``fanout-controller`` actor. The Ray address is
``--address`` if given, else the one ``fanout up`` wrote to ``<data_dir>/ray_address`` (``--data-dir`` or
the config's ``storage.data_dir``), else ``auto`` (the most recent Ray cluster started on this machine).
Exit 1 with a message when no cluster is found.
"""
from __future__ import annotations

import argparse
import json
import sys
from typing import Any


def _common(p: argparse.ArgumentParser) -> None:
    p.add_argument("--config", default=None, help="TOML config file (for storage.data_dir)")
    p.add_argument("--data-dir", default=None, help="data dir of the cluster (holds ray_address)")
    p.add_argument("--address", default=None, help="Ray address (default: <data_dir>/ray_address, else auto)")


def register(sub: Any) -> None:
    p = sub.add_parser("status", help="print the cluster status as JSON (nodes, shards, totals, replication)")
    p.add_argument("--replication", action="store_true",
                   help="print only the per-shard replication table (primary, replicas, epoch, applied seq, lag)")
    _common(p)
    p.set_defaults(func=_status)
    q = sub.add_parser("inspect", help="show one VIN, data blob or request as JSON")
    q.add_argument("kind", choices=("vin", "data", "request"))
    q.add_argument("ident", metavar="ID")
    _common(q)
    q.set_defaults(func=_inspect)


def _call(args: argparse.Namespace, method: str, *call_args: Any, render: Any = None) -> int:
    from fanout.config import load_config

    from cluster.runtime import call_controller

    cfg = load_config(args.config, overrides={"storage": {"data_dir": args.data_dir}})
    try:
        result = call_controller(cfg.storage.data_dir, args.address, method, *call_args, timeout_s=60)
    except RuntimeError as exc:
        print(f"fanout: {exc}", file=sys.stderr)
        return 1
    print(render(result) if render is not None else json.dumps(result, indent=2, default=str))
    return 0


def replication_table(rows: list[dict[str, Any]]) -> str:
    """One line per shard: ``shard epoch applied_seq primary@node replicas(id@node seq lag in-sync)``."""
    out = ["shard  epoch  applied_seq  primary          replicas (id@node acked_seq lag, * = in the ack set)"]
    for r in rows:
        p = r["primary"]
        primary = f"{p.get('node') or '?'}{'' if p.get('alive') else ' (down)'}"
        reps = ", ".join(
            f"{x['id']}@{x.get('node') or '?'} {x.get('acked_seq')} lag={x.get('lag')}{'*' if x.get('in_sync') else ''}"
            for x in r["replicas"]) or "-"
        state = " failing over" if r.get("failing_over") else ""
        out.append(f"{r['shard']:<6} {r['epoch']:<6} {str(r.get('applied_seq', '?')):<12} {primary:<16} {reps}{state}")
    return "\n".join(out)


def _status(args: argparse.Namespace) -> int:
    if args.replication:
        return _call(args, "replication", render=replication_table)
    return _call(args, "status")


def _inspect(args: argparse.Namespace) -> int:
    return _call(args, "inspect", args.kind, args.ident)
