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

from typing import Any

# Ray's names (src/ray/common/ray_config_def.h): 0 disables task event recording and reporting.
SYSTEM_CONFIG: dict[str, Any] = {
    "task_events_report_interval_ms": 0,
    "event_stats": False,
    "enable_metrics_collection": False,
}


def enabled(config: Any) -> bool:
    """Whether ``config`` (a loaded fanout config) keeps Ray's own observability on."""
    return bool(config.cluster.ray_observability)


def system_config(config: Any) -> dict[str, Any]:
    """The ``_system_config`` of a Ray instance ``fanout up`` starts: :data:`SYSTEM_CONFIG`, or none when enabled."""
    return {} if enabled(config) else dict(SYSTEM_CONFIG)


def actor_options(config: Any) -> dict[str, Any]:
    """Options for ``.options()`` of every fanout actor: no task events unless enabled."""
    return {"enable_task_events": enabled(config)}


__all__ = ["SYSTEM_CONFIG", "actor_options", "enabled", "system_config"]
