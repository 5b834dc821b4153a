"""Compiled hot-path modules: which to use, and when not to.

``make`` compiles the modules of :data:`COMPILED` with mypyc (``python -m scripts.build_native``) into
``fanout/_compiled/`` (laid out like the project: ``fanout/mqtt/``, ``fanout/node/``, ``fanout/dispatcher/``,
``fanout/topics/``, ``storage/``) together with the digest of the sources they were compiled from. This module
decides once per process, at its import, whether they are used (:data:`STATUS`); each compiled package's
``__init__`` then calls :func:`extend_path`, which puts the package's compiled directory in front of its
``__path__``, so that ``import fanout.mqtt.codec`` loads the extension module instead of ``codec.py``. The Python
sources stay the reference: they are what runs when nothing was compiled (no C compiler), when the compiled modules
are stale (a source edited since the build: the digest no longer matches, so an edit is never shadowed by old
machine code), and when ``FANOUT_NATIVE=0``. All modules or none: they are one build (mypyc's shared library holds
the code of all of them).

Why these modules (docs/profile.md, sixteenth to eighteenth and twenty-first rounds): the MQTT codec, session
bookkeeping and connect path run on every delivery, connect and heartbeat; the node core turns each broker event
into a dispatcher event and executes each delivery; the dispatcher's per-VIN machine and row reads run per delivery
and per connect; the store's apply path (``storage.batch_apply`` and the row outcomes, receipts and request
counters it calls) runs once per delivery on the primary and again on every replica; the node's side of a durable
append (``fanout.node.topic_appends``, the topic matcher and the append records of ``fanout.topics``, twenty-first
round) runs once per publish on a durable topic; the broker's events (``fanout.mqtt.events``) are built once per
acknowledgement, heartbeat, append and presence change.

This module imports nothing of the project (``storage`` imports it too, below its layer: it is the switch, not
a dependency on ``fanout``'s code).
"""
from __future__ import annotations

import hashlib
import os
import sys
from collections.abc import Mapping
from pathlib import Path

# Dotted module names. Each package holding one calls extend_path in its __init__.
# Not here: fanout.dispatcher.state (mypyc's frozen slotted dataclasses cannot be unpickled: their __setattr__
# refuses what unpickling sets).
COMPILED = (
    "fanout.mqtt.codec", "fanout.mqtt.decoder", "fanout.mqtt.encoder", "fanout.mqtt.delivery",
    "fanout.mqtt.session", "fanout.mqtt.state", "fanout.mqtt.broker", "fanout.mqtt.connection",
    "fanout.mqtt.inbound", "fanout.mqtt.subscriptions", "fanout.mqtt.auth", "fanout.mqtt.topics",
    "fanout.mqtt.trie", "fanout.mqtt.lifecycle", "fanout.mqtt.deadlines", "fanout.mqtt.retained",
    "fanout.mqtt.expiry", "fanout.mqtt.decoder5", "fanout.mqtt.connack_hold", "fanout.mqtt.wills",
    "fanout.mqtt.events",
    "fanout.node.core", "fanout.node.topic_groups", "fanout.node.delivery_topic", "fanout.node.topic_appends",
    "fanout.topics.matcher", "fanout.topics.records",
    "fanout.dispatcher.machine", "fanout.dispatcher.rows", "fanout.dispatcher.core",
    "storage.batch_apply", "storage.row_outcomes", "storage.request_stats", "storage.topic_apply",
    "storage.queue_cursor",
)
PROJECT = Path(__file__).resolve().parents[1]  # the folder holding fanout/ and storage/
ROOT = PROJECT / "fanout"  # the fanout package
DIR_NAME = "_compiled"  # fanout/_compiled/; git-ignored
DIGEST_FILE = "digest.txt"
GROUP = "fanout.mqtt.compiled"  # mypyc's shared library: fanout/_compiled/fanout/mqtt/compiled__mypyc.<abi>.so
ENV = "FANOUT_NATIVE"  # "0", "false", "no" or "off": the Python sources, whatever was built
OLD_ENV = "FANOUT_MQTT_NATIVE"  # its name while only fanout.mqtt was compiled; still honoured
OFF = ("0", "false", "no", "off")


def tree(project: Path = PROJECT) -> Path:
    """Where a build puts the compiled modules: ``fanout/_compiled/`` of ``project``."""
    return project / "fanout" / DIR_NAME


def sources_digest(project: Path = PROJECT) -> str:
    """The digest of what a build compiles: the interpreter's tag and each compiled module's source."""
    h = hashlib.sha256(sys.implementation.cache_tag.encode())
    for name in COMPILED:
        h.update(b"\0" + name.encode() + b"\0")
        h.update(source_path(name, project).read_bytes())
    return h.hexdigest()


def source_path(name: str, project: Path = PROJECT) -> Path:
    """``<project>/fanout/mqtt/codec.py`` for ``fanout.mqtt.codec``."""
    return project.joinpath(*name.split(".")).with_suffix(".py")


def choose(project: Path = PROJECT, environ: Mapping[str, str] = os.environ) -> tuple[str, Path | None]:
    """(status, the compiled tree to use or None): see :data:`STATUS`."""
    for var in (ENV, OLD_ENV):
        if environ.get(var, "1").strip().lower() in OFF:
            return "disabled", None
    compiled = tree(project)
    try:
        built = (compiled / DIGEST_FILE).read_text().strip()
    except OSError:
        return "absent", None
    if built != sources_digest(project):
        return "stale", None
    return "compiled", compiled


# What this process runs: "compiled", "disabled" (ENV), "absent" (never built, or the build failed) or "stale"
# (sources changed since the build). Decided here, once, before any compiled package is imported.
STATUS, _TREE = choose()


def extend_path(package_path: list[str], package: str) -> None:
    """Put the compiled modules of ``package`` (``"fanout.mqtt"``) in front of its ``__path__`` when they are used."""
    if _TREE is not None:
        package_path.insert(0, str(_TREE.joinpath(*package.split("."))))


def running_compiled() -> list[str]:
    """The modules of :data:`COMPILED` that this process runs as compiled code (imports them)."""
    import importlib

    out = []
    for name in COMPILED:
        module = importlib.import_module(name)
        if not (module.__file__ or "").endswith(".py"):
            out.append(name)
    return out


__all__ = ["COMPILED", "DIGEST_FILE", "DIR_NAME", "ENV", "GROUP", "OLD_ENV", "PROJECT", "ROOT", "STATUS", "choose",
           "extend_path", "running_compiled", "source_path", "sources_digest", "tree"]
