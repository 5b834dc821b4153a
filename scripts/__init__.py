"""Tools around the cluster, run as modules from the repository root (``make run`` does the first):

- ``python -m scripts.demo``: the embedded cluster, a short demo with paho-mqtt vehicles, then serving.
- ``python -m scripts.mock_vehicles``: a mock fleet of up to 100,000+ vehicles with delivery accounting.
- ``python -m scripts.mock_platform``: send requests (blob + trigger) through the platform client.
- ``python -m scripts.fuzz_codec``: fuzz the MQTT codec with random and mutated packet streams.

:mod:`scripts.fleet` is the mock fleet as a library (the benchmarks and tests import it).
"""
