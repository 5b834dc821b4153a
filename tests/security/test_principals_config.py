"""cluster/fanout.toml, the production example: it loads, and the principals it defines are the documented ones
(no anonymous access, vehicles by certificate only, platform and ops by certificate CN)."""
from __future__ import annotations

from pathlib import Path

import pytest

from fanout.config import load_config, mqtt_settings
from fanout.mqtt.auth import AccessControl

EXAMPLE = Path(__file__).resolve().parents[2] / "cluster" / "fanout.toml"
VIN = "WVWZZZ1JZ3W386752"


@pytest.fixture(scope="module")
def acl() -> AccessControl:
    cfg = load_config(EXAMPLE, env={})
    assert cfg.mqtt.anonymous_role == "none" and cfg.mqtt.tls_client_auth == "required" and cfg.mqtt.tls_port
    assert not [u for u in cfg.users.values() if u.role == "vehicle"]  # no shared fleet password
    return AccessControl(mqtt_settings(cfg), listener_is_loopback=False)


def test_no_anonymous_and_no_password_anyone_knows(acl):
    assert acl.authenticate(VIN, None, None) == 5
    assert acl.authenticate("p", "platform", b"platform") == 4
    assert not acl.dev_mode


def test_certificates_are_the_principals(acl):
    car = acl.authenticate(VIN, None, None, cert_cn=VIN)
    assert car.vehicle and car.role == "vehicle"
    assert acl.authenticate("WVWZZZ1JZ3W000000", None, None, cert_cn=VIN) == 5  # its certificate, another VIN
    assert acl.authenticate("platform-1", None, None, cert_cn="platform").role == "platform"
    assert acl.authenticate("ops-1", None, None, cert_cn="ops").role == "admin"
