"""The Ray-free commands of ``fanout`` and the parser machinery the whole command line is built with.

The ``fanout`` console script is :func:`cluster.cli.main`: it adds the commands that talk to Ray (``up``,
``status``, ``inspect``, ``gc``) to the ones listed here, which need no Ray and so live in the core
(``fanout/`` never imports ``ray``, ``cluster`` or ``actors``).

A command module adds its sub-parser in ``register(subparsers)`` and sets ``func`` (``args -> int`` exit
code). Keeping commands in separate modules keeps start-up cheap (heavy imports such as PySpark happen
inside ``func``) and lets each concern own its file.
"""
from __future__ import annotations

import argparse
import importlib
import sys
from typing import Sequence

# Modules with register(subparsers), in the order their commands appear in ``fanout --help``.
CORE_COMMANDS: tuple[str, ...] = (
    "fanout.cli.config_cmd",
    "fanout.cli.passwd",
    "fanout.cli.broker",
    "fanout.cli.send",
    "fanout.cli.outbox",
)
JOB_COMMANDS: tuple[str, ...] = ("fanout.cli.jobs",)
"""``export`` and ``report`` (``gc`` itself is registered by ``cluster.cli.gc``: it may ask the cluster)."""


def build_parser(command_modules: Sequence[str]) -> argparse.ArgumentParser:
    """The ``fanout`` parser with the global options and the commands of ``command_modules``."""
    parser = argparse.ArgumentParser(prog="fanout", description="sdv-fanout: MQTT fanout cluster for software-defined vehicles")
    parser.add_argument("--log-json", action="store_true", default=None, help="JSON log lines (default when stderr is not a TTY)")
    parser.add_argument("--log-level", default=None, help="debug, info, warning or error")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True
    for name in command_modules:
        importlib.import_module(name).register(sub)
    return parser


def run(parser: argparse.ArgumentParser, argv: Sequence[str] | None = None) -> int:
    """Parse ``argv``, configure logging, run the command; returns its exit code (2 for a config error)."""
    from fanout import log
    from fanout.config import ConfigError

    args = parser.parse_args(argv)
    log.configure(json=args.log_json, level=args.log_level)
    try:
        return int(args.func(args) or 0)
    except ConfigError as exc:
        print(f"fanout: config error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130
