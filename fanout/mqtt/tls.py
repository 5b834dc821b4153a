"""TLS for the MQTT listeners: the extra listeners' settings, the server SSLContext, reload, client identity.

Strategy:

- One :class:`ServerTLS` per node builds ``ssl.SSLContext`` objects from PEM files: TLS 1.2 or newer
  (``minimum_version``), the server chain from ``mqtt.tls_cert``/``mqtt.tls_key``, and, unless
  ``mqtt.tls_client_auth = "none"``, client certificates verified against ``mqtt.tls_ca``
  (``optional``: a client may present none, but one it presents must verify; ``required``: the handshake
  fails without one). A certificate that does not chain to the CA, or has expired, fails the handshake:
  the broker core never sees that connection.
- Reload without dropping connections: the listening socket keeps the context it was created with (asyncio
  and uvloop capture it when they start serving), so that *listener* context carries an ``sni_callback``
  that switches each new handshake to the newest context (``SSLObject.context = ...``, the documented way
  to choose a certificate per handshake; OpenSSL calls it for every ClientHello, with or without SNI).
  :meth:`ServerTLS.reload` builds a new context from the files and swaps it in; a file that no longer
  loads keeps the previous context (logged), so a botched renewal never takes the listener down.
  Established connections keep the session they negotiated.
- Identity: :func:`verified_cn` reads the subject CN of the peer certificate from the ``SSLObject``;
  ``getpeercert()`` returns a certificate only when the chain was verified, so an unverified (``none``)
  listener yields None whatever the client sent.
"""
from __future__ import annotations

import os
import ssl
from dataclasses import dataclass
from typing import Any

import structlog

from .settings import ConfigError

log = structlog.get_logger(__name__)

CLIENT_AUTH = ("none", "optional", "required")
_VERIFY_MODE = {"none": ssl.CERT_NONE, "optional": ssl.CERT_OPTIONAL, "required": ssl.CERT_REQUIRED}


@dataclass(frozen=True, slots=True, kw_only=True)
class TLSSettings:
    """The certificate files of the TLS listeners (``mqtt.tls_*``).

    Attributes:
        cert_file: PEM server certificate chain (``mqtt.tls_cert``).
        key_file: PEM private key (``mqtt.tls_key``).
        ca_file: PEM CA bundle client certificates must chain to (``mqtt.tls_ca``), or None.
        client_auth: ``none``, ``optional`` or ``required`` (``mqtt.tls_client_auth``).
    """

    cert_file: str
    key_file: str
    ca_file: str | None = None
    client_auth: str = "none"


@dataclass(frozen=True, slots=True, kw_only=True)
class ListenerSettings:
    """The optional listeners of a node besides plain MQTT; a port of 0 means that listener is off.

    Attributes:
        tls_port: MQTT over TLS (``mqtts://``).
        ws_port: MQTT over WebSocket (``ws://H:P/mqtt``).
        wss_port: MQTT over WebSocket over TLS (``wss://H:P/mqtt``).
        tls: certificates for ``tls_port`` and ``wss_port`` (required when either is on).
        max_tls_handshakes: handshakes in progress at once on ``tls_port`` and ``wss_port`` together
            (``mqtt.max_tls_handshakes``, :mod:`fanout.mqtt.tls_handshakes`).
    """

    tls_port: int = 0
    ws_port: int = 0
    wss_port: int = 0
    tls: TLSSettings | None = None
    max_tls_handshakes: int = 1024

    def __post_init__(self) -> None:
        for key in ("tls_port", "wss_port"):
            if getattr(self, key) and self.tls is None:
                raise ConfigError(f"mqtt.{key}: set, but mqtt.tls_cert and mqtt.tls_key are not")

    @property
    def enabled(self) -> bool:
        return bool(self.tls_port or self.ws_port or self.wss_port)


def check_tls_settings(tls: TLSSettings) -> None:
    """Raise ConfigError naming the key of a missing or unreadable file, or an inconsistent choice."""
    for key, path in (("tls_cert", tls.cert_file), ("tls_key", tls.key_file), ("tls_ca", tls.ca_file)):
        if path is None:
            continue
        if not os.path.isfile(path):
            raise ConfigError(f"mqtt.{key}: file {path!r} does not exist")
        if not os.access(path, os.R_OK):
            raise ConfigError(f"mqtt.{key}: file {path!r} is not readable")
    if tls.client_auth not in CLIENT_AUTH:
        raise ConfigError(f"mqtt.tls_client_auth: must be one of {', '.join(CLIENT_AUTH)}, got {tls.client_auth!r}")
    if tls.client_auth != "none" and not tls.ca_file:
        raise ConfigError(f"mqtt.tls_ca: required when mqtt.tls_client_auth is {tls.client_auth!r}")


def build_context(tls: TLSSettings) -> ssl.SSLContext:
    """A server SSLContext from the PEM files (TLS 1.2+, client verification per ``client_auth``).

    Raises:
        ConfigError: naming the key whose file is missing or does not load.
    """
    check_tls_settings(tls)
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    try:
        ctx.load_cert_chain(tls.cert_file, tls.key_file)
    except (ssl.SSLError, OSError) as exc:
        raise ConfigError(f"mqtt.tls_cert/mqtt.tls_key: cannot load {tls.cert_file!r} with {tls.key_file!r}: {exc}") from None
    if tls.ca_file:
        try:
            ctx.load_verify_locations(cafile=tls.ca_file)
        except (ssl.SSLError, OSError) as exc:
            raise ConfigError(f"mqtt.tls_ca: cannot load {tls.ca_file!r}: {exc}") from None
    ctx.verify_mode = _VERIFY_MODE[tls.client_auth]
    return ctx


class ServerTLS:
    """The TLS contexts of one node's listeners, reloadable.

    Args:
        settings: the certificate files.

    Raises:
        ConfigError: the files do not load (at construction only; :meth:`reload` keeps the old context).
    """

    __slots__ = ("settings", "listener_context", "_current", "reloads")

    def __init__(self, settings: TLSSettings) -> None:
        self.settings = settings
        self.listener_context = build_context(settings)
        self.listener_context.sni_callback = self._choose_context
        self._current = self.listener_context
        self.reloads = 0

    def _choose_context(self, ssl_object: Any, server_name: str | None, _ctx: ssl.SSLContext) -> None:
        current = self._current
        if current is not self.listener_context:
            ssl_object.context = current
        return None

    def reload(self) -> bool:
        """Load the files again; new handshakes use them, open connections are untouched.

        Returns:
            True when the new certificates are in use, False when they failed to load (the previous ones
            stay in use; the error is logged).
        """
        try:
            ctx = build_context(self.settings)
        except ConfigError as exc:
            log.error("tls reload failed, keeping the previous certificates", error=str(exc))
            return False
        self._current = ctx
        self.reloads += 1
        log.info("tls certificates reloaded", cert=self.settings.cert_file, ca=self.settings.ca_file,
                 reloads=self.reloads)
        return True


def verified_cn(ssl_object: Any) -> str | None:
    """The subject CN of the peer certificate if its chain was verified, else None.

    ``getpeercert()`` returns ``{}`` for a certificate that was not validated (``CERT_NONE``) and None
    without one, so only a verified certificate yields a name.
    """
    if ssl_object is None:
        return None
    cert = ssl_object.getpeercert()
    if not cert:
        return None
    for rdn in cert.get("subject", ()):
        for key, value in rdn:
            if key == "commonName":
                return str(value)
    return None


__all__ = ["TLSSettings", "ListenerSettings", "ServerTLS", "build_context", "check_tls_settings",
           "verified_cn", "CLIENT_AUTH"]
