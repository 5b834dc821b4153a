"""Starting or joining Ray, placing the fanout actors, finding a running cluster.

Strategy:

- ``address="local"`` (the embedded default) starts a private Ray instance on this machine with the
  ``fanout_node`` resource (``cluster.num_cpus``, ``cluster.object_store_memory``, no dashboard); it dies
  with the process. ``auto`` or ``HOST:PORT`` joins an existing cluster, where every Ray node that should
  run a listener was started with ``--resources='{"fanout_node": 1}'``; the controller is then a
  detached actor so the cluster outlives a client disconnect, and ``fanout up`` still kills it on exit.
- Everything lives in the Ray namespace ``sdv-fanout``; the controller is the named actor
  ``fanout-controller``. After start, the Ray address is written to ``<data_dir>/ray_address`` so that
  ``fanout status``/``inspect`` with the same config find the embedded cluster without flags (a
  ``local`` Ray instance is not registered where ``address="auto"`` looks when another cluster runs).
- :func:`start_fanout` works on an already initialised Ray too (tests: the session's local Ray).
"""
from __future__ import annotations

import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import structlog

log = structlog.get_logger(__name__)

ADDRESS_FILE = "ray_address"


@dataclass(slots=True)
class FanoutCluster:
    """A started fanout cluster as seen from the driver.

    Attributes:
        controller: the Controller actor handle.
        info: ``Controller.start`` result (``nodes`` with real ports, ``shards``).
        name: the controller's actor name.
        owns_ray: this process started Ray (``address="local"``) and shuts it down on stop.
    """

    controller: Any
    info: dict[str, Any]
    name: str
    owns_ray: bool = False
    stopped: bool = field(default=False)

    @property
    def nodes(self) -> list[dict[str, Any]]:
        return list(self.info["nodes"])

    @property
    def host(self) -> str:
        return str(self.info["nodes"][0]["host"])

    @property
    def port(self) -> int:
        return int(self.info["nodes"][0]["port"])

    @property
    def url(self) -> str:
        """``mqtt://H:P`` of the first node (IPv6 literals in brackets)."""
        host = self.host
        return f"mqtt://[{host}]:{self.port}" if ":" in host else f"mqtt://{host}:{self.port}"

    def status(self, timeout_s: float = 30.0) -> dict[str, Any]:
        import ray

        return ray.get(self.controller.status.remote(), timeout=timeout_s)

    def inspect(self, kind: str, ident: str, timeout_s: float = 30.0) -> dict[str, Any]:
        import ray

        return ray.get(self.controller.inspect.remote(kind, ident), timeout=timeout_s)

    def stop(self, *, shutdown_ray: bool | None = None, timeout_s: float = 30.0) -> None:
        """Drain nodes, close stores, kill every fanout actor; shut Ray down if this process started it.

        Args:
            shutdown_ray: override; default shuts down only a Ray instance this process started.
            timeout_s: bound on the graceful part (the actors are killed either way).
        """
        import ray

        if self.stopped:
            return
        self.stopped = True
        try:
            ray.get(self.controller.shutdown.remote(), timeout=timeout_s)
        except Exception as exc:  # a dead controller: kill what can be killed below
            log.warning("fanout shutdown incomplete", error=str(exc)[:300])
        try:
            ray.kill(self.controller, no_restart=True)
        except Exception:
            pass
        if shutdown_ray if shutdown_ray is not None else self.owns_ray:
            ray.shutdown()


def init_ray(config: Any, address: str, *, log_to_driver: bool = True) -> bool:
    """Start or join Ray (no-op when already initialised).

    Args:
        config: loaded config (``[cluster]``).
        address: ``local``, ``auto`` or ``HOST:PORT``.
        log_to_driver: stream actor logs to this process's stderr.

    Returns:
        True when this call started a local Ray instance.
    """
    import ray

    from actors.names import NAMESPACE, NODE_RESOURCE
    from actors.ray_observability import system_config

    if ray.is_initialized():
        return False
    common = {"namespace": NAMESPACE, "log_to_driver": log_to_driver, "configure_logging": False}
    if address == "local":
        cl = config.cluster
        use_private_token(config.storage.data_dir)
        ray.init(address="local", num_cpus=cl.num_cpus or os.cpu_count() or 1, include_dashboard=False,
                 object_store_memory=cl.object_store_memory_bytes, resources={NODE_RESOURCE: 1},
                 _system_config=system_config(config), **common)
        return True
    ray.init(address=address, **common)
    return False


