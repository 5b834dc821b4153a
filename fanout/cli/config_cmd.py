"""``fanout config show``: print the effective configuration (file + env + defaults) as TOML-like text."""
from __future__ import annotations

import argparse
import json
from typing import Any


def register(sub: Any) -> None:
    p = sub.add_parser("config", help="show the effective configuration")
    csub = p.add_subparsers(dest="config_command", metavar="ACTION")
    csub.required = True
    show = csub.add_parser("show", help="print the effective configuration")
    show.add_argument("--config", default=None, help="TOML config file")
    show.add_argument("--json", action="store_true", help="print JSON instead of TOML")
    show.set_defaults(func=_show)


def _show(args: argparse.Namespace) -> int:
    from fanout.config import load_config

    cfg = load_config(args.config)
    data = cfg.to_toml_dict()
    if args.json:
        print(json.dumps(data, indent=2))
        return 0
    print(render_toml(data))
    return 0


def render_toml(data: dict[str, Any]) -> str:
    """Render the effective config as TOML (scalars, tables of tables, arrays of tables)."""
    lines: list[str] = []
    for section, values in data.items():
        if section == "users":
            for name, spec in values.items():
                lines.append(f"[users.{name}]")
                lines.extend(f"{k} = {_scalar(v)}" for k, v in spec.items())
                lines.append("")
        elif section in ("acl", "topics"):
            for rule in values:
                lines.append(f"[[{section}]]")
                lines.extend(f"{k} = {_scalar(v)}" for k, v in rule.items())
                lines.append("")
        else:
            lines.append(f"[{section}]")
            lines.extend(f"{k} = {_scalar(v)}" for k, v in values.items())
            lines.append("")
    return "\n".join(lines).rstrip() + "\n"


def _scalar(v: Any) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, (int, float)):
        return str(v)
    return json.dumps(str(v))
