"""Password hashes of ``[users.NAME]``: salted PBKDF2-HMAC-SHA256, ``pbkdf2_sha256$<iterations>$<salt>$<hash>``.

Strategy: ``fanout passwd`` makes them (:func:`hash_password`); every hash in the config is parsed when the
access control is built (:func:`check_password_hashes`), so a malformed one stops start-up naming the key;
:func:`verify_password` compares in constant time. The cost (600,000 iterations, ~0.2-0.3 s of CPU) is the
point; :mod:`fanout.mqtt.auth` caches successes and :mod:`fanout.mqtt.login_guard` bounds what failures cost.
"""
from __future__ import annotations

import base64
import hashlib
import hmac
import secrets
from typing import Mapping

from .settings import ConfigError, UserConfig

HASH_SCHEME = "pbkdf2_sha256"
DEFAULT_ITERATIONS = 600_000


def hash_password(password: str, *, iterations: int = DEFAULT_ITERATIONS) -> str:
    """Hash a password with PBKDF2-HMAC-SHA256 and a 16-byte random salt.

    Args:
        password: the plaintext password (encoded as UTF-8, as MQTT clients send it).
        iterations: PBKDF2 iteration count.

    Returns:
        ``pbkdf2_sha256$<iterations>$<salt b64>$<hash b64>``.

    Raises:
        ValueError: iterations < 1.
    """
    if iterations < 1:
        raise ValueError(f"iterations must be >= 1, got {iterations}")
    salt = secrets.token_bytes(16)
    dk = hashlib.pbkdf2_hmac("sha256", password.encode("utf-8"), salt, iterations)
    return f"{HASH_SCHEME}${iterations}${base64.b64encode(salt).decode()}${base64.b64encode(dk).decode()}"


def parse_password_hash(encoded: str) -> tuple[int, bytes, bytes]:
    """Split an encoded hash into (iterations, salt, derived key).

    Raises:
        ValueError: the encoding is malformed; the message says what is wrong.
    """
    parts = encoded.split("$")
    if len(parts) != 4 or parts[0] != HASH_SCHEME:
        raise ValueError(f"expected {HASH_SCHEME}$<iterations>$<salt>$<hash>")
    if not (parts[1].isascii() and parts[1].isdigit()) or int(parts[1]) < 1:
        raise ValueError(f"iterations must be a positive integer, got {parts[1]!r}")
    try:
        salt = base64.b64decode(parts[2], validate=True)
        dk = base64.b64decode(parts[3], validate=True)
    except ValueError:
        raise ValueError("salt and hash must be base64") from None
    if not salt or len(dk) < 16:
        raise ValueError("salt is empty or hash is shorter than 16 bytes")
    return int(parts[1]), salt, dk


def verify_password(password: bytes | str, encoded: str) -> bool:
    """Check a password against an encoded hash in constant time.

    Args:
        password: the password as received (bytes) or typed (str, encoded as UTF-8).
        encoded: a hash made by :func:`hash_password`.

    Returns:
        True when the password matches; False when it does not or the encoding is malformed
        (malformed hashes are reported at config load by :func:`check_password_hashes`).
    """
    try:
        iterations, salt, expected = parse_password_hash(encoded)
    except ValueError:
        return False
    pw = password.encode("utf-8") if isinstance(password, str) else password
    return hmac.compare_digest(hashlib.pbkdf2_hmac("sha256", pw, salt, iterations, len(expected)), expected)


def check_password_hashes(users: Mapping[str, UserConfig]) -> None:
    """Raise ConfigError naming the first user whose password_hash does not parse."""
    for name, user in users.items():
        try:
            parse_password_hash(user.password_hash)
        except ValueError as exc:
            raise ConfigError(f"users.{name}.password_hash: {exc} (create one with `fanout passwd`)") from None


def unmatchable_hash(iterations: int) -> str:
    """A well-formed hash of random bytes that no password matches (the dummy of unknown users)."""
    salt, dk = base64.b64encode(secrets.token_bytes(16)).decode(), base64.b64encode(secrets.token_bytes(32)).decode()
    return f"{HASH_SCHEME}${iterations}${salt}${dk}"


__all__ = ["hash_password", "parse_password_hash", "verify_password", "check_password_hashes", "unmatchable_hash",
           "HASH_SCHEME", "DEFAULT_ITERATIONS"]
