"""Session-wide fixtures shared by every test layer.

Heavy runtimes start at most once per session and only when a test asks for them:
- ``ray_local``: one local Ray instance (``address="local"``, pinned CPUs, small object store) with the
  ``fanout_node`` resource, shut down at session end.
- ``spark``: one local SparkSession (loopback, no UI, two shuffle partitions), stopped at session end.
"""
from __future__ import annotations

import os

import pytest
from hypothesis import settings

# Hypothesis' default 200 ms deadline per example is a wall-clock bound: on this shared 2-core machine it
# measures the load of the moment, not the code (one property test of the client failed on it while
# other work ran). Speed is measured in benchmarks/, never in tests; every property keeps its examples.
settings.register_profile("sdv-fanout", deadline=None)
settings.load_profile("sdv-fanout")

os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
os.environ.setdefault("RAY_DEDUP_LOGS", "0")
os.environ.setdefault("FANOUT_LOG_JSON", "0")
# `fanout up` subprocesses of tests get no HTTP listener unless a test asks for one: test sessions run side
# by side on one machine and the default port 8080 can be taken only once.
os.environ.setdefault("FANOUT_HTTP_PORT", "0")


@pytest.fixture(scope="session")
def ray_local():
    import ray

    from tests.integration.fanout_harness import init_session_ray

    if ray.is_initialized():
        ray.shutdown()
    init_session_ray()
    try:
        yield ray
    finally:
        ray.shutdown()


@pytest.fixture(scope="session")
def spark():
    from pyspark.sql import SparkSession

    session = (
        SparkSession.builder.master("local[2]")
        .appName("sdv-fanout-tests")
        .config("spark.ui.enabled", "false")
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.driver.host", "127.0.0.1")
        .config("spark.driver.bindAddress", "127.0.0.1")
        .config("spark.driver.memory", "1g")
        .getOrCreate()
    )
    session.sparkContext.setLogLevel("ERROR")
    try:
        yield session
    finally:
        session.stop()
