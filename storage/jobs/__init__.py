"""Batch maintenance over exported snapshots: export, Spark GC plan, guarded apply, delivery report.

Modules (import them directly; this package imports nothing, so ``import storage`` stays light):
- ``storage.jobs.export``: ``export_shard(store, out_dir) -> ExportInfo`` (Parquet + watermark).
- ``storage.jobs.plan``: ``compute_plan(spark, export_dir, plan_dir, now_ms=, retention_ms=)``.
- ``storage.jobs.plan_apply``: ``plan_batches(plan_dir, shard_id)`` (WriteBatches of guarded ops),
  ``apply_plan(store, plan_dir)``.
- ``storage.jobs.report``: ``compute_report(spark, export_dir, now_ms=, retention_ms=)``.
- ``storage.jobs.spark``: ``get_spark(config)``, the SparkSession factory.
- ``storage.jobs.cycle``: ``run_gc_cycle(shards, config=, now_ms=)`` -> ``GcSummary``.
"""
