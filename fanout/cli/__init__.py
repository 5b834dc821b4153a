"""The ``fanout`` command: one module per command group, each exposing ``register(subparsers)``.

A command module adds its sub-parser and sets ``func`` (``args -> int`` exit code). Keeping commands in
separate modules keeps start-up cheap (heavy imports such as Ray or PySpark happen inside ``func``) and
lets each concern own its file.
"""
from __future__ import annotations

import argparse
import importlib
import sys
from typing import Sequence

# Each entry is a module in this package with register(subparsers).
COMMAND_MODULES: tuple[str, ...] = (
    "config_cmd",
    "passwd",
    "broker",
    "send",
    "outbox",
    "up",
    "status",
    "gc_cmd",
)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="fanout", description="sdv-fanout: MQTT fanout cluster for software-defined vehicles")
    parser.add_argument("--log-json", action="store_true", default=None, help="JSON log lines (default when stderr is not a TTY)")
    parser.add_argument("--log-level", default=None, help="debug, info, warning or error")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True
    for name in COMMAND_MODULES:
        importlib.import_module(f"{__name__}.{name}").register(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    from fanout import log
    from fanout.config import ConfigError

    parser = build_parser()
    args = parser.parse_args(argv)
    log.configure(json=args.log_json, level=args.log_level)
    try:
        return int(args.func(args) or 0)
    except ConfigError as exc:
        print(f"fanout: config error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
