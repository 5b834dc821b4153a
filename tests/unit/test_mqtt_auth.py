"""Auth and ACL: password hashes, CONNECT authentication, role policies, [[acl]] rules, filter_covers."""
from __future__ import annotations

import io
import itertools
import sys
import threading
import tomllib

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from structlog.testing import capture_logs

from cluster.cli import main
from fanout.config import ConfigError, load_config, mqtt_settings
from fanout.mqtt.auth import AccessControl, Principal, filter_covers, hash_password, is_loopback_host, verify_password
from fanout.mqtt.topics import topic_matches

ITER = 1000  # fast hashes for tests; the default 600,000 is exercised by the CLI's default only
VIN = "WVWZZZ1JZXW000001"
OTHER = "WVWZZZ1JZXW000002"


def make_cfg(tmp_path, text: str = "", **mqtt):
    """The MQTT settings of a config file with ``text``, ``[mqtt]`` keys overridden by ``mqtt``."""
    path = tmp_path / "fanout.toml"
    path.write_text(text, encoding="utf-8")
    cfg = load_config(path, env={})
    return mqtt_settings(cfg.replace("mqtt", **mqtt) if mqtt else cfg)


def users_toml(**users: tuple[str, str]) -> str:
    return "".join(f'[users.{n}]\npassword_hash = "{hash_password(pw, iterations=ITER)}"\nrole = "{role}"\n' for n, (pw, role) in users.items())


@pytest.fixture
def acl(tmp_path):
    text = users_toml(alice=("alice-pw", "client"), car=("fleet-pw", "vehicle"), plat=("plat-pw", "platform"), root=("root-pw", "admin"))
    return AccessControl(make_cfg(tmp_path, text), listener_is_loopback=False)


# -- hashes ------------------------------------------------------------------------------------


def test_hash_round_trip_and_wrong_password():
    encoded = hash_password("s3cret é", iterations=ITER)
    scheme, iterations, salt, dk = encoded.split("$")
    assert (scheme, iterations) == ("pbkdf2_sha256", str(ITER))
    assert verify_password("s3cret é", encoded) and verify_password("s3cret é".encode(), encoded)
    assert not verify_password("s3cret e", encoded) and not verify_password(b"", encoded)
    assert hash_password("s3cret é", iterations=ITER) != encoded  # random salt


@pytest.mark.parametrize("bad", ["pbkdf2_sha256$", "pbkdf2_sha256$x$AA==$AA==", "pbkdf2_sha256$0$AAAA$" + "A" * 44, "pbkdf2_sha256$10$!!$AA==", "md5$1$a$b"])
def test_malformed_hash_verifies_false(bad):
    assert verify_password("pw", bad) is False


def test_malformed_hash_at_config_load_names_the_key(tmp_path):
    cfg = make_cfg(tmp_path, '[users.bob]\npassword_hash = "pbkdf2_sha256$many$salt$hash"\nrole = "client"\n')
    with pytest.raises(ConfigError, match=r"^users\.bob\.password_hash: iterations"):
        AccessControl(cfg, listener_is_loopback=True)


# -- listener and dev login ----------------------------------------------------------------------


def test_non_loopback_without_users_refuses(tmp_path):
    with pytest.raises(ConfigError, match="refusing to start a non-loopback listener without configured credentials"):
        AccessControl(make_cfg(tmp_path, host="0.0.0.0"), listener_is_loopback=False)


@pytest.mark.parametrize(("host", "loopback"), [("127.0.0.1", True), ("127.8.0.1", True), ("::1", True), ("localhost", True), ("0.0.0.0", False), ("10.0.0.5", False), ("example.org", False)])
def test_is_loopback_host(host, loopback):
    assert is_loopback_host(host) is loopback


