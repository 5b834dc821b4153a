"""Configuration seen end to end: a custom delivery topic prefix."""
from __future__ import annotations

import pytest

from .fanout_harness import RawClient, Publish, fanout_config, publish_batch, running_cluster


@pytest.fixture(scope="module")
def fanout(ray_local, tmp_path_factory):
    cfg = fanout_config(tmp_path_factory.mktemp("prefix"), topic_prefix="fleet/{VIN}/ota/jobs")
    with running_cluster(cfg) as cluster:
        yield cluster


def test_delivery_topic_prefix_is_configurable(fanout):
    car = RawClient(fanout.port, "PFX1")
    try:
        car.subscribe("agent/PFX1/proxy/request/+")  # the default prefix: not the delivery filter here
        car.subscribe("fleet/PFX1/ota/+/+", pid=2)  # covers fleet/PFX1/ota/jobs/+
        publish_batch(fanout.port, ["PFX1"], "job-42")
        msg = car.expect(Publish)
        assert msg.topic == "fleet/PFX1/ota/jobs/job-42" and msg.payload == b"BLOB"
    finally:
        car.disconnect()
