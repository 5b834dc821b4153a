"""The load of the cluster benchmarks (``fanout_bench`` for issue 3, ``fleet_bench`` for issue 7); the
servers they measure and their output are in :mod:`benchmarks.harness`.

Modules:

- :mod:`.fleet`: :class:`~.fleet.FleetRun`, the mock fleet (:mod:`scripts.fleet`) in spawned processes
  driven from a background thread, with a time series of its counters.
- :mod:`.senders`: what the platform sends: requests through the platform client (blob + trigger), one
  raw trigger PUBLISH, and the naive publisher (one QoS 1 PUBLISH per vehicle) for the peers.
- :mod:`.phases`: the measured phases shared by both benchmarks (fanout of R requests to N vehicles,
  ingest of one big trigger, drain of queued rows, connection storm, heartbeat storm).
"""
