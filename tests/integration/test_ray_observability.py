"""The session's Ray runs as ``fanout up`` starts one (actors.ray_observability), and starting it left the shared
settings as they were: ``ray.init`` writes its session's object spilling settings into the ``_system_config`` it
is given, which once carried one session's spill directory into every later Ray of the test session."""
from __future__ import annotations

import json


def test_starting_ray_leaves_the_shared_settings_alone(ray_local):
    from actors.ray_observability import SYSTEM_CONFIG

    assert dict(SYSTEM_CONFIG) == {"task_events_report_interval_ms": 0, "event_stats": False,
                                   "enable_metrics_collection": False}


def test_the_session_ray_has_the_settings(ray_local):
    import ray

    # the system config this driver started its Ray node with (what every process of that instance reads)
    raw = ray._private.worker.global_worker.node._config  # type: ignore[attr-defined]
    config = raw if isinstance(raw, dict) else json.loads(raw)
    assert config["task_events_report_interval_ms"] == 0
    assert config["event_stats"] is False
    assert config["enable_metrics_collection"] is False
