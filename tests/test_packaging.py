"""The wheel works outside the checkout: built with `python -m build` from a copy of the tree,
installed into a fresh venv, and run from another folder. It never builds the engine."""

from __future__ import annotations

import json
import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

pytestmark = pytest.mark.slow


def _copy_tree(target: Path) -> None:
    """The files git would commit (tracked and new), not the checkout's build leftovers."""
    listed = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        cwd=ROOT,
        capture_output=True,
        check=True,
    ).stdout.split(b"\0")
    for name in filter(None, (n.decode() for n in listed)):
        source = ROOT / name
        if source.is_file() and not name.startswith("lucebox.egg-info"):
            (target / name).parent.mkdir(parents=True, exist_ok=True)
            (target / name).write_bytes(source.read_bytes())


@pytest.fixture(scope="module")
def dist(tmp_path_factory) -> Path:
    tree = tmp_path_factory.mktemp("tree")
    out = tmp_path_factory.mktemp("dist")
    _copy_tree(tree)
    # sdist first, then the wheel from the unpacked sdist: both must carry the package data.
    subprocess.run(
        [sys.executable, "-m", "build", "--outdir", str(out), str(tree)],
        check=True,
        capture_output=True,
        timeout=600,
    )
    return out


def test_wheel_and_sdist_carry_the_package_data(dist):
    (wheel,) = dist.glob("lucebox-*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    shipped_presets = {f"lucebox/presets/{p.name}" for p in (ROOT / "presets").glob("*.toml")}
    assert "lucebox/presets/smollm2-135m-cpu.toml" in shipped_presets <= names
    assert {
        "lucebox/engine/engines/pin.toml",
        "lucebox/app/cli/__main__.py",
        "lucebox/app/cli/parser.py",
        "lucebox/app/tui/lucebox.tcss",
        "lucebox/app/tui/app.py",
        "lucebox/engine/engines/pin_capabilities.json",
        "lucebox/assets/lucebox.desktop",
        "lucebox/assets/lucebox.svg",
        "lucebox/systemd_units/lucebox-user.service.in",
        "lucebox/systemd_units/lucebox-system.service.in",
    } <= names
    assert not any(name.startswith(("app/", "engine/", "tests/", "packaging/")) for name in names)
    (sdist,) = dist.glob("lucebox-*.tar.gz")
    with tarfile.open(sdist) as archive:
        sdist_names = {n.split("/", 1)[1] for n in archive.getnames() if "/" in n}
    assert {"presets/smollm2-135m-cpu.toml", "packaging/systemd/lucebox-user.service.in"} <= (
        sdist_names
    )


def test_fresh_venv_runs_presets_and_plan_outside_the_checkout(dist, tmp_path):
    (wheel,) = dist.glob("lucebox-*.whl")
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    python = venv / "bin" / "python"
    # The checkout's pip installs into the fresh venv (dependencies from its cache or PyPI).
    subprocess.run(
        [sys.executable, "-m", "pip", "--python", str(python), "install", "--quiet", str(wheel)],
        check=True,
        capture_output=True,
        timeout=900,
    )
    home = tmp_path / "lucebox-home"
    env = {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path), "LUCEBOX_HOME": str(home)}
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()

    def lucebox(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [str(venv / "bin" / "lucebox"), *args],
            capture_output=True,
            text=True,
            cwd=elsewhere,
            env=env,
            timeout=120,
            check=False,
        )

    presets = lucebox("presets", "--json")
    assert presets.returncode == 0, presets.stderr
    report = json.loads(presets.stdout)
    ids = {p["id"] for p in report["presets"]}
    assert {"smoke", "smollm2", "qwen3-4b"} <= ids
    plan = lucebox("plan", "--json", "--preset", "smollm2", "--ctx", "4096")
    assert plan.returncode == 0, plan.stderr
    planned = json.loads(plan.stdout)
    assert planned["fits"] and planned["ctx"] == 4096 and "--jinja" in planned["argv"]
    dry = lucebox("service", "install", "--user", "--dry-run")
    assert dry.returncode == 0 and str(python) in dry.stdout, dry.stderr
    probe = subprocess.run(
        [
            str(python),
            "-c",
            "import lucebox.app.tui, lucebox.engine.engines.source as s;"
            "print(s.__file__); print(s.load_pin().version); print(s.checkout_root())",
        ],
        capture_output=True,
        text=True,
        cwd=elsewhere,
        env=env,
        check=True,
    )
    module_file, version, checkout = probe.stdout.splitlines()
    assert Path(module_file).is_relative_to(venv)
    assert (version, checkout) == ("11434.0.0", "None")
    # Presets and plan read headers and the pin only: nothing was built or downloaded.
    assert not (home / "data").exists() and not (home / "cache").exists()
