"""Compiled hot-path modules of this package: which to use, and when not to.

``make`` compiles the modules of :data:`COMPILED` with mypyc (``python -m scripts.build_native``) into
``fanout/mqtt/_compiled/`` together with the digest of the sources they were compiled from. The package's
``__init__`` asks :func:`choose` whether to put that directory in front of the package's ``__path__``, so that
``import fanout.mqtt.codec`` loads the extension module instead of ``codec.py``. The Python sources stay the
reference: they are what runs when nothing was compiled (no C compiler), when the compiled modules are stale
(a source edited since the build: the digest no longer matches, so an edit is never shadowed by old machine
code), and when ``FANOUT_MQTT_NATIVE=0``.

Why these modules: the codec and the session bookkeeping are on every delivery, connect and heartbeat, and
they import nothing outside this package except structlog, so they compile alone (callgrind: -13 % of a
delivery's instructions, -10 % of a connect's; docs/profile.md, sixteenth round).
"""
from __future__ import annotations

import hashlib
import os
import sys
from collections.abc import Mapping
from pathlib import Path

COMPILED = ("codec", "decoder", "encoder", "delivery", "session", "state",
            "broker", "connection", "inbound", "subscriptions", "auth", "topics", "trie", "lifecycle", "deadlines",
            "retained", "expiry", "decoder5", "connack_hold", "wills")
DIR_NAME = "_compiled"  # inside the package; git-ignored
DIGEST_FILE = "digest.txt"
GROUP = "fanout.mqtt.compiled"  # mypyc's shared library: fanout/mqtt/_compiled/compiled__mypyc.<abi>.so
ENV = "FANOUT_MQTT_NATIVE"  # "0", "false", "no" or "off": the Python sources, whatever was built

# What the package runs, set by ``fanout/mqtt/__init__`` at import: "compiled", "disabled" (ENV), "absent"
# (never built, or the build failed) or "stale" (sources changed since the build).
STATUS = "absent"


def sources_digest(package_dir: Path) -> str:
    """The digest of what a build compiles: the interpreter's tag and each compiled module's source."""
    h = hashlib.sha256(sys.implementation.cache_tag.encode())
    for name in COMPILED:
        h.update(b"\0" + name.encode() + b"\0")
        h.update((package_dir / f"{name}.py").read_bytes())
    return h.hexdigest()


def choose(package_dir: Path, environ: Mapping[str, str] = os.environ) -> tuple[str, Path | None]:
    """(status, directory to put in front of the package's ``__path__`` or None): see :data:`STATUS`."""
    if environ.get(ENV, "1").strip().lower() in ("0", "false", "no", "off"):
        return "disabled", None
    compiled = package_dir / DIR_NAME
    try:
        built = (compiled / DIGEST_FILE).read_text().strip()
    except OSError:
        return "absent", None
    if built != sources_digest(package_dir):
        return "stale", None
    return "compiled", compiled


def running_compiled() -> list[str]:
    """The modules of :data:`COMPILED` that this process runs as compiled code (imports them)."""
    import importlib

    out = []
    for name in COMPILED:
        module = importlib.import_module(f"{__package__}.{name}")
        if not (module.__file__ or "").endswith(".py"):
            out.append(name)
    return out


__all__ = ["COMPILED", "DIGEST_FILE", "DIR_NAME", "ENV", "GROUP", "STATUS", "choose", "running_compiled",
           "sources_digest"]
