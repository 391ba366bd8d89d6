"""The exception tree drawn in engine/core/errors.py is the one in the code, exit codes too."""

from __future__ import annotations

import importlib
import pkgutil
import re

import lucebox.app
import lucebox.engine
from lucebox.engine.core import errors
from lucebox.engine.core.errors import LuceboxError

LINE = re.compile(r"^\s*[│├└─ ]*?(?P<name>[A-Z]\w+)\s+exit (?P<code>\d+):")


def every_error_class() -> list[type[LuceboxError]]:
    for package in (lucebox.engine, lucebox.app):
        for info in pkgutil.walk_packages(package.__path__, f"{package.__name__}."):
            importlib.import_module(info.name)
    found, todo = [], [LuceboxError]
    while todo:
        cls = todo.pop()
        found.append(cls)
        todo += cls.__subclasses__()
    return found


def drawing() -> dict[str, tuple[int, str | None]]:
    """Name -> (exit code, parent's name) as the docstring draws them."""
    drawn: dict[str, tuple[int, str | None]] = {}
    open_at: list[tuple[int, str]] = []  # (column of the name, name) down the current branch
    for line in (errors.__doc__ or "").splitlines():
        match = LINE.match(line)
        if match is None:
            continue
        column = match.start("name")
        while open_at and open_at[-1][0] >= column:
            open_at.pop()
        drawn[match["name"]] = (int(match["code"]), open_at[-1][1] if open_at else None)
        open_at.append((column, match["name"]))
    return drawn


def test_every_error_class_is_drawn_with_its_exit_code_and_parent():
    drawn = drawing()
    classes = every_error_class()
    assert len(classes) > 10
    for cls in classes:
        assert cls.__name__ in drawn, f"{cls.__name__} ({cls.__module__}) is not on the drawing"
        code, parent = drawn[cls.__name__]
        assert code == cls.exit_code, cls.__name__
        expected_parent = None if cls is LuceboxError else cls.__mro__[1].__name__
        assert parent == expected_parent, cls.__name__
    assert set(drawn) == {cls.__name__ for cls in classes}


def test_class_names_are_unique_so_the_drawing_names_one_class_each():
    names = [cls.__name__ for cls in every_error_class()]
    assert len(names) == len(set(names))


def test_each_group_holds_the_members_the_drawing_puts_under_it():
    drawn = drawing()
    for cls in every_error_class():
        members = {name for name, (_, parent) in drawn.items() if parent == cls.__name__}
        assert {sub.__name__ for sub in cls.__subclasses__()} == members, cls.__name__


EXIT_CODES = {
    "LuceboxError": 1,
    "FetchError": 1,
    "EngineSetupError": 1,
    "RunError": 1,
    "AlreadyServingError": 1,
    "BuildError": 1,
    "CallError": 1,
    "EngineError": 1,
    "HubUnreachableError": 1,
    "ModelListError": 1,
    "PortInUseError": 1,
    "ServiceError": 1,
    "SourceError": 1,
    "StoreError": 1,
    "StoreVersionError": 1,
    "ToolkitError": 1,
    "TransferError": 1,
    "TransferRefusedError": 1,
    "WorkerError": 1,
    "UsageError": 2,
    "ConfigError": 2,
    "PathsError": 2,
    "PresetError": 2,
    "ModelNameError": 2,
    "GuardRefusal": 3,
    "HashMismatchError": 3,
    "PlanRefusal": 3,
    "SetRefusal": 3,
    "ToolkitRefusal": 3,
    "CancelledByUserError": 130,
}
"""The CLI's exit code per class: a contract (docs/contracts.md), written out, not read back."""


def test_every_class_keeps_its_contracted_exit_code():
    codes = {cls.__name__: cls.exit_code for cls in every_error_class()}
    assert codes == EXIT_CODES
