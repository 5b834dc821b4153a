"""How many store shards (dispatchers) a cluster runs: ``fanout.dispatchers``, or, when it is 0, what the data
directory already holds, else what the cluster's CPUs can run.

Why not one shard per CPU (the rule before): a shard is not one process but ``1 + fanout.replicas`` of them
(its Dispatcher and its StoreReplicas), and every commit passes through each of them (a channel frame in and
out, a loop wake-up, an fsync). One shard per CPU with one replica ran two store processes per CPU next to
the listeners, so each commit's fixed cost was paid twice as often for the same messages, and the processes
queued for the CPU between the hops. On the 2-CPU machine of the benchmarks one shard instead of two gave
+25 % durable appends at window 32 and less server CPU per delivery (docs/profile.md, thirteenth round).

Why the data directory wins: a VIN's shard is ``storage.keys.shard_of(VIN, shards)``, so the count of an existing store
never changes by itself. Before, a cluster started again with more CPUs (a Ray node added, a bigger machine)
refused to start (``layout.json describes 2 shards, the cluster has 3``) until ``fanout.dispatchers`` was set.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

LAYOUT_FILE = "layout.json"


def shards_for_cpus(cpus: float, listener_processes: int, replicas: int) -> int:
    """Shards the CPUs left to the stores can run: one per ``1 + replicas`` CPUs, at least one.

    Args:
        cpus: the Ray cluster's CPUs (``ray.cluster_resources()["CPU"]``).
        listener_processes: the ConnectionNodes (fanout nodes x ``mqtt.listeners_per_node``), one CPU each.
        replicas: ``fanout.replicas``.
    """
    spare = int(cpus) - max(0, listener_processes)
    return max(1, spare // (1 + max(0, replicas)))


def read_layout(data_dir: str | Path) -> list[dict[str, Any]] | None:
    """The per-shard entries of ``<data_dir>/layout.json`` (written by :class:`actors.shards.ShardSet`), or None
    when there is none yet. The one reader of the file: the shard count and the shards' placement come from it.

    Raises:
        RuntimeError: the file exists but is not a layout (named, with what is wrong).
    """
    path = Path(data_dir) / LAYOUT_FILE
    try:
        text = path.read_text()
    except FileNotFoundError:
        return None
    try:
        shards = json.loads(text)["shards"]
        if not isinstance(shards, list) or not shards:
            raise ValueError("'shards' is not a non-empty list")
    except (ValueError, KeyError, TypeError) as exc:
        raise RuntimeError(f"{path} is not a shard layout ({exc}); move it away to start a new store") from exc
    return shards


def stored_shard_count(data_dir: str | Path) -> int | None:
    """The shard count ``<data_dir>/layout.json`` records, or None when there is none yet (see :func:`read_layout`)."""
    layout = read_layout(data_dir)
    return None if layout is None else len(layout)


def choose_shard_count(configured: int, data_dir: str | Path, cpus: float, listener_processes: int,
                       replicas: int) -> tuple[int, dict[str, Any]]:
    """The shard count to start with, and why (logged at start, shown by ``fanout status``).

    ``configured`` (``fanout.dispatchers``) > 0 is taken as is; a layout with another count then refuses the
    start (:class:`actors.shards.ShardSet`), since moving VINs between shards is not done here.
    """
    if configured > 0:
        return configured, {"source": "fanout.dispatchers"}
    stored = stored_shard_count(data_dir)
    if stored is not None:
        return stored, {"source": LAYOUT_FILE}
    return shards_for_cpus(cpus, listener_processes, replicas), {
        "source": "cpus", "cpus": int(cpus), "listener_processes": listener_processes, "replicas": replicas}


__all__ = ["LAYOUT_FILE", "choose_shard_count", "read_layout", "shards_for_cpus", "stored_shard_count"]
