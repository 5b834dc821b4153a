"""Print the rows of docs/configuration.md's key tables that are missing there, from ``fanout.config.SCHEMA``.

    python -m scripts.config_docs            # rows to add, grouped by section
    python -m scripts.config_docs --check    # exit 1 naming each key the page lacks (the unit test does this too)
    python -m scripts.config_docs --write    # add the missing rows to their section's table (review the text)

The types and ranges are read from each key's parser (the closures ``_int``, ``_size``, ``_duration``, ``_str``
of fanout/config.py build), so a row says what start-up validation enforces.
"""
from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path
from typing import Any

from fanout.config import SCHEMA, Field
from fanout.units import format_duration_ms, format_size_bytes

PAGE = Path(__file__).resolve().parents[1] / "docs" / "configuration.md"


def _cells(field: Field) -> dict[str, Any]:
    fn = field.parse
    names = fn.__code__.co_freevars if hasattr(fn, "__code__") else ()
    return dict(zip(names, (c.cell_contents for c in (fn.__closure__ or ()))))


def describe(field: Field) -> tuple[str, str]:
    """(type, allowed) of a key, from its parser."""
    c = _cells(field)
    attr = field.attr
    if isinstance(field.default, bool):
        return "bool", ""
    if attr.endswith("_bytes"):
        lo, hi = c.get("lo", 0), c.get("hi")
        allowed = f">= {format_size_bytes(lo)}" + (f", <= {format_size_bytes(hi)}" if hi else "")
        return "size (bytes)", allowed
    if attr.endswith("_ms"):
        return "duration (ms)", f">= {format_duration_ms(c.get('lo_ms', 0))}"
    if isinstance(field.default, int):
        lo, hi = c.get("lo"), c.get("hi")
        if lo is not None and hi is not None:
            return "integer", f"{lo}-{hi}"
        return "integer", f">= {lo}" if lo is not None else ""
    choices = c.get("choices")
    if choices:
        return "string", ", ".join(choices)
    return "string", "non-empty" if c.get("nonempty", True) else "may be empty"


def _toml(v: Any) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    return str(v) if isinstance(v, int) else f'"{v}"'


def row(section: str, key: str, field: Field) -> str:
    typ, allowed = describe(field)
    return f"| `{section}.{key}` | `{_toml(field.default)}` | {typ} | {allowed} | `{field.attr}` | {field.doc} |"


def missing(text: str) -> list[tuple[str, str, Field]]:
    documented = set(re.findall(r"^\| `([a-z_]+\.[a-z_0-9]+)`", text, flags=re.M))
    return [(s, k, f) for s, keys in SCHEMA.items() for k, f in keys.items() if f"{s}.{k}" not in documented]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m scripts.config_docs", description=__doc__.split("\n")[0])
    parser.add_argument("--check", action="store_true", help="exit 1 when a key is missing from the page")
    parser.add_argument("--write", action="store_true", help="add the missing rows after their section's last row")
    args = parser.parse_args(argv)
    text = PAGE.read_text()
    gone = missing(text)
    if args.write:
        lines = text.split("\n")
        for s, k, f in gone:
            at = max((i for i, line in enumerate(lines) if line.startswith(f"| `{s}.")), default=None)
            if at is None:
                print(f"no table for [{s}] on the page: add its heading and table first", file=sys.stderr)
                return 1
            lines.insert(at + 1, row(s, k, f))
        PAGE.write_text("\n".join(lines))
        return 0
    if args.check:
        for s, k, _ in gone:
            print(f"docs/configuration.md lacks {s}.{k}", file=sys.stderr)
        return 1 if gone else 0
    section = None
    for s, k, f in gone:
        if s != section:
            print(f"\n### `[{s}]`")
            section = s
        print(row(s, k, f))
    return 0


if __name__ == "__main__":
    sys.exit(main())
