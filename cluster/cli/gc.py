"""``fanout gc``: one GC cycle (export, Spark plan, guarded apply) now, offline or through the running cluster.

- Offline (the default): :func:`fanout.cli.jobs.run_offline_gc` opens the ``shard-<k>`` stores of the data
  dir itself, so the cluster must be stopped (a running dispatcher is the shard's only writer); the data
  dir lock makes it refuse, naming ``--live``, while ``fanout up`` serves that directory.
- ``--live`` (or ``--address``) asks the running cluster's Controller instead, which ships the plan to each
  shard's primary so GC replicates like any write.
"""
from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from fanout.cli.jobs import add_data_dir_arguments, load_job_config, print_summary, run_offline_gc


def register(sub: Any) -> None:
    g = sub.add_parser("gc", help="run a GC cycle now: export, Spark plan, guarded apply")
    add_data_dir_arguments(g)
    g.add_argument("--now", action="store_true", help="run at once (offline GC always does)")
    g.add_argument("--dry-run", action="store_true", help="export and plan only; delete nothing")
    g.add_argument("--live", action="store_true", help="run through the running cluster's Controller")
    g.add_argument("--address", default=None, help="Ray address of the running cluster (implies --live)")
    g.add_argument("--now-ms", type=int, default=None, help="the cycle's 'now' in ms (default: the clock)")
    g.add_argument("--work-dir", default=None, help="snapshot and plan directory (default gc.export_dir)")
    g.add_argument("--json", action="store_true", help="print the summary as JSON")
    g.set_defaults(func=_gc)


def _gc(args: argparse.Namespace) -> int:
    from rich.console import Console

    cfg = load_job_config(args)
    console = Console()
    if args.live or args.address:
        return _gc_live(args, cfg, console)
    return run_offline_gc(args, cfg, console)


def _gc_live(args: argparse.Namespace, cfg: Any, console: Any) -> int:
    from cluster.runtime import call_controller

    try:
        with console.status("GC cycle running on the cluster (export, Spark plan, apply)...", spinner="dots"):
            result = call_controller(cfg.storage.data_dir, args.address, "run_gc", now=True)
    except RuntimeError as exc:
        print(f"fanout: gc: {exc}", file=sys.stderr)
        return 1
    if args.json or "stage_s" not in result:
        print(json.dumps(result, indent=2, sort_keys=True, default=str))
    else:
        print_summary(console, result)
    return 0 if "stage_s" in result else 1
