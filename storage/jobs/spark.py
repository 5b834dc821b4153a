"""SparkSession factory for the batch jobs (GC plan, delivery report).

Strategy: one session per process, created lazily (PySpark starts a JVM: 6-16 s here) and reused
through ``getOrCreate``; a caller that already has a session (the test fixture, a notebook) passes it
to the jobs instead. Defaults fit this 2-core machine and the embedded local mode (DESIGN.md,
"Facts measured"): ``local[2]``, loopback (``SPARK_LOCAL_IP=127.0.0.1``, driver bound to
127.0.0.1), UI off, 2 shuffle partitions, logs at ERROR. ``gc.spark_master`` in the config points
the jobs at a real cluster instead; only then is the driver left on its default address. PySpark
is imported inside the function, so importing this module stays cheap.
"""
from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any, Mapping

import structlog

if TYPE_CHECKING:  # pragma: no cover
    from pyspark.sql import SparkSession

log = structlog.get_logger(__name__)

DEFAULT_MASTER = "local[2]"
DEFAULT_CONF: dict[str, str] = {
    "spark.ui.enabled": "false",
    "spark.sql.shuffle.partitions": "2",
    "spark.driver.memory": "2g",
    "spark.sql.session.timeZone": "UTC",
    "spark.sql.parquet.mergeSchema": "false",
    "spark.ui.showConsoleProgress": "false",
}


def spark_master(config: Any | None) -> str:
    """The Spark master URL from ``config.gc.spark_master`` (``local[2]`` without a config)."""
    if config is None:
        return DEFAULT_MASTER
    return str(getattr(config.gc, "spark_master", DEFAULT_MASTER) or DEFAULT_MASTER)


def get_spark(
    config: Any | None = None,
    *,
    master: str | None = None,
    app_name: str = "sdv-fanout-jobs",
    conf: Mapping[str, str] | None = None,
) -> SparkSession:
    """Return the process's SparkSession, creating it on first use.

    Args:
        config: ``fanout.config.Config`` (for ``gc.spark_master``); optional.
        master: overrides the master URL from ``config``.
        app_name: Spark application name.
        conf: extra Spark settings (win over the defaults; JVM settings such as
            ``spark.driver.memory`` only take effect when this call starts the JVM).

    Returns:
        The active (or new) SparkSession.
    """
    from pyspark.sql import SparkSession

    url = master or spark_master(config)
    local = url.startswith("local")
    if local:
        os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    settings = dict(DEFAULT_CONF)
    if local:
        settings["spark.driver.host"] = "127.0.0.1"
        settings["spark.driver.bindAddress"] = "127.0.0.1"
    settings.update(conf or {})
    active = SparkSession.getActiveSession()
    if active is not None:
        return active
    builder = SparkSession.builder.master(url).appName(app_name)
    for key, value in settings.items():
        builder = builder.config(key, value)
    session = builder.getOrCreate()
    session.sparkContext.setLogLevel("ERROR")
    log.info("spark_session_started", master=url, app_name=app_name, version=session.version)
    return session
