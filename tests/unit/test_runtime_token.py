"""cluster.runtime.use_private_token: an embedded Ray gets its own token file per data directory."""
from __future__ import annotations

import os
import stat

from cluster.runtime import TOKEN_FILE, find_address, use_private_token


def _clean_env(monkeypatch):
    for var in ("RAY_AUTH_TOKEN", "RAY_AUTH_TOKEN_PATH", "RAY_AUTH_MODE"):
        monkeypatch.delenv(var, raising=False)


def test_creates_a_private_token_once_and_reuses_it(tmp_path, monkeypatch):
    _clean_env(monkeypatch)
    path = use_private_token(tmp_path / "var")
    assert path == (tmp_path / "var" / TOKEN_FILE).resolve()
    token = path.read_text()
    assert len(token) == 64 and int(token, 16) >= 0
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert os.environ["RAY_AUTH_TOKEN"] == token and os.environ["RAY_AUTH_MODE"] == "token"
    monkeypatch.delenv("RAY_AUTH_TOKEN")
    assert use_private_token(tmp_path / "var").read_text() == token  # a restart keeps the token


def test_leaves_an_operator_choice_alone(tmp_path, monkeypatch):
    _clean_env(monkeypatch)
    monkeypatch.setenv("RAY_AUTH_MODE", "disabled")
    assert use_private_token(tmp_path) is None
    monkeypatch.setenv("RAY_AUTH_MODE", "token")
    monkeypatch.setenv("RAY_AUTH_TOKEN", "x" * 64)
    assert use_private_token(tmp_path) is None
    assert not (tmp_path / TOKEN_FILE).exists()


def test_status_side_adopts_the_token_path(tmp_path, monkeypatch):
    _clean_env(monkeypatch)
    token_file = tmp_path / TOKEN_FILE
    token_file.write_text("ab" * 32)
    (tmp_path / "ray_address").write_text(f"127.0.0.1:6379\nauth_mode=token\nauth_token_path={token_file}\n")
    assert find_address(tmp_path, None) == "127.0.0.1:6379"
    assert os.environ["RAY_AUTH_MODE"] == "token"
    assert os.environ["RAY_AUTH_TOKEN"] == "ab" * 32