def test_dev_platform_login_only_on_loopback_without_users(tmp_path):
    with capture_logs() as logs:
        ac = AccessControl(make_cfg(tmp_path), listener_is_loopback=True)
        assert ac.authenticate("p1", "platform", b"platform") == Principal("platform", "platform", "p1")
        assert ac.authenticate("p1", "platform", b"platform")  # still no second warning
    assert [e["log_level"] for e in logs if e["event"] == "dev platform login enabled"] == ["warning"]
    assert ac.authenticate("p1", "platform", b"wrong") == 4
    assert ac.authenticate("p1", "platform", None) == 4
    assert ac.authenticate("p1", "other", b"platform") == 4
    off = AccessControl(make_cfg(tmp_path, dev_platform_login=False), listener_is_loopback=True)
    assert off.authenticate("p1", "platform", b"platform") == 4
    with_users = AccessControl(make_cfg(tmp_path, users_toml(alice=("pw", "client"))), listener_is_loopback=True)
    assert with_users.authenticate("p1", "platform", b"platform") == 4
    remote = AccessControl(make_cfg(tmp_path, users_toml(alice=("pw", "client"))), listener_is_loopback=False)
    assert remote.authenticate("p1", "platform", b"platform") == 4


# -- authenticate --------------------------------------------------------------------------------


def test_authenticate_return_codes(acl):
    assert acl.authenticate("c1", "alice", b"alice-pw") == Principal("alice", "client", "c1")
    assert acl.authenticate("c1", "alice", b"nope") == 4
    assert acl.authenticate("c1", "alice", None) == 4
    assert acl.authenticate("c1", "mallory", b"alice-pw") == 4
    assert acl.authenticate("c1", None, b"alice-pw") == 4  # password without user name
    assert acl.authenticate("c1", None, None) == Principal(None, "client", "c1")  # default anonymous_role
    assert acl.authenticate(VIN, "car", b"fleet-pw") == Principal("car", "vehicle", VIN, True)
    for bad_vin in ("", "has space", "a/b", "+", "x" * 65):
        assert acl.authenticate(bad_vin, "car", b"fleet-pw") == 5


def test_anonymous_roles(tmp_path):
    assert AccessControl(make_cfg(tmp_path, anonymous_role="none"), listener_is_loopback=True).authenticate("c", None, None) == 5
    veh = AccessControl(make_cfg(tmp_path, anonymous_role="vehicle"), listener_is_loopback=True)
    assert veh.authenticate(VIN, None, None) == Principal(None, "vehicle", VIN, True)  # development mode
    assert veh.authenticate("not a vin", None, None) == 5


def test_verification_cache_serves_second_connect(acl):
    for _ in range(50):
        assert acl.authenticate(VIN, "car", b"fleet-pw") == Principal("car", "vehicle", VIN, True)
    assert acl.pbkdf2_calls == 1 and acl.auth_cache_hits == 49
    assert acl.authenticate(VIN, "car", b"fleet-pw2") == 4  # a different password is verified afresh
    assert acl.authenticate(VIN, "car", b"fleet-pw2") == 4  # the same bad one is not re-run
    assert acl.pbkdf2_calls == 2
    assert acl.authenticate("c", "alice", b"fleet-pw") == 4  # the key includes the user name
    assert acl.pbkdf2_calls == 3
    assert not any(b"fleet-pw" in k for k in acl._verified)  # digests, not plaintext


def test_verification_cache_is_bounded_lru(tmp_path):
    ac = AccessControl(make_cfg(tmp_path, users_toml(a=("pa", "client"), b=("pb", "client"), c=("pc", "client"))), listener_is_loopback=True, auth_cache_size=2)
    for user in ("a", "b", "a", "c", "a", "b"):
        assert isinstance(ac.authenticate("x", user, f"p{user}".encode()), Principal)
    assert len(ac._verified) == 2
    assert ac.pbkdf2_calls == 4  # a, b, c, then b again (evicted by c; a stayed as most recently used)