def start_fanout(config: Any, *, address: str | None = None, name: str | None = None,
                 detached: bool | None = None, log_to_driver: bool = True, timeout_s: float = 180.0) -> FanoutCluster:
    """Start the fanout cluster: Ray (unless initialised), the controller, dispatchers and nodes.

    Args:
        config: loaded config; ``storage.data_dir`` is created.
        address: ``local``, ``auto`` or ``HOST:PORT``; None uses ``cluster.address`` unless Ray is already
            initialised (then that instance is used).
        name: controller actor name (default ``fanout-controller``).
        detached: detached controller; default True when joining an existing cluster.
        log_to_driver: stream actor logs to this process's stderr.
        timeout_s: bound on actor start-up.

    Returns:
        The started cluster (``url`` is the first node's listener).

    Raises:
        RuntimeError: a listener cannot bind, no ``fanout_node`` resource, or start-up timed out. Everything
            started by this call is stopped before raising.
    """
    import ray

    from actors.controller import Controller
    from actors.names import CONTROLLER_NAME, NAMESPACE, remote_error_text
    from actors.ray_observability import actor_options
    from cluster.http import HttpService

    name = name or CONTROLLER_NAME
    already = ray.is_initialized()
    owns = False
    if not already:
        address = address or config.cluster.address
        owns = init_ray(config, address, log_to_driver=log_to_driver)
    Path(config.storage.data_dir).mkdir(parents=True, exist_ok=True)
    if detached is None:
        detached = not already and address not in (None, "local")
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    # On the driver's node: the controller runs failover, so it should not share the fate of a worker node.
    options: dict[str, Any] = {"name": name, "namespace": NAMESPACE, "scheduling_strategy":
                               NodeAffinitySchedulingStrategy(ray.get_runtime_context().get_node_id(), soft=False),
                               **actor_options(config)}
    if detached:
        options["lifetime"] = "detached"
    controller = Controller.options(**options).remote(config, HttpService)
    cluster = FanoutCluster(controller, {"nodes": [], "shards": 0}, name, owns)
    started = time.monotonic()
    try:
        cluster.info = ray.get(controller.start.remote(), timeout=timeout_s)
    except Exception as exc:
        cluster.stop(timeout_s=10.0)
        raise RuntimeError(remote_error_text(exc)) from None
    write_address_file(config.storage.data_dir)
    log.info("fanout started", url=cluster.url, nodes=len(cluster.info["nodes"]), shards=cluster.info["shards"],
             startup_s=round(time.monotonic() - started, 2))
    return cluster


TOKEN_FILE = "ray_auth_token"


def use_private_token(data_dir: str | os.PathLike[str]) -> Path | None:
    """Give an embedded (``address="local"``) Ray instance its own auth token in ``<data_dir>``.

    Ray 2.60 enables token authentication for local clusters and by default every local instance on the
    machine shares ``~/.ray/auth_token``; several clusters (tests, a second ``fanout up``) starting at
    once can then overwrite each other's token and lock their own clients out. A token file per data
    directory (mode 0600, reused across restarts) avoids that; ``fanout status``/``inspect`` find it
    through ``<data_dir>/ray_address``. Nothing is changed when the operator chose a token or disabled
    token auth through the environment.

    Returns:
        The token file in use, or None when the environment already decides.
    """
    import secrets

    if os.environ.get("RAY_AUTH_TOKEN") or os.environ.get("RAY_AUTH_TOKEN_PATH"):
        return None
    if os.environ.get("RAY_AUTH_MODE", "token").lower() != "token":
        return None
    path = Path(data_dir).resolve() / TOKEN_FILE
    path.parent.mkdir(parents=True, exist_ok=True)
    if not path.exists():
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(secrets.token_hex(32))
    # The token value, not RAY_AUTH_TOKEN_PATH: Ray 2.60's GCS did not accept clients when only the
    # path variable was set (measured), while the value is honoured by every Ray process it starts.
    os.environ["RAY_AUTH_MODE"] = "token"
    os.environ["RAY_AUTH_TOKEN"] = path.read_text().strip()
    _reload_ray_auth()
    return path


def _reload_ray_auth() -> None:
    """Make an already imported Ray see auth settings changed in ``os.environ``.

    Ray reads ``RAY_AUTH_MODE``/``RAY_AUTH_TOKEN`` into its C++ config at import time; Ray itself
    re-initialises that config after changing the mode (``authentication_token_setup._enable_token_auth``),
    and so do we.
    """
    import sys

    if "ray" not in sys.modules:
        return
    from ray._raylet import AuthenticationTokenLoader, Config

    Config.initialize("")
    AuthenticationTokenLoader.instance().reset_cache()


