"""Who may use the HTTP listener: development mode, or an ``admin`` login over HTTP basic; TLS settings.

Rules (DESIGN.md "Trust model"; issue 15):

- Development mode is a loopback HTTP listener with no ``[users.NAME]`` configured: every route is open,
  as the MQTT listener's dev platform login is. A non-loopback HTTP listener without users refuses to
  start (no one could log in, and the MQTT listener refuses the same).
- Otherwise every route but ``/metrics`` needs HTTP basic credentials of a configured user whose role is
  ``admin``. Passwords are checked by :class:`fanout.mqtt.auth.AccessControl` (the MQTT listener's
  verifier: PBKDF2 hashes, a cache of successful verifications, the last failure per user remembered).
  Unknown user, wrong password or malformed header: 401 with ``WWW-Authenticate``; a valid login with
  another role: 403. A cache miss costs one PBKDF2 run (~0.2-0.3 s of CPU by design); at most
  :data:`VERIFY_CONCURRENCY` run at once, in a thread, so a password-guessing client cannot occupy more
  of the controller's node than that.
- TLS: when ``mqtt.tls_cert`` and ``mqtt.tls_key`` are configured, the HTTP listener serves HTTPS with
  the MQTT listener's certificate.
"""
from __future__ import annotations

import asyncio
import base64
import binascii
import ssl
from dataclasses import dataclass
from typing import Any

import structlog

from fanout.config import ConfigError, mqtt_settings
from fanout.mqtt.auth import AccessControl, Principal, is_loopback_host

log = structlog.get_logger(__name__)

VERIFY_CONCURRENCY = 1
REALM = 'Basic realm="sdv-fanout", charset="UTF-8"'
HTTP_CLIENT_ID = "http"  # the client id AccessControl logs for HTTP logins


@dataclass(frozen=True, slots=True)
class Decision:
    """Outcome of one authorisation: ``status`` 200 (allowed), 401 or 403; ``user`` when known."""

    status: int
    user: str | None = None


ALLOWED = Decision(200)


def tls_files(config: Any) -> tuple[str, str] | None:
    """``(cert, key)`` paths when both ``mqtt.tls_cert`` and ``mqtt.tls_key`` are set, else None."""
    cert, key = config.mqtt.tls_cert, config.mqtt.tls_key
    return (str(cert), str(key)) if cert and key else None


def tls_context(config: Any) -> ssl.SSLContext | None:
    """A server TLS context with the MQTT certificate, or None when TLS is not configured.

    Raises:
        ConfigError: the certificate or key cannot be loaded (the message names both paths).
    """
    files = tls_files(config)
    if files is None:
        return None
    ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    try:
        ctx.load_cert_chain(files[0], files[1])
    except (OSError, ssl.SSLError) as exc:
        raise ConfigError(f"mqtt.tls_cert/mqtt.tls_key: cannot load {files[0]} / {files[1]} for HTTPS: {exc}") from None
    return ctx


def parse_basic(header: str | None) -> tuple[str, bytes] | None:
    """``(username, password)`` from an ``Authorization: Basic ...`` header, or None when absent or malformed."""
    if not header:
        return None
    scheme, _, token = header.strip().partition(" ")
    if scheme.lower() != "basic" or not token:
        return None
    try:
        raw = base64.b64decode(token.strip(), validate=True)
    except (binascii.Error, ValueError):
        return None
    user, sep, password = raw.partition(b":")
    if not sep:
        return None
    try:
        return user.decode("utf-8"), password
    except UnicodeDecodeError:
        return None


class HttpAuth:
    """Decides each HTTP request (see the module rules).

    Args:
        config: the loaded config (``users``, ``http.host``).

    Raises:
        ConfigError: a non-loopback HTTP listener without users, or a malformed password hash.
    """

    def __init__(self, config: Any) -> None:
        loopback = is_loopback_host(config.http.host)
        if not config.users and not loopback:
            raise ConfigError(
                f"refusing to start a non-loopback HTTP listener without configured users (http.host = "
                f"{config.http.host!r}): add an [users.<name>] table with role = \"admin\", listen on 127.0.0.1, "
                "or set http.port = 0")
        self.development = not config.users
        self._acl = None if self.development else AccessControl(mqtt_settings(config), listener_is_loopback=loopback)
        self._verifying: asyncio.Semaphore | None = None
        self.failures = 0

    def required(self, path: str) -> bool:
        """Whether ``path`` needs a login (everything but ``/metrics`` outside development mode)."""
        return not self.development and path != "/metrics"

    async def decide(self, authorization: str | None) -> Decision:
        """Check one request's ``Authorization`` header: 200 for an admin, 403 for another role, else 401."""
        assert self._acl is not None
        creds = parse_basic(authorization)
        if creds is None:
            if authorization:  # a malformed header is a failed attempt; no header is a browser's first try
                self.failures += 1
            return Decision(401)
        user, password = creds
        if self._verifying is None:
            self._verifying = asyncio.Semaphore(VERIFY_CONCURRENCY)
        async with self._verifying:
            acl = self._acl
            who = await asyncio.get_running_loop().run_in_executor(
                None, lambda: acl.authenticate(HTTP_CLIENT_ID, user, password))
        if not isinstance(who, Principal):
            self.failures += 1
            log.info("http login refused", user=user)
            return Decision(401, user)
        if who.role != "admin":
            log.info("http login without admin role", user=user, role=who.role)
            return Decision(403, user)
        return Decision(200, user)


def check_http_config(config: Any) -> None:
    """Stop start-up early (before Ray) on an HTTP setting that cannot work.

    Raises:
        ConfigError: see :class:`HttpAuth` and :func:`tls_context`.
    """
    if config.http.port:
        HttpAuth(config)
        tls_context(config)


__all__ = ["HttpAuth", "Decision", "ALLOWED", "tls_context", "tls_files", "parse_basic", "check_http_config", "REALM"]
