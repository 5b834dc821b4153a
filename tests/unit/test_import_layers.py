"""The layers of DESIGN.md, read from the source with ``ast``: who may import whom, and no circles.

Every import counts, wherever it is written (module top, inside a function, under ``TYPE_CHECKING``): a
lazy import is still a dependency, only a cheaper one. ``from pkg import name`` depends on the module
``pkg.name`` when there is one, else on the package ``pkg`` itself (its ``__init__``).
"""
from __future__ import annotations

import ast
from collections import defaultdict
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PRODUCT = ("fanout", "storage", "actors", "cluster")
SCANNED = (*PRODUCT, "scripts")  # scripts may import all, but its own modules must not go round in circles

# Which top-level folders each product folder may import (besides itself), from DESIGN.md's layer table.
MAY_IMPORT: dict[str, set[str]] = {
    "fanout": {"storage"},
    "storage": set(),
    "actors": {"fanout", "storage"},
    "cluster": {"fanout", "storage", "actors"},
}
RAY_FREE = ("fanout", "storage")  # never import ray, not even lazily



def _module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _modules() -> dict[str, Path]:
    found: dict[str, Path] = {}
    for top in SCANNED:
        for path in sorted((ROOT / top).rglob("*.py")):
            found[_module_name(path)] = path
    return found


MODULES = _modules()


def _imports(name: str, path: Path) -> set[str]:
    """Every module name ``name`` imports (absolute; relative imports resolved against its package)."""
    is_package = path.name == "__init__.py"
    package = name if is_package else name.rpartition(".")[0]
    out: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            out.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base_parts = package.split(".")
                base_parts = base_parts[:len(base_parts) - (node.level - 1)]
                base = ".".join(base_parts + ([node.module] if node.module else []))
            else:
                base = node.module or ""
            for alias in node.names:
                candidate = f"{base}.{alias.name}"
                out.add(candidate if candidate in MODULES else base)
    return out


def _graph() -> dict[str, set[str]]:
    """Module -> product/scripts modules it imports (the nearest scanned module of each import)."""
    graph: dict[str, set[str]] = {}
    for name, path in MODULES.items():
        targets = set()
        for imported in _imports(name, path):
            while imported and imported not in MODULES:
                imported = imported.rpartition(".")[0]
            if imported and imported != name:
                targets.add(imported)
        graph[name] = targets
    return graph


GRAPH = _graph()
RAW_IMPORTS = {name: _imports(name, path) for name, path in MODULES.items()}


def _top(module: str) -> str:
    return module.partition(".")[0]


def _strongly_connected(graph: dict[str, set[str]]) -> list[set[str]]:
    """Tarjan's algorithm, iterative; components of more than one module (or a self-import)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    on_stack: set[str] = set()
    stack: list[str] = []
    found: list[set[str]] = []
    counter = 0
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = counter
        counter += 1
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = counter
                    counter += 1
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph.get(child, ())))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                parent = work[-1][0]
                low[parent] = min(low[parent], low[node])
            if low[node] == index[node]:
                component = set()
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.add(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(component)
    return found


def test_the_scan_sees_the_product():
    assert {"fanout.cli", "storage.shard", "actors.controller", "cluster.cli.up", "cluster.runtime"} <= set(MODULES)
    assert "storage.shard" in GRAPH["actors.dispatcher"] or "storage" in GRAPH["actors.dispatcher"]
    assert "actors.names" in GRAPH["actors.dispatcher"]  # relative imports resolve


@pytest.mark.parametrize("top", RAY_FREE)
def test_ray_free_layers_never_import_ray(top):
    offenders = sorted(f"{name} imports {imp}" for name, imps in RAW_IMPORTS.items() if _top(name) == top
                       for imp in imps if _top(imp) == "ray")
    assert not offenders, offenders


def test_fanout_imports_no_ray_cluster_or_actors():
    offenders = sorted(f"{name} imports {imp}" for name, imps in RAW_IMPORTS.items() if _top(name) == "fanout"
                       for imp in imps if _top(imp) in {"ray", "cluster", "actors"})
    assert not offenders, offenders


# fanout.native is the switch that decides whether the compiled modules run (standard library only, see
# test_the_native_switch_imports_no_module_of_the_project); the storage package asks it like fanout's packages do,
# and that is its one way up.
SWITCH = {("storage", "fanout.native")}


def test_imports_point_down_the_layers():
    offenders = sorted(f"{name} imports {target}" for name, targets in GRAPH.items() if _top(name) in MAY_IMPORT
                       for target in targets
                       if _top(target) != _top(name) and _top(target) not in MAY_IMPORT[_top(name)]
                       and (name, target) not in SWITCH)
    assert not offenders, offenders


def test_the_mqtt_package_imports_nothing_outside_itself():
    # fanout.native (standard library only) decides whether the compiled modules run; the package's __init__
    # asks it before any module of the package is imported.
    escapes = {(name, target) for name, targets in GRAPH.items() if name.startswith("fanout.mqtt")
               for target in targets if not target.startswith("fanout.mqtt")} - {("fanout.mqtt", "fanout.native")}
    assert escapes == set(), sorted(escapes)


def test_the_native_switch_imports_no_module_of_the_project():
    assert GRAPH["fanout.native"] == set(), sorted(GRAPH["fanout.native"])  # it runs before the packages load


def test_no_circles_between_modules():
    cycles = {frozenset(c) for c in _strongly_connected(GRAPH)}
    assert cycles == set(), [sorted(c) for c in cycles]


def test_the_cycle_finder_finds_cycles():
    graph: dict[str, set[str]] = defaultdict(set, {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}, "e": set()})
    assert _strongly_connected(dict(graph)) == [{"a", "b", "c"}]
