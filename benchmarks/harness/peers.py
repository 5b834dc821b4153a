"""One MQTT broker for a ``with`` block: this project's ``fanout broker``, Mosquitto or amqtt.

Strategy:

- :class:`PeerBroker` runs the broker as its own :class:`~.processes.Child` on 127.0.0.1 and always stops
  it (SIGTERM, then SIGKILL) when the ``with`` block ends, also on error. Mosquitto drops root privileges
  at start, which clears ``PR_SET_PDEATHSIG``; the ``with`` block still stops it. CPU and RSS are read
  from ``/proc/<pid>`` of the broker process itself.
- Ready: ``fanout broker`` and the amqtt entry print a ready line with the port; Mosquitto gets a free
  port up front and is ready when it accepts a connection.
- Broker settings are made comparable, not tuned: same outbound inflight window per client where the
  broker has one, queues large enough that no QoS 1 message is dropped, no persistence, TCP_NODELAY
  (asyncio sets it on every socket, Mosquitto needs ``set_tcp_nodelay true``). A benchmark that needs
  another ``fanout broker`` config (the platform client's dev login) passes ``fanout_config``.
"""
from __future__ import annotations

import os
import sys
from pathlib import Path

from .processes import (
    HOST, Child, StartError, free_port, proc_cpu_seconds, proc_cpu_seconds_precise, proc_rss_bytes, stopped_on_error,
)
from .versions import dist_version, mosquitto_binary, mosquitto_version

SYSTEMS: tuple[str, ...] = ("fanout", "mosquitto", "amqtt")

# Outbound QoS 1/2 messages in flight per client, for every broker that has such a window (fanout's
# default; Mosquitto's default is 20; amqtt has no window).
INFLIGHT_WINDOW = 32
# Per-client queue bound behind the window: large enough that no QoS 1 message is ever dropped.
QUEUE_BOUND = 10_000_000

# ``fanout broker`` made comparable with the peers (see the module docstring).
FANOUT_BROKER_CONFIG = f"""\
[mqtt]
max_inflight = {INFLIGHT_WINDOW}
max_offline_messages = {QUEUE_BOUND}
max_connections = 1000000
dev_platform_login = false
"""

MOSQUITTO_CONFIG = f"""\
listener {{port}} {HOST}
allow_anonymous true
persistence false
max_inflight_messages {INFLIGHT_WINDOW}
max_queued_messages {QUEUE_BOUND}
set_tcp_nodelay true
log_dest stderr
log_type error
log_type warning
"""

_AMQTT_ENTRY = r"""
import asyncio, logging, signal, sys
logging.basicConfig(level=logging.WARNING)
from amqtt.broker import Broker

async def main(port: int) -> None:
    config = {
        "listeners": {"default": {"type": "tcp", "bind": f"127.0.0.1:{port}", "max_connections": -1}},
        "plugins": {"amqtt.plugins.authentication.AnonymousAuthPlugin": {"allow_anonymous": True}},
    }
    broker = Broker(config)
    await broker.start()
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    print(f"amqtt broker ready mqtt://127.0.0.1:{port}", flush=True)
    await stop.wait()
    await broker.shutdown()

asyncio.run(main(int(sys.argv[1])))
"""


class BrokerStartError(StartError):
    """A broker did not become ready; the message carries the tail of its log."""


def fanout_executable() -> str:
    """The ``fanout`` command next to this interpreter (the project's virtualenv), else from PATH."""
    fanout = Path(sys.executable).with_name("fanout")
    return str(fanout) if fanout.exists() else "fanout"


