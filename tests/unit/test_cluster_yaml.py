"""cluster/cluster.yaml is a valid `ray up` config (Ray's own schema) that installs the project and gives
every node the `fanout_node` resource."""
from __future__ import annotations

import copy
from pathlib import Path

import pytest
import yaml

CLUSTER_YAML = Path(__file__).resolve().parents[2] / "cluster" / "cluster.yaml"


@pytest.fixture(scope="module")
def raw() -> dict:
    return yaml.safe_load(CLUSTER_YAML.read_text())


def test_passes_rays_schema(raw):
    from ray.autoscaler._private.util import prepare_config, validate_config

    prepared = prepare_config(copy.deepcopy(raw))
    validate_config(prepared)  # raises jsonschema.ValidationError on a bad key or type
    assert prepared["provider"]["type"] == "local"
    assert prepared["head_node_type"] in prepared["available_node_types"]


def test_every_node_gets_the_fanout_node_resource(raw):
    for key in ("head_start_ray_commands", "worker_start_ray_commands"):
        starts = [c for c in raw[key] if "ray start" in c]
        assert starts, key
        assert all("""--resources='{"fanout_node":1}'""" in c for c in starts), key


def test_the_head_starts_ray_as_fanout_up_does(raw):
    """The head's --system-config is actors.ray_observability.SYSTEM_CONFIG (Ray's own observability off)."""
    import json
    import shlex

    from actors.ray_observability import SYSTEM_CONFIG

    (start,) = [c for c in raw["head_start_ray_commands"] if "ray start" in c]
    flags = [w for w in shlex.split(start) if w.startswith("--system-config=")]
    assert [json.loads(f.split("=", 1)[1]) for f in flags] == [dict(SYSTEM_CONFIG)]


def test_installs_the_project_and_starts_fanout(raw):
    assert raw["file_mounts"]["~/sdv-fanout"] == "."
    assert any("make install native" in c for c in raw["setup_commands"])
    assert "fanout/_compiled" in raw["rsync_exclude"]  # each node compiles for itself
    assert any("fanout up --address auto" in c for c in raw["head_start_ray_commands"])
    assert len(raw["provider"]["worker_ips"]) == raw["min_workers"] == raw["max_workers"]
