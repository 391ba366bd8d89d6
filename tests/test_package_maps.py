"""Every package's docstring (its map) names each module and sub-package in it, so a newcomer
finds any file from the package it sits in."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = sorted(
    p.parent for p in (*ROOT.glob("engine/**/__init__.py"), *ROOT.glob("app/**/__init__.py"))
)


@pytest.mark.parametrize("package", PACKAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_the_package_map_names_every_module(package):
    init = package / "__init__.py"
    doc = ast.get_docstring(ast.parse(init.read_text(encoding="utf-8"))) or ""
    members = [p.stem for p in package.glob("*.py") if p.name != "__init__.py"]
    members += [p.name for p in package.iterdir() if (p / "__init__.py").is_file()]
    missing = sorted(m for m in members if f"``{m}``" not in doc and f"``{m}/``" not in doc)
    assert not missing, f"{init.relative_to(ROOT)} does not name {missing}"


def test_every_package_is_installed():
    """pyproject.toml lists the packages a wheel installs: a folder missing there is missing in
    every install outside the checkout."""
    import tomllib

    listed = set(
        tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"]
    )
    for package in PACKAGES:
        dotted = "lucebox." + ".".join(package.relative_to(ROOT).parts)
        assert dotted in listed, f"{dotted} is not in pyproject.toml's packages"
