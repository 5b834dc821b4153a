"""Ray's own observability is off unless ``cluster.ray_observability`` (actors.ray_observability): what a Ray
instance ``fanout up`` starts gets, and what the fanout actors are created with."""
from __future__ import annotations

import pytest

from actors import ray_observability as ro
from fanout.config import ConfigError, load_config


def _config(**cluster):
    return load_config(None, env={}).replace("cluster", **cluster) if cluster else load_config(None, env={})


def test_off_by_default():
    cfg = _config()
    assert cfg.cluster.ray_observability is False
    assert ro.system_config(cfg) == {"task_events_report_interval_ms": 0, "event_stats": False,
                                     "enable_metrics_collection": False}
    assert ro.actor_options(cfg) == {"enable_task_events": False}


def test_on_leaves_ray_as_it_comes():
    cfg = _config(ray_observability=True)
    assert ro.system_config(cfg) == {}
    assert ro.actor_options(cfg) == {"enable_task_events": True}


def test_ray_gets_a_new_dict_each_time_and_the_constant_is_read_only():
    # ray.init writes its session's object spilling settings into the _system_config it is given
    given = ro.quiet_system_config()
    given["object_spilling_config"] = '{"type": "filesystem"}'
    ro.system_config(_config())["event_stats"] = True
    assert dict(ro.SYSTEM_CONFIG) == ro.quiet_system_config() == ro.system_config(_config())
    assert ro.quiet_system_config() is not ro.quiet_system_config()
    with pytest.raises(TypeError):
        ro.SYSTEM_CONFIG["object_spilling_config"] = "{}"  # type: ignore[index]


def test_store_actors_are_placed_with_the_options():
    from actors.shards import ShardSet

    for on in (False, True):
        shards = ShardSet(_config(ray_observability=on), "/nonexistent", None, dict, dict)
        opts = shards._on_node("a" * 56)
        assert opts["enable_task_events"] is on
        assert opts["scheduling_strategy"].node_id == "a" * 56 and opts["scheduling_strategy"].soft is False


def test_a_bad_value_names_the_key(tmp_path):
    path = tmp_path / "fanout.toml"
    path.write_text('[cluster]\nray_observability = "sometimes"\n')
    with pytest.raises(ConfigError, match="cluster.ray_observability"):
        load_config(path, env={})
