"""HTTP on the controller's node (``[http] host``/``port``, 0 = off): Prometheus metrics, a JSON API, a console.

- :mod:`cluster.http.service`: :class:`HttpService`, started inside the Controller actor (the controller is
  handed the class by :func:`cluster.runtime.start_fanout`, since ``actors/`` may not import ``cluster/``).
- :mod:`cluster.http.routes`: ``GET /metrics``, ``GET /api/status``, ``GET /api/requests``,
  ``GET /api/requests/ID``, ``POST /api/requests/ID/cancel``, ``GET /`` (console) and its two static files.
- :mod:`cluster.http.auth`: development mode, admin login over HTTP basic, TLS with the MQTT certificate.
- :mod:`cluster.http.metrics`: a cluster snapshot as Prometheus text (fresh registry per scrape).
- :mod:`cluster.http.views`: what the routes need from the controller (``ClusterView``, ``RequestsView``).
- ``static/``: the console page (plain HTML, CSS and JavaScript; no build step, nothing fetched from
  outside the cluster). The Prometheus scrape config and the Grafana dashboard are ``cluster/prometheus.yml``
  and ``cluster/grafana-dashboard.json``.
"""
from __future__ import annotations

from .service import HttpService

__all__ = ["HttpService"]
