"""The ``fanout`` command line (console script ``fanout = "cluster.cli:main"``, or ``python -m cluster.cli``).

It sits on the top floor because some commands talk to Ray: ``up`` (start or join Ray, run the cluster),
``status``/``inspect``, ``requests`` and ``gc --live`` (call the running cluster's controller through
:func:`cluster.runtime.call_controller`). The Ray-free commands (``config``, ``passwd``, ``broker``, ``send``,
``outbox``, ``export``, ``report``) come from :mod:`fanout.cli`, which builds the parser. Every command
imports what it needs (Ray, PySpark) inside its ``func``, so ``fanout --help`` stays quick.
"""
from __future__ import annotations

import argparse
from typing import Sequence

from fanout import cli as core_cli

COMMAND_MODULES: tuple[str, ...] = (
    *core_cli.CORE_COMMANDS,
    "cluster.cli.up",
    "cluster.cli.status",
    "cluster.cli.gc",
    "cluster.cli.requests",
    "cluster.cli.topics",
    "cluster.cli.consume",
    *core_cli.JOB_COMMANDS,
)


def build_parser() -> argparse.ArgumentParser:
    """The full ``fanout`` parser."""
    return core_cli.build_parser(COMMAND_MODULES)


def main(argv: Sequence[str] | None = None) -> int:
    """Run ``fanout`` with ``argv`` (default ``sys.argv[1:]``); returns the exit code."""
    return core_cli.run(build_parser(), argv)


__all__ = ["COMMAND_MODULES", "build_parser", "main"]
