"""The house's measures, kept: no function in app/ or engine/ past ~80 lines, no module past 500
(one past ~400 probably holds two ideas; 500 is where it is split for sure), and engine names
compared as strings only inside the kinds and the choice rule (elsewhere the kind is asked).
Each allow-list names what is still to split or fold; it only ever shrinks."""

from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).parents[1]
LONGEST_LINES = 80
LONG_ALLOWED: frozenset[str] = frozenset()
LONGEST_MODULE_LINES = 500
KIND_HOMES = ("engine/engines/", "engine/plan/enginechoice.py")
"""Where an engine's name may be compared: the kinds themselves and the rule that chooses."""
NAME_TEST = re.compile(
    r"""(==|!=|\bin)\s*[(\[{]?\s*["'](lucebox|llama-server)["']|["'](lucebox|llama-server)["']\s*(==|!=)"""
)
NAME_TESTS_ALLOWED: frozenset[str] = frozenset()


def _sources() -> list[Path]:
    return sorted(p for top in ("app", "engine") for p in (ROOT / top).rglob("*.py"))


def _long_functions() -> dict[str, int]:
    found: dict[str, int] = {}
    for path in _sources():
        tree = ast.parse(path.read_text(encoding="utf-8"))
        owners: list[ast.Module | ast.ClassDef] = [tree]
        owners += [n for n in ast.walk(tree) if isinstance(n, ast.ClassDef)]
        for owner in owners:
            prefix = f"{owner.name}." if isinstance(owner, ast.ClassDef) else ""
            for node in owner.body:
                if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                    lines = (node.end_lineno or node.lineno) - node.lineno + 1
                    if lines > LONGEST_LINES:
                        found[f"{path.relative_to(ROOT)}:{prefix}{node.name}"] = lines
    return found


def test_no_function_grows_past_80_lines():
    long = _long_functions()
    grown = sorted(
        f"{name} ({lines} lines)" for name, lines in long.items() if name not in LONG_ALLOWED
    )
    assert not grown, f"split these by idea: {grown}"
    shrunk = sorted(LONG_ALLOWED - set(long))
    assert not shrunk, f"these are short now; take them off LONG_ALLOWED: {shrunk}"


def test_no_module_grows_past_500_lines():
    long = {
        f"{path.relative_to(ROOT)} ({lines} lines)"
        for path in _sources()
        if (lines := len(path.read_text(encoding="utf-8").splitlines())) > LONGEST_MODULE_LINES
    }
    assert not long, f"split these by idea: {sorted(long)}"


def test_engine_names_are_compared_only_where_kinds_live():
    comparing = {
        str(path.relative_to(ROOT))
        for path in _sources()
        if not str(path.relative_to(ROOT)).startswith(KIND_HOMES)
        and NAME_TEST.search(path.read_text(encoding="utf-8"))
    }
    added = sorted(comparing - NAME_TESTS_ALLOWED)
    assert not added, f"ask the engine kind instead of testing its name in: {added}"
    gone = sorted(NAME_TESTS_ALLOWED - comparing)
    assert not gone, f"these no longer test names; take them off NAME_TESTS_ALLOWED: {gone}"
