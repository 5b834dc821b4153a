"""Compiled hot-path modules: which to use, and when not to.

``make`` compiles the modules of :data:`COMPILED` with mypyc (``python -m scripts.build_native``) into
``fanout/_compiled/`` (one directory per package: ``mqtt/``, ``node/``, ``dispatcher/``) together with the digest
of the sources they were compiled from. This module decides once per process, at its import, whether they are
used (:data:`STATUS`); each compiled package's ``__init__`` then calls :func:`extend_path`, which puts the
package's compiled directory in front of its ``__path__``, so that ``import fanout.mqtt.codec`` loads the
extension module instead of ``codec.py``. The Python sources stay the reference: they are what runs when
nothing was compiled (no C compiler), when the compiled modules are stale (a source edited since the build: the
digest no longer matches, so an edit is never shadowed by old machine code), and when ``FANOUT_NATIVE=0``.
All modules or none: they are one build (mypyc's shared library holds the code of all of them).

Why these modules (docs/profile.md, sixteenth and seventeenth rounds): the MQTT codec, session bookkeeping and
connect path run on every delivery, connect and heartbeat; the node core turns each broker event into a
dispatcher event and executes each delivery; the dispatcher's per-VIN machine and row reads run per delivery
and per connect.
"""
from __future__ import annotations

import hashlib
import os
import sys
from collections.abc import Mapping
from pathlib import Path

# Dotted names below the ``fanout`` package. Each package named here calls extend_path in its __init__.
# Not here: fanout.dispatcher.state (mypyc's frozen slotted dataclasses cannot be unpickled: their __setattr__
# refuses what unpickling sets).
COMPILED = (
    "mqtt.codec", "mqtt.decoder", "mqtt.encoder", "mqtt.delivery", "mqtt.session", "mqtt.state",
    "mqtt.broker", "mqtt.connection", "mqtt.inbound", "mqtt.subscriptions", "mqtt.auth", "mqtt.topics",
    "mqtt.trie", "mqtt.lifecycle", "mqtt.deadlines", "mqtt.retained", "mqtt.expiry", "mqtt.decoder5",
    "mqtt.connack_hold", "mqtt.wills",
    "node.core", "node.topic_groups", "node.delivery_topic",
    "dispatcher.machine", "dispatcher.rows", "dispatcher.core",
)
ROOT = Path(__file__).resolve().parent  # the fanout package
DIR_NAME = "_compiled"  # fanout/_compiled/; git-ignored
DIGEST_FILE = "digest.txt"
GROUP = "fanout.mqtt.compiled"  # mypyc's shared library: fanout/_compiled/mqtt/compiled__mypyc.<abi>.so
ENV = "FANOUT_NATIVE"  # "0", "false", "no" or "off": the Python sources, whatever was built
OLD_ENV = "FANOUT_MQTT_NATIVE"  # its name while only fanout.mqtt was compiled; still honoured
OFF = ("0", "false", "no", "off")


def sources_digest(root: Path = ROOT) -> str:
    """The digest of what a build compiles: the interpreter's tag and each compiled module's source."""
    h = hashlib.sha256(sys.implementation.cache_tag.encode())
    for name in COMPILED:
        h.update(b"\0" + name.encode() + b"\0")
        h.update(source_path(name, root).read_bytes())
    return h.hexdigest()


def source_path(name: str, root: Path = ROOT) -> Path:
    """``fanout/mqtt/codec.py`` for ``mqtt.codec``."""
    return root.joinpath(*name.split(".")).with_suffix(".py")


def choose(root: Path = ROOT, environ: Mapping[str, str] = os.environ) -> tuple[str, Path | None]:
    """(status, the compiled tree to use or None): see :data:`STATUS`."""
    for var in (ENV, OLD_ENV):
        if environ.get(var, "1").strip().lower() in OFF:
            return "disabled", None
    compiled = root / DIR_NAME
    try:
        built = (compiled / DIGEST_FILE).read_text().strip()
    except OSError:
        return "absent", None
    if built != sources_digest(root):
        return "stale", None
    return "compiled", compiled


# What this process runs: "compiled", "disabled" (ENV), "absent" (never built, or the build failed) or "stale"
# (sources changed since the build). Decided here, once, before any compiled package is imported.
STATUS, _TREE = choose()


def extend_path(package_path: list[str], package: str) -> None:
    """Put the compiled modules of ``package`` (``"mqtt"``) in front of its ``__path__`` when they are used."""
    if _TREE is not None:
        package_path.insert(0, str(_TREE / package))


def running_compiled() -> list[str]:
    """The modules of :data:`COMPILED` that this process runs as compiled code (imports them)."""
    import importlib

    out = []
    for name in COMPILED:
        module = importlib.import_module(f"fanout.{name}")
        if not (module.__file__ or "").endswith(".py"):
            out.append(name)
    return out


__all__ = ["COMPILED", "DIGEST_FILE", "DIR_NAME", "ENV", "GROUP", "OLD_ENV", "ROOT", "STATUS", "choose",
           "extend_path", "running_compiled", "source_path", "sources_digest"]