def write_address_file(data_dir: str | os.PathLike[str]) -> None:
    """Record the running Ray cluster's address (and its auth mode) in ``<data_dir>/ray_address``.

    Format: the address on the first line, then ``auth_mode=token`` when the cluster uses Ray's token
    authentication (a client joining by explicit address must then opt in, see :func:`connect`).
    """
    import ray

    try:
        address = ray.get_runtime_context().gcs_address
    except Exception:
        return
    lines = [address]
    mode = os.environ.get("RAY_AUTH_MODE")
    if mode:
        lines.append(f"auth_mode={mode}")
    token_file = Path(data_dir).resolve() / TOKEN_FILE
    if os.environ.get("RAY_AUTH_TOKEN") and token_file.exists():
        lines.append(f"auth_token_path={token_file}")
    (Path(data_dir) / ADDRESS_FILE).write_text("\n".join(lines) + "\n")


def find_address(data_dir: str | os.PathLike[str] | None, address: str | None) -> str:
    """The Ray address to connect to: explicit, else ``<data_dir>/ray_address``, else ``auto``.

    Reading the file also adopts its ``auth_mode`` (sets ``RAY_AUTH_MODE`` unless already set): Ray only
    sends its token (``~/.ray/auth_token``) to an explicit address when that mode is on.
    """
    if address:
        return address
    if data_dir is not None:
        p = Path(data_dir) / ADDRESS_FILE
        if p.exists():
            lines = p.read_text().split()
            if lines:
                for extra in lines[1:]:
                    if extra.startswith("auth_mode="):
                        os.environ.setdefault("RAY_AUTH_MODE", extra.split("=", 1)[1])
                    elif extra.startswith("auth_token_path=") and "RAY_AUTH_TOKEN" not in os.environ:
                        token_file = Path(extra.split("=", 1)[1])
                        if token_file.exists():
                            os.environ["RAY_AUTH_TOKEN"] = token_file.read_text().strip()
                            _reload_ray_auth()
                return lines[0]
    return "auto"


def _probe(address: str, timeout_s: float = 3.0) -> None:
    """Fail fast when nothing listens at ``HOST:PORT`` (``ray.init`` would retry for a minute or more)."""
    import socket

    host, sep, port = address.rpartition(":")
    if not sep or not port.isdigit() or "://" in address:
        return  # "auto", "ray://...": let Ray resolve it
    try:
        socket.create_connection((host.strip("[]"), int(port)), timeout=timeout_s).close()
    except OSError as exc:
        raise RuntimeError(f"no Ray cluster at {address!r}: {exc.strerror or exc}") from None


def connect(address: str, name: str | None = None) -> Any:
    """Join a running Ray cluster and return the fanout controller handle.

    Raises:
        RuntimeError: no Ray cluster at ``address``, or no fanout controller in it.
    """
    import ray

    from actors.names import CONTROLLER_NAME, NAMESPACE

    if not ray.is_initialized():
        _probe(address)
        try:
            ray.init(address=address, namespace=NAMESPACE, log_to_driver=False, configure_logging=False)
        except Exception as exc:
            raise RuntimeError(f"no Ray cluster at {address!r}: {str(exc).strip().splitlines()[0]}") from None
    try:
        return ray.get_actor(name or CONTROLLER_NAME, namespace=NAMESPACE)
    except ValueError:
        raise RuntimeError(f"no fanout cluster is running on the Ray cluster at {address!r} "
                           "(start one with `fanout up`)") from None


def call_controller(data_dir: str | os.PathLike[str] | None, address: str | None, method: str, *args: Any,
                    timeout_s: float | None = None, **kwargs: Any) -> Any:
    """Join the running cluster (see :func:`find_address`) and return ``Controller.<method>(*args, **kwargs)``.

    The one way the command line reaches a running cluster: ``fanout status``, ``inspect`` and ``gc --live``.

    Raises:
        RuntimeError: no cluster found, or the call failed; the message is the remote error's own last
            line, not Ray's traceback wrapper.
    """
    import ray

    from actors.names import remote_error_text

    controller = connect(find_address(data_dir, address))
    try:
        return ray.get(getattr(controller, method).remote(*args, **kwargs), timeout=timeout_s)
    except ray.exceptions.RayTaskError as exc:
        raise RuntimeError(remote_error_text(exc)) from None


__all__ = ["FanoutCluster", "init_ray", "start_fanout", "connect", "call_controller", "find_address", "write_address_file"]