def test_concurrent_misses_share_one_pbkdf2_run(tmp_path):
    text = f'[users.car]\npassword_hash = "{hash_password("pw", iterations=200_000)}"\nrole = "vehicle"\n'
    ac = AccessControl(make_cfg(tmp_path, text), listener_is_loopback=False)
    barrier, results = threading.Barrier(8), []

    def connect(n: int) -> None:
        barrier.wait()
        results.append(ac.authenticate(f"VIN{n}", "car", b"pw"))

    threads = [threading.Thread(target=connect, args=(n,)) for n in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(r.client_id for r in results) == [f"VIN{n}" for n in range(8)]
    assert ac.pbkdf2_calls == 1


# -- built-in role policies ----------------------------------------------------------------------

PUBLISH = [
    # (role, client id, topic, allowed)
    ("admin", "adm", "$SYS/broker/uptime", True),
    ("admin", "adm", "$SDV-FANOUT/trigger", True),
    ("admin", "adm", "anything/at/all", True),
    ("platform", "plat", "$SDV-FANOUT/trigger", True),
    ("platform", "plat", "$SDV-FANOUT/data/d1", True),
    ("platform", "plat", "agent/X/proxy/request/r1", True),
    ("platform", "plat", "$SYS/broker/uptime", False),
    ("platform", "plat", "$SYS", False),
    ("client", "cli", "sensors/1", True),
    ("client", "cli", "$other/x", True),
    ("client", "cli", "$SDV-FANOUT/trigger", False),
    ("client", "cli", "$SDV-FANOUT", False),
    ("client", "cli", "$SYS/broker/uptime", False),
    ("vehicle", VIN, f"ecp/{VIN}/heartbeat", True),
    ("vehicle", VIN, f"ecp/{VIN}/online", True),
    ("vehicle", VIN, f"ecp/{OTHER}/heartbeat", False),
    ("vehicle", VIN, f"ecp/{VIN}", False),
    ("vehicle", VIN, f"agent/{VIN}/proxy/request/r1", False),
    ("vehicle", VIN, "sensors/1", False),
    ("vehicle", VIN, "$SDV-FANOUT/trigger", False),
    ("vehicle", VIN, "$SYS/x", False),
]

SUBSCRIBE = [
    ("admin", "adm", "#", True),
    ("admin", "adm", "$SYS/#", True),
    ("admin", "adm", "$SDV-FANOUT/#", True),
    ("platform", "plat", "#", True),
    ("platform", "plat", "$SYS/#", True),
    ("platform", "plat", "$SDV-FANOUT/errors/plat", True),
    ("platform", "plat", "$SDV-FANOUT/errors/other", False),
    ("platform", "plat", "$SDV-FANOUT/errors/+", False),
    ("platform", "plat", "$SDV-FANOUT/#", False),
    ("client", "cli", "a/+/c", True),
    ("client", "cli", "$SDV-FANOUT/errors/cli", True),
    ("client", "cli", "$SDV-FANOUT/trigger", False),
    ("client", "+", "$SDV-FANOUT/errors/+", False),  # a wildcard client id must not read everyone's errors
    ("client", "#", "$SDV-FANOUT/errors/#", False),
    ("vehicle", VIN, f"agent/{VIN}/#", True),
    ("vehicle", VIN, f"agent/{VIN}/proxy/request/+", True),
    ("vehicle", VIN, f"$SDV-FANOUT/errors/{VIN}", True),
    ("vehicle", VIN, f"agent/{OTHER}/#", False),
    ("vehicle", VIN, "agent/+/proxy/request/+", False),
    ("vehicle", VIN, "agent/#", False),
    ("vehicle", VIN, "#", False),
    ("vehicle", VIN, f"ecp/{VIN}/#", False),
    ("vehicle", VIN, "$SYS/#", False),
]


@pytest.mark.parametrize(("role", "cid", "topic", "allowed"), PUBLISH)
def test_builtin_publish(acl, role, cid, topic, allowed):
    p = Principal("u", role, cid, role == "vehicle")
    assert acl.can_publish(p, topic) is allowed
    assert acl.can_publish(p, topic) is allowed  # cached decision agrees


@pytest.mark.parametrize(("role", "cid", "topic_filter", "allowed"), SUBSCRIBE)
def test_builtin_subscribe(acl, role, cid, topic_filter, allowed):
    assert acl.can_subscribe(Principal("u", role, cid, role == "vehicle"), topic_filter) is allowed


# -- [[acl]] rules -------------------------------------------------------------------------------


def rules_toml(*rules: dict) -> str:
    def val(v):
        return ("true" if v else "false") if isinstance(v, bool) else f'"{v}"'

    return "".join("[[acl]]\n" + "".join(f"{k} = {val(v)}\n" for k, v in r.items()) for r in rules)


def test_issue_example_denies_subscribe(tmp_path):
    ac = AccessControl(make_cfg(tmp_path, rules_toml({"action": "subscribe", "topic": "test/nosubscribe", "allow": False})), listener_is_loopback=True)
    anon = ac.authenticate("c", None, None)
    assert ac.can_subscribe(anon, "test/nosubscribe") is False  # -> SUBACK 0x80
    assert ac.can_subscribe(anon, "test/other") is True
    assert ac.can_publish(anon, "test/nosubscribe") is True  # a subscribe rule does not touch publish


def test_first_matching_rule_wins_and_scoping(tmp_path):
    text = users_toml(alice=("pa", "client"), bob=("pb", "client")) + rules_toml(
        {"action": "publish", "topic": "secret/open", "allow": True},
        {"action": "publish", "topic": "secret/#", "allow": False},
        {"action": "publish", "topic": "secret/open", "allow": False},  # shadowed by the first rule
        {"action": "subscribe", "topic": "logs/#", "allow": True, "user": "alice"},
        {"action": "subscribe", "topic": "logs/#", "allow": False},
        {"action": "subscribe", "topic": "$SDV-FANOUT/#", "allow": True, "role": "client"},
        {"action": "publish", "topic": "$SYS/#", "allow": True, "role": "client"},
    )
    ac = AccessControl(make_cfg(tmp_path, text), listener_is_loopback=False)
    alice, bob = Principal("alice", "client", "a"), Principal("bob", "client", "b")
    plat = Principal(None, "platform", "p")
    assert ac.can_publish(alice, "secret/open") and not ac.can_publish(alice, "secret/x") and not ac.can_publish(alice, "secret")
    assert ac.can_subscribe(alice, "logs/#") and ac.can_subscribe(alice, "logs/a/+")
    assert not ac.can_subscribe(bob, "logs/#") and not ac.can_subscribe(bob, "logs")
    assert ac.can_subscribe(bob, "#")  # not covered by logs/#: the rule does not apply (filter-level ACL)
    assert ac.can_subscribe(bob, "$SDV-FANOUT/trigger") and not ac.can_subscribe(plat, "$SDV-FANOUT/trigger")
    assert not ac.can_publish(alice, "$SYS/broker/uptime")  # nobody but admin, whatever the rules say
    assert not ac.can_subscribe(Principal(None, "admin", "r"), "logs/x")  # rules apply to admin too


@pytest.mark.parametrize(("rule", "message"), [
    ({"action": "publish", "topic": "a/#/b", "allow": True}, r"^acl\[0\]\.topic: "),
    ({"action": "subscribe", "topic": "a+", "allow": True}, r"^acl\[0\]\.topic: "),
    ({"action": "subscribe", "topic": "a", "allow": True, "user": "ghost"}, r"^acl\[0\]\.user: "),
])
def test_bad_rules_stop_start_up(tmp_path, rule, message):
    with pytest.raises(ConfigError, match=message):
        AccessControl(make_cfg(tmp_path, rules_toml(rule)), listener_is_loopback=True)


# -- filter_covers -------------------------------------------------------------------------------


@pytest.mark.parametrize(("outer", "inner", "covers"), [
    ("a/b", "a/b", True), ("#", "#", True), ("+", "+", True),
    ("a/#", "a", True), ("a/#", "a/b/c", True), ("a/#", "a/+", True), ("a/#", "a/#", True),
    ("a/+", "a/b", True), ("a/+", "a/+", True), ("a/+", "a/#", False), ("a/+", "a", False),
    ("a/b", "a/+", False), ("a/b", "a/b/c", False), ("a/b/c", "a/b", False), ("a", "a/#", False),
    ("#", "a/+/c", True), ("#", "$SYS/x", False), ("+/x", "$SYS/x", False), ("+/#", "$SYS", False),
    ("$SYS/#", "$SYS/broker/+", True), ("$SYS/#", "#", False), ("#", "+/x", True), ("+/+", "+/#", False), ("+/#", "#", True), ("+/+/#", "#", False), ("/+/#", "/#", True), ("a/+/#", "a/#", False),
    ("+/#", "a", True), ("a/+/#", "a", False), ("a/+/#", "a/b", True), ("a/+", "a/", True), ("/+", "/", True),
])
def test_filter_covers_table(outer, inner, covers):
    assert filter_covers(outer, inner) is covers


LEVELS = ["a", "b", "", "$x"]
_level = st.sampled_from(LEVELS + ["+"])


@st.composite
def filters(draw) -> str:
    levels = draw(st.lists(_level, min_size=1, max_size=3))
    if draw(st.booleans()):
        levels = [*levels[:2], "#"]
    return "/".join(levels) or "a"


@st.composite
def topic_from(draw, f: str) -> str:
    """A topic that ``f`` should match (wildcards instantiated), sometimes not (random topic)."""
    if draw(st.integers(0, 4)) == 0:
        return "/".join(draw(st.lists(st.sampled_from(LEVELS + ["z", "$z"]), min_size=1, max_size=5))) or "z"
    out: list[str] = []
    for n, level in enumerate(f.split("/")):
        if level == "+":
            out.append(draw(st.sampled_from(["a", "z", ""] + ([] if n == 0 else ["$z"]))))
        elif level == "#":
            out.extend(draw(st.lists(st.sampled_from(["a", "z", ""]), min_size=0 if n else 1, max_size=3)))
        else:
            out.append(level)
    return "/".join(out)


@settings(max_examples=400, deadline=None)
@given(st.data(), filters(), filters())
def test_filter_covers_is_sound(data, outer, inner):
    if filter_covers(outer, inner):
        for _ in range(10):
            t = data.draw(topic_from(inner))
            if t and topic_matches(inner, t):  # "" is no topic (a "/#" parent)
                assert topic_matches(outer, t), (outer, inner, t)


def test_filter_covers_is_exact_on_a_small_universe():
    levels = [*LEVELS, "z", "$z"]
    topics = [t for n in range(1, 5) for t in map("/".join, itertools.product(levels, repeat=n)) if t]
    fs = ["/".join(p) for n in range(1, 4) for p in itertools.product([*LEVELS, "+"], repeat=n)]
    fs = [f for f in fs if f] + [f + "/#" for f in fs if f.count("/") < 2] + ["#"]
    matched = {f: frozenset(t for t in topics if topic_matches(f, t)) for f in fs}
    for outer, inner in itertools.product(fs, fs):
        assert filter_covers(outer, inner) is (matched[inner] <= matched[outer]), (outer, inner)


# -- fanout passwd -------------------------------------------------------------------------------


@pytest.fixture
def cli(monkeypatch):
    """cluster.cli.main without fanout.log.configure: that binds this test's captured sys.stderr into the
    process-wide structlog config, and later tests would log into a closed file."""
    monkeypatch.setattr("fanout.log.configure", lambda **kwargs: None)
    return main


def test_passwd_cli_from_stdin(cli, monkeypatch, capsys):
    monkeypatch.setattr(sys, "stdin", io.StringIO("hunter2\n"))
    assert cli(["passwd", "--iterations", str(ITER)]) == 0
    encoded = capsys.readouterr().out.strip()
    assert verify_password("hunter2", encoded) and not verify_password("hunter2\n", encoded)


def test_passwd_cli_prints_users_table(cli, monkeypatch, capsys, tmp_path):
    monkeypatch.setattr(sys, "stdin", io.StringIO("fleet pw\n"))
    assert cli(["passwd", "--iterations", str(ITER), "car"]) == 0
    snippet = capsys.readouterr().out
    assert tomllib.loads(snippet)["users"]["car"]["role"] == "client"
    ac = AccessControl(make_cfg(tmp_path, snippet), listener_is_loopback=False)
    assert ac.authenticate("c", "car", b"fleet pw") == Principal("car", "client", "c")


def test_passwd_cli_rejects_empty_password(cli, monkeypatch, capsys):
    monkeypatch.setattr(sys, "stdin", io.StringIO(""))
    assert cli(["passwd", "--iterations", str(ITER)]) == 1
    assert "empty password" in capsys.readouterr().err


class _Tty(io.StringIO):
    def isatty(self) -> bool:
        return True


@pytest.mark.parametrize(("typed", "code"), [(["pw1", "pw1"], 0), (["pw1", "pw2"], 1)])
def test_passwd_cli_on_a_terminal_asks_twice(cli, monkeypatch, capsys, typed, code):
    answers = iter(typed)
    monkeypatch.setattr(sys, "stdin", _Tty())
    monkeypatch.setattr("getpass.getpass", lambda prompt="": next(answers))
    assert cli(["passwd", "--iterations", str(ITER)]) == code
    out, err = capsys.readouterr()
    assert verify_password("pw1", out.strip()) if code == 0 else "do not match" in err
