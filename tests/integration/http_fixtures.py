"""Helpers for the HTTP tests (``test_http_*.py``, ``tests/security/test_http_auth.py``).

- :func:`free_port`: a TCP port free on 127.0.0.1 right now (the HTTP listener has no "any free port":
  ``http.port = 0`` turns it off).
- :func:`http_config`: the fanout test config (:func:`fanout_config`) with the HTTP listener on a free port.
- :func:`fetch`: one HTTP request with the standard library; returns :class:`Answer` for every status
  (4xx/5xx included), optionally with basic credentials, a body, extra headers or a TLS context.
- :func:`raw_request`: bytes written on a plain socket, the answer read until the server closes.
- :func:`metric_values`: ``/metrics`` text parsed by ``prometheus_client.parser`` into
  ``{(sample name, frozenset(labels)): value}``, and :func:`metric_sum` over a sample name.
"""
from __future__ import annotations

import base64
import contextlib
import dataclasses
import json
import socket
import ssl
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

from fanout.config import UserConfig
from fanout.mqtt.auth import hash_password

from .fanout_harness import fanout_config


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def http_config(tmp_path: Path, users: dict[str, tuple[str, str]] | None = None, **fanout: Any) -> Any:
    """Test config with HTTP on 127.0.0.1:<free port>; ``users`` = ``{name: (password, role)}``."""
    cfg = fanout_config(tmp_path, **fanout).replace("http", port=free_port())
    if users:
        cfg = dataclasses.replace(cfg, users={n: UserConfig(n, hash_password(pw, iterations=1000), role)
                                              for n, (pw, role) in users.items()})
    return cfg


@dataclasses.dataclass
class Answer:
    status: int
    headers: dict[str, str]
    body: bytes

    def json(self) -> Any:
        return json.loads(self.body)


def basic(user: str, password: str) -> str:
    return "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()


def fetch(url: str, *, login: tuple[str, str] | None = None, method: str = "GET", body: bytes | None = None,
          headers: dict[str, str] | None = None, context: ssl.SSLContext | None = None, timeout: float = 30.0) -> Answer:
    req = urllib.request.Request(url, data=body, method=method, headers=dict(headers or {}))
    if login is not None:
        req.add_header("Authorization", basic(*login))
    try:
        with urllib.request.urlopen(req, timeout=timeout, context=context) as res:
            return Answer(res.status, {k.lower(): v for k, v in res.headers.items()}, res.read())
    except urllib.error.HTTPError as err:
        return Answer(err.code, {k.lower(): v for k, v in err.headers.items()}, err.read())


def port_of(url: str) -> int:
    return int(url.rstrip("/").rsplit(":", 1)[1])


def raw_request(port: int, data: bytes, timeout: float = 10.0) -> bytes:
    """Send ``data`` to 127.0.0.1:``port`` as is; everything received until the server closes (or fails)."""
    chunks = []
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as s:
        s.sendall(data)
        with contextlib.suppress(OSError):
            while chunk := s.recv(65536):
                chunks.append(chunk)
    return b"".join(chunks)


def metric_values(text: str) -> dict[tuple[str, frozenset], float]:
    out: dict[tuple[str, frozenset], float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            out[(sample.name, frozenset(sample.labels.items()))] = sample.value
    return out


def metric_sum(values: dict[tuple[str, frozenset], float], name: str, **labels: str) -> float:
    """Sum of the samples named ``name`` whose labels include ``labels``."""
    want = set(labels.items())
    return sum(v for (n, ls), v in values.items() if n == name and want <= set(ls))


__all__ = ["free_port", "http_config", "fetch", "basic", "Answer", "port_of", "raw_request", "metric_values",
           "metric_sum"]
