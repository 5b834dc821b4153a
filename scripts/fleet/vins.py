"""VIN lists for the mock fleet and the mock platform: one generator, so both name the same vehicles.

``make_vins("SIM", 3)`` gives ``SIM000000001``, ``SIM000000002``, ``SIM000000003``: the prefix and a
zero-padded 1-based index (``digits`` wide). Such ids match the default vehicle id rule
(``[A-Za-z0-9_-]{1,64}``); they are not ISO 3779 VINs (``fanout.trigger`` with ``strict_vin``
refuses them). A VIN file holds one VIN per line; blank lines and ``#`` comments are skipped.
"""
from __future__ import annotations

import re
from pathlib import Path

VIN_RE = re.compile(r"[A-Za-z0-9_-]{1,64}")


def make_vins(prefix: str = "SIM", count: int = 10, *, start: int = 1, digits: int = 9) -> list[str]:
    """Generate ``count`` VINs ``<prefix><index zero-padded to digits>`` from ``start``.

    Args:
        prefix: leading letters (``[A-Za-z0-9_-]``).
        count: how many.
        start: first index.
        digits: width of the zero-padded index.

    Returns:
        The VINs in index order.

    Raises:
        ValueError: a negative count, an index wider than ``digits``, or a VIN the broker would refuse.
    """
    if count < 0 or start < 0:
        raise ValueError(f"count and start must be >= 0, got {count} and {start}")
    if count and len(str(start + count - 1)) > digits:
        raise ValueError(f"index {start + count - 1} does not fit in {digits} digits")
    vins = [f"{prefix}{i:0{digits}d}" for i in range(start, start + count)]
    if vins and not (VIN_RE.fullmatch(vins[0]) and VIN_RE.fullmatch(vins[-1])):
        raise ValueError(f"{vins[0]!r} is not a valid vehicle id ([A-Za-z0-9_-]{{1,64}})")
    return vins


def read_vins(path: str | Path) -> list[str]:
    """Read a VIN file (one per line, ``#`` comments and blank lines skipped, duplicates refused).

    Args:
        path: the file.

    Returns:
        The VINs in file order.

    Raises:
        OSError: the file cannot be read.
        ValueError: a line is not a valid vehicle id or repeats one (names the line).
    """
    vins: list[str] = []
    seen: set[str] = set()
    for number, line in enumerate(Path(path).read_text().splitlines(), 1):
        vin = line.split("#", 1)[0].strip()
        if not vin:
            continue
        if not VIN_RE.fullmatch(vin):
            raise ValueError(f"{path}:{number}: {vin!r} is not a valid vehicle id ([A-Za-z0-9_-]{{1,64}})")
        if vin in seen:
            raise ValueError(f"{path}:{number}: {vin!r} is listed twice")
        seen.add(vin)
        vins.append(vin)
    return vins


def add_vin_arguments(parser) -> None:  # argparse.ArgumentParser; untyped to keep argparse out of imports
    """Add ``--vin-prefix``, ``--count``, ``--vin-start``, ``--vin-digits`` and ``--vins FILE``."""
    g = parser.add_argument_group("vehicles")
    g.add_argument("--vin-prefix", default="SIM", help="generated VINs: prefix (default SIM)")
    g.add_argument("--count", type=int, default=10, help="generated VINs: how many (default 10)")
    g.add_argument("--vin-start", type=int, default=1, help="generated VINs: first index (default 1)")
    g.add_argument("--vin-digits", type=int, default=9, help="generated VINs: index width (default 9)")
    g.add_argument("--vins", metavar="FILE", default=None, help="read VINs from FILE instead (one per line)")


def vins_from_args(args) -> list[str]:
    """The VINs an ``argparse`` namespace from :func:`add_vin_arguments` names."""
    if args.vins:
        return read_vins(args.vins)
    return make_vins(args.vin_prefix, args.count, start=args.vin_start, digits=args.vin_digits)
