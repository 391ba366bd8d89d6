"""No module of the engine or the front ends imports itself back through others, counting the
imports made only for type checking: each idea's modules can be read bottom-up."""

from __future__ import annotations

import ast
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _modules() -> dict[str, Path]:
    found = {}
    for part in ("engine", "app"):
        for path in (ROOT / part).rglob("*.py"):
            dotted = "lucebox." + ".".join(path.relative_to(ROOT).with_suffix("").parts)
            found[dotted.removesuffix(".__init__")] = path
    return found


def _imports(modules: dict[str, Path]) -> dict[str, set[str]]:
    graph: dict[str, set[str]] = defaultdict(set)
    for name, path in modules.items():
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                for alias in node.names:
                    whole = f"{node.module}.{alias.name}"
                    target = whole if whole in modules else node.module
                    if target in modules and target != name:
                        graph[name].add(target)
            elif isinstance(node, ast.Import):
                graph[name] |= {a.name for a in node.names if a.name in modules} - {name}
    return graph


def _cycles(graph: dict[str, set[str]], nodes: list[str]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan's algorithm)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        for other in sorted(graph[node]):
            if other not in index:
                visit(other)
                low[node] = min(low[node], low[other])
            elif other in stack:
                low[node] = min(low[node], index[other])
        if low[node] == index[node]:
            component = []
            while (top := stack.pop()) != node:
                component.append(top)
            component.append(node)
            if len(component) > 1:
                found.append(sorted(component))

    for node in nodes:
        if node not in index:
            visit(node)
    return found


def test_no_import_cycle_type_only_ones_included():
    modules = _modules()
    assert _cycles(_imports(modules), sorted(modules)) == []


def test_a_cycle_is_found():
    graph: dict[str, set[str]] = defaultdict(set, {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}})
    assert _cycles(graph, ["a", "b", "c", "d"]) == [["a", "b", "c"]]
