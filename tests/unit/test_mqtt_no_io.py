"""The MQTT package's import rules (STYLE.md, DESIGN.md layers), checked on its source with ``ast``:

- the sans-I/O modules pull in no asyncio, socket or ray (the h11 rule; only ``aio.py`` does I/O);
- ``fanout/mqtt`` imports nothing outside itself but the standard library and structlog (optional
  accelerators only inside ``try``, with a fallback);
- the modules of ``fanout/mqtt`` import each other without a cycle.

Checked on each module's own import statements (every ``import`` anywhere in the file, including
function bodies and ``TYPE_CHECKING`` blocks): structlog, which every module logs through, imports
asyncio itself, so ``sys.modules`` cannot tell.
"""
from __future__ import annotations

import ast
import json
import subprocess
import sys
from pathlib import Path

import fanout.mqtt

ROOT = Path(fanout.mqtt.__file__).parent
PACKAGE = "fanout.mqtt"
MODULES = sorted(p.stem for p in ROOT.glob("*.py") if p.stem != "__init__")
IO_MODULES = {"aio", "tls", "tls_handshakes"}  # the asyncio adapter, its SSLContext builder and handshake counter
FORBIDDEN_IN_CORE = {"asyncio", "socket", "ray", "selectors", "ssl", "uvloop"}
THIRD_PARTY_ALLOWED = {"structlog", "wsproto"}  # wsproto: sans-I/O WebSocket (websocket.py)
OPTIONAL = {"uvloop", "psutil"}  # imported inside try/except with a fallback (event loop, RSS for $SYS)


def _imports(name: str) -> list[tuple[str, bool]]:
    """(absolute module name, inside a try block) for every import statement of ``fanout/mqtt/<name>.py``."""
    tree = ast.parse((ROOT / f"{name}.py").read_text())
    found: list[tuple[str, bool]] = []

    def visit(node: ast.AST, in_try: bool) -> None:
        if isinstance(node, ast.Import):
            found.extend((a.name, in_try) for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level == 0:
                found.append((node.module or "", in_try))
            else:
                base = PACKAGE.rsplit(".", node.level - 1)[0] if node.level > 1 else PACKAGE
                if node.module:
                    found.append((f"{base}.{node.module}", in_try))
                else:  # from . import x, y
                    found.extend((f"{base}.{a.name}", in_try) for a in node.names)
        for child in ast.iter_child_nodes(node):
            visit(child, in_try or isinstance(node, ast.Try))

    visit(tree, False)
    return found


def _graph() -> dict[str, set[str]]:
    graph: dict[str, set[str]] = {}
    for name in MODULES:
        deps = set()
        for module, _ in _imports(name):
            if module.startswith(PACKAGE + "."):
                deps.add(module[len(PACKAGE) + 1:].split(".")[0])
        graph[name] = deps
    return graph


def _cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One import cycle of ``graph`` (as a path that returns to its start), or None."""
    WHITE, GREY, BLACK = 0, 1, 2
    colour = {n: WHITE for n in graph}
    stack: list[str] = []

    def dfs(n: str) -> list[str] | None:
        colour[n] = GREY
        stack.append(n)
        for m in sorted(graph.get(n, ())):
            if colour.get(m, BLACK) == GREY:
                return stack[stack.index(m):] + [m]
            if colour.get(m) == WHITE:
                found = dfs(m)
                if found:
                    return found
        stack.pop()
        colour[n] = BLACK
        return None

    for n in sorted(graph):
        if colour[n] == WHITE:
            found = dfs(n)
            if found:
                return found
    return None


def test_core_modules_import_no_io():
    for name in MODULES:
        if name in IO_MODULES:
            continue
        top = {m.split(".")[0] for m, _ in _imports(name)}
        assert not top & FORBIDDEN_IN_CORE, (name, top & FORBIDDEN_IN_CORE)


def test_codec_imports_no_io_at_runtime():
    """The pure codec modules do not even load asyncio/socket/ray indirectly (they do not log)."""
    modules = ["fanout.mqtt.errors", "fanout.mqtt.packets", "fanout.mqtt.codec", "fanout.mqtt.encoder",
               "fanout.mqtt.decoder", "fanout.mqtt.topics", "fanout.mqtt.trie"]
    forbidden = ["asyncio", "socket", "ray", "selectors", "ssl"]
    code = (
        "import importlib, json, sys\n"
        f"for m in {modules!r}: importlib.import_module(m)\n"
        f"print(json.dumps(sorted(n for n in {forbidden!r} if n in sys.modules)))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         cwd=__file__.rsplit("/tests/", 1)[0])
    assert json.loads(out.stdout) == []


def test_package_imports_only_itself_stdlib_and_structlog():
    stdlib = set(sys.stdlib_module_names) | {"__future__"}
    for name in MODULES:
        for module, in_try in _imports(name):
            top = module.split(".")[0]
            if module == PACKAGE or module.startswith(PACKAGE + ".") or top in stdlib or top in THIRD_PARTY_ALLOWED:
                continue
            assert top in OPTIONAL and in_try, f"fanout/mqtt/{name}.py imports {module}"


def test_import_graph_is_acyclic():
    graph = _graph()
    assert "broker" in graph and "state" in graph["broker"]  # the graph is really built
    assert _cycle(graph) is None, " -> ".join(_cycle(graph) or [])


def test_cycle_finder_finds_a_cycle():
    assert _cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": set()}) == ["a", "b", "c", "a"]
    assert _cycle({"a": {"b"}, "b": set()}) is None


def test_no_module_imports_the_broker_back():
    """The collaborators of :class:`Broker` get the state in their constructor; none imports ``broker``."""
    for name, deps in _graph().items():
        assert name == "broker" or name == "aio" or "broker" not in deps, name