class PeerBroker:
    """Run one broker on 127.0.0.1 for the duration of a ``with`` block.

    Attributes (after ``__enter__``): ``host``, ``port``, ``pid``.

    Args:
        system: ``fanout``, ``mosquitto`` or ``amqtt``.
        start_timeout: seconds to wait for the broker to accept connections.
        stop_timeout: seconds to wait after SIGTERM before SIGKILL.
        fanout_config: the TOML of ``fanout broker`` (default :data:`FANOUT_BROKER_CONFIG`).
        mosquitto_extra: lines appended to Mosquitto's config (e.g. a TLS listener).
    """

    def __init__(self, system: str, *, start_timeout: float = 30.0, stop_timeout: float = 10.0,
                 fanout_config: str = FANOUT_BROKER_CONFIG, mosquitto_extra: str = "") -> None:
        if system not in SYSTEMS:
            raise ValueError(f"unknown broker {system!r}, expected one of {SYSTEMS}")
        self.system = system
        self.host = HOST
        self.port = 0
        self.start_timeout = start_timeout
        self.stop_timeout = stop_timeout
        self.fanout_config = fanout_config
        self.mosquitto_extra = mosquitto_extra
        self._child: Child | None = None

    @property
    def pid(self) -> int:
        if self._child is None:
            raise RuntimeError("broker not started")
        return self._child.pid

    def cpu_seconds(self) -> float:
        """Broker process CPU time so far: from schedstat (ns) when the kernel has it, else the 10 ms
        ticks of ``/proc/PID/stat``. Ticks are too coarse for a peer's quick run: Mosquitto spends a few
        ticks on a quick fleet run, and subtracting an idle rate measured in ticks made its CPU per
        delivery zero or negative (a flaky test_fanout_bench_quick). The brokers run here keep their
        threads for their lifetime, so schedstat's omission of exited threads does not apply."""
        fine = proc_cpu_seconds_precise(self.pid)
        return fine if fine is not None else proc_cpu_seconds(self.pid)

    def cpu_seconds_precise(self) -> float | None:
        """Broker CPU time from schedstat (ns resolution, live threads only), or None."""
        return proc_cpu_seconds_precise(self.pid)

    def rss_bytes(self) -> int:
        """Broker process resident set size now."""
        return proc_rss_bytes(self.pid)

    def __enter__(self) -> "PeerBroker":
        self._child = Child(self.system, BrokerStartError, tmp_prefix=f"bench-{self.system}-")
        with stopped_on_error(self):
            self._start(self._child)
        return self

    def __exit__(self, *exc: object) -> None:
        child, self._child = self._child, None
        if child is not None:
            child.close(self.stop_timeout, kill_wait_s=5)

    def _start(self, child: Child) -> None:
        env = dict(os.environ, FANOUT_LOG_JSON="0", PYTHONUNBUFFERED="1")
        tmp = child.tmp
        if self.system == "fanout":
            conf = tmp / "fanout.toml"
            conf.write_text(self.fanout_config)
            child.spawn([fanout_executable(), "broker", "--config", str(conf), "--host", HOST, "--port", "0"],
                        log_name="broker.log", env=env)
            self.port = child.read_ready_line("fanout broker ready mqtt://", self.start_timeout)
        elif self.system == "mosquitto":
            binary = mosquitto_binary()
            if binary is None:
                raise BrokerStartError("mosquitto is not installed (make mosquitto)")
            self.port = free_port()
            conf = tmp / "mosquitto.conf"
            conf.write_text(MOSQUITTO_CONFIG.format(port=self.port) + self.mosquitto_extra)
            os.chmod(tmp, 0o755)  # Mosquitto drops root privileges before it reads its config
            os.chmod(conf, 0o644)
            child.spawn([binary, "-c", str(conf)], log_name="broker.log", env=env)
            child.wait_port(self.host, self.port, self.start_timeout)
        else:
            self.port = free_port()
            child.spawn([sys.executable, "-c", _AMQTT_ENTRY, str(self.port)], log_name="broker.log", env=env)
            child.read_ready_line("amqtt broker ready mqtt://", self.start_timeout)
            child.wait_port(self.host, self.port, self.start_timeout)

    def version(self) -> str | None:
        """Version string of this broker (the project's, Mosquitto's or amqtt's)."""
        if self.system == "mosquitto":
            return mosquitto_version()
        return dist_version("sdv-fanout" if self.system == "fanout" else "amqtt")
