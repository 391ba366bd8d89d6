"""A normal (non-editable) install lays app/ and engine/ out as lucebox.app and lucebox.engine."""

from __future__ import annotations

import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.slow
def test_wheel_installs_and_imports_without_the_checkout(tmp_path):
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "--quiet",
            "--no-deps",
            str(ROOT),
            "-w",
            str(tmp_path / "dist"),
        ],
        check=True,
        capture_output=True,
    )
    (wheel,) = (tmp_path / "dist").glob("lucebox-*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    assert {
        "lucebox/engine/gpu.py",
        "lucebox/engine/pin.toml",
        "lucebox/app/cli.py",
        "lucebox/app/tui/app.py",
        "lucebox/app/tui/lucebox.tcss",
    } <= names
    assert not any(name.startswith(("app/", "engine/", "tests/")) for name in names)
    target = tmp_path / "site"
    zipfile.ZipFile(wheel).extractall(target)
    # -S skips site-packages' .pth files, so the editable install of this checkout is not seen;
    # the dependencies come from site-packages added by hand after the installed wheel.
    code = (
        "import sys\n"
        f"sys.path[:0] = [{str(target)!r}, {sysconfig.get_paths()['purelib']!r}]\n"
        "import lucebox.app.cli, lucebox.engine.source as source\n"
        "print(source.__file__)\n"
        "print(source.load_pin().version)\n"
        "print(source.checkout_root())\n"
    )
    done = subprocess.run(
        [sys.executable, "-S", "-c", code], capture_output=True, text=True, cwd=tmp_path, check=True
    )
    module_file, version, checkout = done.stdout.splitlines()
    assert Path(module_file).is_relative_to(target)
    assert version == "11434.0.0"
    assert checkout == "None"
