"""The compiled hot path (fanout/native.py, scripts/build_native.py): when it is used, when it must not be (stale
or disabled), and that the Python sources it replaces still pass the broker's, node's and dispatcher's tests."""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from fanout import native

ROOT = native.PROJECT


def _package_copy(tmp_path: Path, *, built: bool, name: str = "project") -> Path:
    """The compiled modules' sources in a tree of their own, with a digest as a build leaves it."""
    pkg = tmp_path / name
    for module in native.COMPILED:
        dest = native.source_path(module, pkg)
        dest.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(native.source_path(module), dest)
    if built:
        native.tree(pkg).mkdir()
        (native.tree(pkg) / native.DIGEST_FILE).write_text(native.sources_digest(pkg) + "\n")
    return pkg


def test_compiled_modules_are_used_when_they_match_their_sources(tmp_path: Path) -> None:
    pkg = _package_copy(tmp_path, built=True)
    assert native.choose(pkg, {}) == ("compiled", native.tree(pkg))


def test_an_edited_source_makes_the_compiled_modules_stale(tmp_path: Path) -> None:
    pkg = _package_copy(tmp_path, built=True)
    with native.source_path("storage.row_outcomes", pkg).open("a") as f:
        f.write("\n# edited after the build\n")
    assert native.choose(pkg, {}) == ("stale", None)  # the edit runs, not the old machine code


def test_nothing_built_and_disabled(tmp_path: Path) -> None:
    assert native.choose(_package_copy(tmp_path, built=False), {}) == ("absent", None)
    built = _package_copy(tmp_path, built=True, name="built")
    for off in ("0", "false", "NO", " off "):
        assert native.choose(built, {native.ENV: off}) == ("disabled", None)
        assert native.choose(built, {native.OLD_ENV: off}) == ("disabled", None)  # the name of stop 30
    assert native.choose(built, {native.ENV: "1"})[0] == "compiled"


def test_the_digest_covers_every_compiled_module(tmp_path: Path) -> None:
    pkg = _package_copy(tmp_path, built=False)
    digests = {native.sources_digest(pkg)}
    for name in native.COMPILED:
        native.source_path(name, pkg).write_bytes(native.source_path(name).read_bytes() + b" ")
        digests.add(native.sources_digest(pkg))
        shutil.copy(native.source_path(name), native.source_path(name, pkg))
    assert len(digests) == 1 + len(native.COMPILED)


@pytest.mark.skipif(not os.environ.get("FANOUT_EXPECT_NATIVE"),
                    reason="run by `make test`, which builds the compiled modules first (FANOUT_EXPECT_NATIVE=1)")
def test_the_hot_path_runs_compiled_after_make() -> None:
    assert native.STATUS == "compiled", f"fanout runs its Python sources ({native.STATUS}): see `make native`"
    assert native.running_compiled() == list(native.COMPILED)


def test_the_python_sources_pass_the_hot_path_tests() -> None:
    """What runs without a C compiler, or with FANOUT_NATIVE=0, is the same code: the codec, broker, node,
    dispatcher and store tests in a process that imports the Python sources."""
    env = dict(os.environ, **{native.ENV: "0"})
    check = ("from fanout import native; assert native.STATUS == 'disabled', native.STATUS; "
             "assert native.running_compiled() == [], native.running_compiled()")
    subprocess.run([sys.executable, "-c", check], cwd=ROOT, env=env, check=True, timeout=60)
    tests = ["tests/unit/test_codec.py", "tests/unit/test_mqtt_broker.py", "tests/unit/test_mqtt_session.py",
             "tests/unit/test_mqtt_no_io.py", "tests/unit/test_mqtt5_fastpaths.py", "tests/unit/test_trie.py",
             "tests/unit/test_topics.py", "tests/unit/test_mqtt_bounds.py", "tests/unit/test_node_core.py",
             "tests/unit/test_dispatch_machine.py", "tests/unit/test_dispatcher_core.py",
             "tests/unit/test_storage_shard.py", "tests/unit/test_receipts.py", "tests/unit/test_request_stats.py",
             "tests/unit/test_storage_props.py", "tests/unit/test_topics_appends.py",
             "tests/unit/test_topics_matcher.py", "tests/unit/test_topics_records.py", "tests/unit/test_mqtt_events.py"]
    out = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-x", *tests], cwd=ROOT,
                         env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-2000:]
    assert " passed" in out.stdout


def test_encoding_and_decoding_leave_no_objects_behind() -> None:
    """Compiled code frees what it allocates: mypyc 1.x leaked the left operand of every compiled ``bytes + bytes``
    (mypyc#1192), 10 objects per client id in the churn soak test. Here: 20,000 rounds of the packets a vehicle's
    connect and delivery make, encoded and decoded."""
    import gc

    from fanout.mqtt.codec import PacketReader, encode
    from fanout.mqtt.encoder import encode_suback
    from fanout.mqtt.packets import Connect, Puback, Publish, Subscribe

    def rounds(n: int) -> None:
        reader = PacketReader()
        for i in range(n):
            cid, pid = f"V{i % 100:07d}", 1 + i % 100  # the decoder keeps one PUBACK per packet id it has seen
            data = (encode(Connect(cid, True, 60, None, None, None))
                    + encode(Subscribe(pid, ((f"agent/{cid}/proxy/request/+", 1),)))
                    + encode(Publish(f"agent/{cid}/proxy/request/r", b"x" * 64, 1, False, False, pid))
                    + encode(Puback(pid)) + encode_suback(pid, (1,)))
            assert len(reader.feed(data)) == 5

    rounds(1_000)  # first-use allocations
    gc.collect()
    before = sys.getallocatedblocks()
    rounds(20_000)
    gc.collect()
    grown = sys.getallocatedblocks() - before
    assert grown < 1_000, f"{grown} blocks more after 20,000 rounds ({native.STATUS})"
