"""Ray's own observability (task events, handler statistics, metrics): off unless ``cluster.ray_observability``.

Why: Ray records a state event for every actor call and ships them to the GCS each second (the Ray dashboard's
task list, ``ray list tasks``), times every handler of every process's event loops (``event_stats``: Ray's
debug dumps) and runs its metrics pipeline (Ray's own Prometheus metrics, through each node's agent). sdv-fanout
reads none of them: its ``/metrics``, ``$SYS`` and console come from its own counters. On 2 CPUs, with all
three off an idle cluster spends ~14 % less CPU and ``server_bench`` delivered 2-7 % more per second in six
alternated rounds (docs/profile.md, nineteenth round): CPU that Mosquitto, the peer, never spends.

How: a Ray instance that ``fanout up`` starts (``cluster.address = "local"``) gets :data:`SYSTEM_CONFIG` as its
``_system_config``, which every process of it reads; the same JSON is on the head's ``ray start`` line of
``cluster/cluster.yaml``. A cluster started some other way keeps its own settings, but the fanout actors are
created with ``enable_task_events=False`` (:func:`actor_options`), so their calls at least report nothing.
``cluster.ray_observability = true`` leaves Ray as it comes (for debugging Ray itself).
"""
from __future__ import annotations

from types import MappingProxyType
from typing import Any, Mapping

# Ray's names (src/ray/common/ray_config_def.h): 0 disables task event recording and reporting. Read-only:
# ``ray.init`` adds keys of its own session (the object spilling directory) to the dict it is given, so it
# only ever gets a copy (quiet_system_config), never this.
SYSTEM_CONFIG: Mapping[str, Any] = MappingProxyType({
    "task_events_report_interval_ms": 0,
    "event_stats": False,
    "enable_metrics_collection": False,
})


def quiet_system_config() -> dict[str, Any]:
    """A new dict of :data:`SYSTEM_CONFIG` for one ``ray.init``/``Cluster`` head (they write into it)."""
    return dict(SYSTEM_CONFIG)


def enabled(config: Any) -> bool:
    """Whether ``config`` (a loaded fanout config) keeps Ray's own observability on."""
    return bool(config.cluster.ray_observability)


def system_config(config: Any) -> dict[str, Any]:
    """The ``_system_config`` of a Ray instance ``fanout up`` starts: :data:`SYSTEM_CONFIG`, or none when enabled
    (a new dict each call)."""
    return {} if enabled(config) else quiet_system_config()


def actor_options(config: Any) -> dict[str, Any]:
    """Options for ``.options()`` of every fanout actor: no task events unless enabled."""
    return {"enable_task_events": enabled(config)}


__all__ = ["SYSTEM_CONFIG", "actor_options", "enabled", "quiet_system_config", "system_config"]
