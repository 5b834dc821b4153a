"""The mock fleet's reusable parts (used by :mod:`scripts.mock_vehicles`, :mod:`scripts.mock_platform`, the
benchmarks and the tests).

Modules:

- :mod:`.vins`: the VIN generator shared by the fleet and the platform (``SIM000000001`` ...).
- :mod:`.payload`: the 12-byte send-time header the platform stamps and the fleet reads.
- :mod:`.options`: :class:`FleetOptions`, source addresses over 127/8, the descriptor limit.
- :mod:`.accounting`: the per-vehicle delivery ledger (received, duplicates, order, latency).
- :mod:`.vehicle`: one lean ``asyncio.Protocol`` per simulated vehicle on the project's codec.
- :mod:`.worker`: the vehicles of one process: connection ramp, source addresses, shutdown.
- :mod:`.runner`: :func:`run_fleet`, splitting a fleet over processes, live display, JSON summary.

Imported as ``scripts.fleet`` from the repository root (``python -m``, pytest and the benchmarks run there).
"""
from __future__ import annotations

__all__ = ["FleetOptions", "run_fleet"]


def __getattr__(name: str):  # lazy: ``from scripts.fleet import run_fleet`` without importing asyncio eagerly
    if name in __all__:
        from . import options, runner

        return {"FleetOptions": options.FleetOptions, "run_fleet": runner.run_fleet}[name]
    raise AttributeError(name)
