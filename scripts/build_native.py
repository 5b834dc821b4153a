"""``make native``: compile the hot-path modules with mypyc into ``fanout/_compiled/``.

    python -m scripts.build_native [--force] [--check]

Nothing happens when the compiled modules match their sources (:func:`fanout.native.sources_digest`).
Otherwise mypy type-checks the modules and mypyc generates C under ``build/native/``, the system compiler
builds it (setuptools' ``build_ext``), and ``fanout/_compiled/`` is replaced whole: the new directory is
filled, its digest written last, then renamed into place. A failed build removes the old compiled modules
(the package then runs its Python sources, which is always correct), prints mypy's or the compiler's message
and exits 1. ``--check`` builds nothing: exit 0 when up to date, 1 when not. ``--force`` builds even when up
to date. Which modules and why: :mod:`fanout.native`.
"""
from __future__ import annotations

import argparse
import os
import shutil
import sys
import time
from pathlib import Path

from fanout import native

ROOT = Path(__file__).resolve().parents[1]
WORK = ROOT / "build" / "native"  # generated C, objects, mypy's cache (git-ignored)


def up_to_date() -> bool:
    """Whether ``fanout/_compiled/`` holds the compiled form of the current sources."""
    return native.choose(native.PROJECT, {})[0] == "compiled"


def build() -> Path:
    """Compile the modules of ``native.COMPILED``; return the directory now holding them."""
    from mypyc.build import mypycify  # mypy, from the project's ``native`` extra
    from setuptools import Distribution

    digest = native.sources_digest()  # of the sources as they are when the build starts
    paths = [str(native.source_path(name).relative_to(ROOT)) for name in native.COMPILED]
    tops = sorted({name.partition(".")[0] for name in native.COMPILED})  # fanout, storage
    cwd = os.getcwd()
    os.chdir(ROOT)  # mypy names the modules from the paths
    try:
        extensions = mypycify(["--cache-dir", str(WORK / "mypy_cache"), "--follow-imports=silent", *paths],
                              opt_level="3", separate=[(paths, native.GROUP)], target_dir=str(WORK / "c"))
        lib = WORK / "lib"
        shutil.rmtree(lib, ignore_errors=True)
        dist = Distribution({"name": "sdv-fanout-native", "ext_modules": extensions})
        cmd = dist.get_command_obj("build_ext")
        cmd.build_lib, cmd.build_temp = str(lib), str(WORK / "temp")
        dist.run_command("build_ext")
    finally:
        os.chdir(cwd)
    built = sorted(p for top in tops for p in (lib / top).rglob("*.so"))
    names = {".".join(p.relative_to(lib).with_suffix("").with_suffix("").parts) for p in built}
    expected = {*native.COMPILED, native.GROUP + "__mypyc"}
    if names != expected:
        raise RuntimeError(f"build_ext made {sorted(names)}, expected one module each of {sorted(expected)}")
    target = native.tree()
    staging = target.with_name(native.DIR_NAME + ".new")
    shutil.rmtree(staging, ignore_errors=True)
    for p in built:  # fanout/_compiled/<package path>/<module>.<abi>.so, e.g. fanout/_compiled/storage/...
        dest = staging / p.relative_to(lib)
        dest.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(p, dest)
    (staging / native.DIGEST_FILE).write_text(digest + "\n")  # last: a directory without it is never used
    shutil.rmtree(target, ignore_errors=True)
    staging.rename(target)
    shutil.rmtree(native.ROOT / "mqtt" / native.DIR_NAME, ignore_errors=True)  # where earlier builds put theirs
    return target


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m scripts.build_native", description=__doc__.split("\n")[0])
    ap.add_argument("--force", action="store_true", help="build even when the compiled modules are up to date")
    ap.add_argument("--check", action="store_true", help="build nothing; exit 1 when not up to date")
    a = ap.parse_args(argv)
    ok = up_to_date()
    if a.check or (ok and not a.force):
        print(f"compiled modules: {'up to date' if ok else 'missing or stale'}")
        return 0 if ok else 1
    t0 = time.monotonic()
    print(f"compiling {len(native.COMPILED)} modules ({', '.join(native.COMPILED)}) with mypyc "
          "(~2-3 minutes)", flush=True)
    try:
        target = build()
    except (Exception, SystemExit) as e:  # mypy's type errors end in SystemExit
        shutil.rmtree(native.tree(), ignore_errors=True)  # never leave stale machine code
        print(f"build_native: FAILED ({type(e).__name__}: {e}); fanout runs its Python sources",
              file=sys.stderr)
        return 1
    print(f"compiled modules in {target.relative_to(ROOT)} ({time.monotonic() - t0:.0f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
