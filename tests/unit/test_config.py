"""Config loading: defaults, units, env overrides, and errors that name the bad key."""
from __future__ import annotations

import pytest

from fanout.config import ConfigError, load_config
from fanout.units import UnitError, format_duration_ms, parse_duration_ms, parse_size_bytes


@pytest.mark.parametrize(
    ("text", "ms"),
    [("20s", 20_000), ("1h", 3_600_000), ("7d", 604_800_000), ("250ms", 250), ("1.5s", 1500), (3, 3000), ("2m", 120_000)],
)
def test_durations(text, ms):
    assert parse_duration_ms(text) == ms


@pytest.mark.parametrize(("text", "n"), [("1MiB", 1 << 20), ("64KiB", 65536), ("1GB", 10**9), (512, 512), ("10 b", 10)])
def test_sizes(text, n):
    assert parse_size_bytes(text) == n


@pytest.mark.parametrize("bad", ["", "ten", "5 parsecs", "-1s", True, [1]])
def test_bad_durations(bad):
    with pytest.raises(UnitError):
        parse_duration_ms(bad)


def test_format_round_trip():
    for text in ("7d", "1h", "20s", "250ms"):
        assert format_duration_ms(parse_duration_ms(text)) == text


def test_defaults():
    cfg = load_config(env={})
    assert cfg.mqtt.host == "127.0.0.1" and cfg.mqtt.port == 1883
    assert cfg.mqtt.max_packet_size_bytes == 1 << 20
    assert cfg.mqtt.sys_interval_ms == 10_000
    assert cfg.fanout.data_retention_ms == 7 * 86_400_000
    assert cfg.fanout.max_batch == 1_000_000
    assert cfg.users == {} and cfg.acl == ()


def test_file_env_and_overrides(tmp_path):
    p = tmp_path / "fanout.toml"
    p.write_text(
        '[mqtt]\nport = 1999\nsys_interval = "1s"\n[fanout]\ntopic_prefix = "car/{VIN}/req"\n'
        '[users.plat]\npassword_hash = "pbkdf2_sha256$1$aa$bb"\nrole = "platform"\n'
        '[[acl]]\naction = "subscribe"\ntopic = "test/nosubscribe"\nallow = false\n'
    )
    cfg = load_config(p, env={"FANOUT_MQTT_PORT": "2001"}, overrides={"mqtt": {"host": "127.0.0.2"}})
    assert cfg.mqtt.port == 2001  # env beats file
    assert cfg.mqtt.host == "127.0.0.2"
    assert cfg.mqtt.sys_interval_ms == 1000
    assert cfg.fanout.topic_prefix == "car/{VIN}/req"
    assert cfg.users["plat"].role == "platform"
    assert cfg.acl[0].action == "subscribe" and cfg.acl[0].allow is False
    shown = cfg.to_toml_dict()
    assert shown["mqtt"]["sys_interval"] == "1s" and shown["users"]["plat"]["password_hash"] == "***"


@pytest.mark.parametrize(
    ("toml", "env", "needle"),
    [
        ("[mqtt]\nprot = 1\n", {}, "mqtt.prot: unknown key"),
        ("[mqqt]\n", {}, "mqqt: unknown section"),
        ("[mqtt]\nport = 70000\n", {}, "mqtt.port: must be <= 65535"),
        ("", {"FANOUT_MQTT_PORT": "abc"}, "mqtt.port"),
        ('[mqtt]\nsys_interval = "10 fortnights"\n', {}, "mqtt.sys_interval"),
        ('[fanout]\ntopic_prefix = "agent/x"\n', {}, "fanout.topic_prefix: must contain"),
        ('[mqtt]\nanonymous_role = "root"\n', {}, "mqtt.anonymous_role"),
        ('[users.a]\nrole = "platform"\n', {}, "users.a.password_hash: missing"),
        ('[users.a]\npassword_hash = "plain"\n', {}, "users.a.password_hash"),
        ('[[acl]]\naction = "read"\ntopic = "a"\nallow = true\n', {}, "acl[0].action"),
        ('[[acl]]\naction = "publish"\nallow = true\n', {}, "acl[0].topic: missing"),
        ("[mqtt\n", {}, "not valid TOML"),
    ],
)
def test_errors_name_the_key(tmp_path, toml, env, needle):
    p = tmp_path / "bad.toml"
    p.write_text(toml)
    with pytest.raises(ConfigError) as err:
        load_config(p, env=env)
    assert needle in str(err.value)


def test_missing_file(tmp_path):
    with pytest.raises(ConfigError, match="does not exist"):
        load_config(tmp_path / "nope.toml")
