"""``fanout passwd [--iterations N] [USERNAME]``: hash a password for a ``[users.<name>]`` table.

Reads the password twice with getpass when stdin is a terminal, or one line from stdin otherwise (for
scripts: ``echo "$PW" | fanout passwd``). Prints the hash, or with USERNAME a ready-to-paste TOML table.
"""
from __future__ import annotations

import argparse
import getpass
import json
import re
import sys
from typing import Any

_BARE_KEY = re.compile(r"[A-Za-z0-9_-]+")


def register(sub: Any) -> None:
    from fanout.mqtt.auth import DEFAULT_ITERATIONS

    p = sub.add_parser("passwd", help="hash a password for a [users.<name>] config table")
    p.add_argument("--iterations", type=_positive_int, default=DEFAULT_ITERATIONS, help=f"PBKDF2 iterations (default {DEFAULT_ITERATIONS})")
    p.add_argument("username", nargs="?", metavar="USERNAME", help="print a [users.USERNAME] table instead of the bare hash")
    p.set_defaults(func=_passwd)


def _positive_int(text: str) -> int:
    try:
        n = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer, got {text!r}") from None
    if n < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {n}")
    return n


def _read_password() -> str | None:
    if sys.stdin.isatty():
        first = getpass.getpass("Password: ")
        if getpass.getpass("Repeat password: ") != first:
            print("fanout passwd: passwords do not match", file=sys.stderr)
            return None
        return first
    line = sys.stdin.readline()
    return line[:-1] if line.endswith("\n") else line


def _passwd(args: argparse.Namespace) -> int:
    from fanout.mqtt.auth import hash_password

    password = _read_password()
    if password is None:
        return 1
    password = password.removesuffix("\r")
    if not password:
        print("fanout passwd: empty password", file=sys.stderr)
        return 1
    if args.iterations < 100_000:
        print(f"fanout passwd: warning: {args.iterations} iterations is weak (default 600000)", file=sys.stderr)
    encoded = hash_password(password, iterations=args.iterations)
    if args.username is None:
        print(encoded)
        return 0
    key = args.username if _BARE_KEY.fullmatch(args.username) else json.dumps(args.username)
    print(f'[users.{key}]\npassword_hash = "{encoded}"\nrole = "client"')
    return 0
