"""Load benchmarks of sdv-fanout against its peers (Mosquitto, amqtt).

The one entry point is ``python -m benchmarks.run [--quick] [--only NAME ...]`` (``make bench``), run from
the repository root; each benchmark module exposes ``run(quick: bool) -> dict`` and writes its JSON and
PNG under ``benchmarks/results/``. What they share (servers, processes, results, plots) is in
:mod:`benchmarks.harness`; the cluster benchmarks' load (mock fleet, platform, phases) in
:mod:`benchmarks.scenarios`.
"""
