"""Which code a figure was measured with: this project (git commit, uncommitted files, a digest of the broker
sources as they are on disk) and the peers (Mosquitto, amqtt, the Python packages in the path).

Several engineers change the code while benchmarks run, so a result records the files that differed from
its commit (:func:`dirty_sources`) next to the commit itself.
"""
from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
from importlib import metadata
from pathlib import Path
from typing import Any, Iterable

from fanout import native

REPO = Path(__file__).resolve().parents[2]
# The code a benchmark exercises: what dirty_sources lists when it differs from the commit.
CODE_UNDER_TEST = ("fanout", "actors", "storage", "cluster", "scripts")


def dist_version(name: str) -> str | None:
    """Installed version of distribution ``name``, or None."""
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return None


def mosquitto_binary() -> str | None:
    """Path of the ``mosquitto`` executable (Debian installs it in /usr/sbin), or None."""
    found = shutil.which("mosquitto")
    if found:
        return found
    return "/usr/sbin/mosquitto" if os.access("/usr/sbin/mosquitto", os.X_OK) else None


def mosquitto_version() -> str | None:
    """First line of ``mosquitto -h`` (e.g. ``mosquitto version 2.0.11``), or None if not installed."""
    binary = mosquitto_binary()
    if binary is None:
        return None
    out = subprocess.run([binary, "-h"], capture_output=True, text=True, timeout=10)
    lines = (out.stdout or out.stderr).strip().splitlines()
    return lines[0].strip() if lines else None


def git(*args: str) -> str | None:
    """``git <args>`` in the repository: its stdout as printed, or None when git fails or is missing."""
    try:
        out = subprocess.run(["git", *args], cwd=REPO, capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return out.stdout if out.returncode == 0 else None


def dirty_sources() -> list[str]:
    """Files of :data:`CODE_UNDER_TEST` that differ from the commit (``git status``)."""
    out = git("status", "--porcelain", "--", *CODE_UNDER_TEST)
    return [line[3:] for line in out.splitlines() if line[3:]] if out else []


def files_digest(paths: Iterable[Path]) -> str:
    """SHA-1 (12 hex digits) over the names and contents of ``paths`` as they are on disk, in the order given."""
    h = hashlib.sha1()
    for path in paths:
        h.update(path.name.encode())
        h.update(path.read_bytes())
    return h.hexdigest()[:12]


def _mqtt_sources_digest() -> str:
    """:func:`files_digest` of ``fanout/mqtt/*.py`` (the broker may have uncommitted changes)."""
    return files_digest(sorted((REPO / "fanout" / "mqtt").glob("*.py")))


def versions() -> dict[str, Any]:
    """Versions of this project (git commit, uncommitted files, a digest of the broker sources) and the peers."""
    status = git("status", "--porcelain", "--", "fanout")
    commit = git("rev-parse", "--short=12", "HEAD")
    return {
        "sdv_fanout": dist_version("sdv-fanout"),
        "git_commit": commit.strip() if commit else None,
        "fanout_tree_dirty": bool(status.strip()) if status is not None else None,
        "uncommitted": dirty_sources(),
        "fanout_mqtt_sources_sha1": _mqtt_sources_digest(),
        # "compiled": the hot path ran as mypyc's machine code (fanout/native.py); else why not
        "fanout_native": native.STATUS,
        "mosquitto": mosquitto_version(),
        "amqtt": dist_version("amqtt"),
        "paho_mqtt": dist_version("paho-mqtt"),
        "uvloop": dist_version("uvloop"),
        "psutil": dist_version("psutil"),
        "matplotlib": dist_version("matplotlib"),
    }
