"""Load benchmarks of sdv-fanout against its peers (Mosquitto, amqtt).

The one entry point is ``python -m benchmarks.run [--quick] [--only NAME ...]`` (``make bench``); each
scenario module exposes ``run(quick: bool) -> dict`` and writes its JSON and PNG under
``benchmarks/results/``. Shared helpers (machine info, versions, result writer, plots, peer brokers) live
in :mod:`benchmarks.common`.
"""
