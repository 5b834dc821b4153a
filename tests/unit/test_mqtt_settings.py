"""``fanout.config.mqtt_settings``: the MQTT package's one settings object, built from the config."""
from __future__ import annotations

import dataclasses

import pytest

from fanout.config import SCHEMA, AclRule, ConfigError, UserConfig, load_config, mqtt_settings
from fanout.mqtt import settings as mqtt_settings_module
from fanout.mqtt.auth import AccessControl, hash_password
from fanout.mqtt.settings import MQTTSettings
from storage.keys import VIN_RE


def test_every_field_comes_from_the_config():
    cfg = load_config(None, env={"FANOUT_MQTT_CONNECT_TIMEOUT": "3s", "FANOUT_MQTT_MAX_PACKET_SIZE": "2KiB",
                                 "FANOUT_MQTT_OFFLINE_DROP": "newest", "FANOUT_MQTT_PORT": "0"})
    cfg = dataclasses.replace(cfg, users={"u": UserConfig("u", hash_password("pw", iterations=10), "client")},
                              acl=(AclRule("publish", "a/#", False),))
    s = mqtt_settings(cfg)
    assert s.connect_timeout_ms == 3000 and s.max_packet_size_bytes == 2048  # plain units
    assert s.offline_drop == "newest" and s.port == 0
    assert s.users == (cfg.users["u"],) and s.acl == cfg.acl
    assert s.vehicle_client_id is VIN_RE  # the one VIN rule, from storage.keys
    mqtt_attrs = {f.attr for f in SCHEMA["mqtt"].values()}
    for f in dataclasses.fields(MQTTSettings):
        if f.name not in ("vehicle_client_id", "users", "acl"):
            assert f.name in mqtt_attrs, f.name
            assert getattr(s, f.name) == getattr(cfg.mqtt, f.name), f.name


def test_settings_are_frozen_and_have_no_defaults():
    s = mqtt_settings(load_config(None, env={}))
    with pytest.raises(dataclasses.FrozenInstanceError):
        s.port = 1  # type: ignore[misc]
    assert all(f.default is dataclasses.MISSING for f in dataclasses.fields(MQTTSettings))
    hash(s)  # immutable all the way down (tuples, a compiled pattern)


def test_config_records_are_defined_once():
    import fanout.config

    assert fanout.config.ConfigError is mqtt_settings_module.ConfigError
    assert fanout.config.UserConfig is mqtt_settings_module.UserConfig
    assert fanout.config.AclRule is mqtt_settings_module.AclRule


def test_vehicle_rule_comes_from_the_settings():
    base = mqtt_settings(load_config(None, env={}).replace("mqtt", anonymous_role="vehicle"))
    assert AccessControl(base, listener_is_loopback=True).authenticate("WVW_1", None, None) != 5
    assert AccessControl(base, listener_is_loopback=True).authenticate("not/a/vin", None, None) == 5
    import re

    strict = dataclasses.replace(base, vehicle_client_id=re.compile(r"[A-HJ-NPR-Z0-9]{17}"))
    assert AccessControl(strict, listener_is_loopback=True).authenticate("WVW_1", None, None) == 5


def test_access_control_raises_the_config_error():
    s = mqtt_settings(load_config(None, env={}))
    with pytest.raises(ConfigError, match="non-loopback"):
        AccessControl(dataclasses.replace(s, host="0.0.0.0"), listener_is_loopback=False)
