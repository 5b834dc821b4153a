"""``[[topics]]`` tables: valid ones become TopicSpecs, every bad value stops start-up naming its key."""
from __future__ import annotations

import pytest

from fanout.config import ConfigError, load_config


def _load(tmp_path, text: str):
    p = tmp_path / "fanout.toml"
    p.write_text(text)
    return load_config(p, env={})


def test_topics_become_specs_with_defaults(tmp_path):
    cfg = _load(tmp_path, '''
[[topics]]
name = "responses"
filter = "ecp/+/response"

[[topics]]
name = "telemetry.raw"
filter = "telemetry/#"
partitions = 8
retention = "1h"
retention_bytes = "10MiB"
key_level = 0
''')
    a, b = cfg.topics
    assert (a.name, a.filter, a.partitions, a.retention_ms, a.retention_bytes, a.key_level) == (
        "responses", "ecp/+/response", 0, 7 * 86_400_000, 1 << 30, 1)
    assert (b.partitions, b.retention_ms, b.retention_bytes, b.key_level) == (8, 3_600_000, 10 << 20, 0)
    shown = cfg.to_toml_dict()["topics"]
    assert shown[0] == {"name": "responses", "filter": "ecp/+/response", "partitions": 0, "retention": "7d",
                        "retention_bytes": "1GiB", "key_level": 1}
    # a filter without '+' keys by the publishing client id
    cfg = _load(tmp_path, '[[topics]]\nname = "t"\nfilter = "plant/line1"\n')
    assert cfg.topics[0].key_level is None
    assert load_config(None, env={}).topics == ()


def test_receipts_only_takes_its_retention(tmp_path):
    cfg = _load(tmp_path, '[[topics]]\nname = "receipts"\nretention = "2d"\nretention_bytes = "5MiB"\n')
    assert cfg.topics == ()
    assert cfg.builtin_topics == {"receipts": (2 * 86_400_000, 5 << 20)}
    with pytest.raises(ConfigError, match=r"^topics\[0\]\.filter: the built-in 'receipts'"):
        _load(tmp_path, '[[topics]]\nname = "receipts"\nfilter = "x/#"\n')


@pytest.mark.parametrize(("tables", "needle"), [
    ('name = "a b"\nfilter = "x"', r"topics\[0\]\.name: must match"),
    ('name = "' + "n" * 65 + '"\nfilter = "x"', r"topics\[0\]\.name: must match"),
    ('filter = "x"', r"topics\[0\]\.name: missing"),
    ('name = "a"', r"topics\[0\]\.filter: missing"),
    ('name = "a"\nfilter = "a/#/b"', r"topics\[0\]\.filter: .*'#'"),
    ('name = "a"\nfilter = "a/b+"', r"topics\[0\]\.filter: .*'\+'"),
    ('name = "a"\nfilter = "$share/g/ecp/#"', r"topics\[0\]\.filter: .*shared subscription"),
    ('name = "a"\nfilter = "$SDV-FANOUT/trigger"', r"topics\[0\]\.filter: .*\$SDV-FANOUT/ topics"),
    ('name = "a"\nfilter = "$SYS/#"', r"topics\[0\]\.filter: .*\$SYS/ topics"),
    ('name = "a"\nfilter = "x"\npartitions = -1', r"topics\[0\]\.partitions: must be 0"),
    ('name = "a"\nfilter = "x"\npartitions = "many"', r"topics\[0\]\.partitions: expected an integer"),
    ('name = "a"\nfilter = "x"\nretention = "forever"', r"topics\[0\]\.retention: "),
    ('name = "a"\nfilter = "x"\nretention_bytes = "12"', r"topics\[0\]\.retention_bytes: must be at least 1KiB"),
    ('name = "a"\nfilter = "x/+"\nkey_level = 2', r"topics\[0\]\.key_level: must name a level"),
    ('name = "a"\nfilter = "x/#"\nkey_level = 1', r"topics\[0\]\.key_level: must name a level"),
    ('name = "a"\nfilter = "x"\ncolour = "red"', r"topics\[0\]\.colour: unknown key"),
])
def test_errors_name_the_key(tmp_path, tables, needle):
    with pytest.raises(ConfigError, match=needle):
        _load(tmp_path, "[[topics]]\n" + tables + "\n")


def test_duplicates_name_the_second_table(tmp_path):
    with pytest.raises(ConfigError, match=r"^topics\[1\]\.name: 'a' is also topics\[0\]"):
        _load(tmp_path, '[[topics]]\nname = "a"\nfilter = "x"\n[[topics]]\nname = "a"\nfilter = "y"\n')
    with pytest.raises(ConfigError, match=r"^topics\[1\]\.filter: 'x/\+' is also the filter of topics\[0\]"):
        _load(tmp_path, '[[topics]]\nname = "a"\nfilter = "x/+"\n[[topics]]\nname = "b"\nfilter = "x/+"\n')
    with pytest.raises(ConfigError, match=r"^topics: must be an array"):
        _load(tmp_path, '[topics]\nname = "a"\n')


def test_config_show_renders_topics_as_toml_that_loads_again(tmp_path):
    from fanout.cli.config_cmd import render_toml

    cfg = _load(tmp_path, '[[topics]]\nname = "r"\nfilter = "ecp/+/response"\n'
                          '[[topics]]\nname = "receipts"\nretention = "30d"\n')
    text = render_toml(cfg.to_toml_dict())
    assert '[[topics]]\nname = "r"\nfilter = "ecp/+/response"' in text
    again = _load(tmp_path, text.replace('password_hash = "***"', ""))
    assert again.topics == cfg.topics and again.builtin_topics == cfg.builtin_topics
    assert "[[topics]]" not in render_toml(load_config(None, env={}).to_toml_dict())
