"""The real coding-agent clients, installed from npm and PyPI into the test cache (once).

npm packages go to one prefix, each PyPI client to a venv of its own (aider and llm pin
conflicting dependencies). A second run finds them installed and costs nothing; without a
reachable registry the tests that need them skip and say why.
"""

from __future__ import annotations

import fcntl
import shutil
import subprocess
import sys
from pathlib import Path

from support.realmodels import test_cache_dir

NPM_PACKAGES = (
    "@openai/codex@0.169.0",
    "opencode-ai@1.18.33",
    "@anthropic-ai/claude-code@2.1.328",
    "@qwen-code/qwen-code@0.24.4",
    "@continuedev/cli@1.5.47",
)
PYPI_PACKAGES = {"aider": "aider-chat==0.86.2", "llm": "llm==0.36"}
"""Each client's command and its requirement; its venv is named after the distribution."""
INSTALL_TIMEOUT_S = 900


class ClientsUnavailableError(Exception):
    """The clients could not be installed here; the message says why."""


def _folder() -> Path:
    folder = test_cache_dir() / "clients"
    folder.mkdir(parents=True, exist_ok=True)
    return folder


def _run(argv: list[str], what: str) -> None:
    try:
        done = subprocess.run(
            argv, capture_output=True, text=True, timeout=INSTALL_TIMEOUT_S, check=False
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise ClientsUnavailableError(f"installing {what} failed: {exc}") from None
    if done.returncode != 0:
        tail = (done.stderr or done.stdout).strip().splitlines()[-3:]
        raise ClientsUnavailableError(f"installing {what} failed: {' / '.join(tail)}")


def _npm_bin(folder: Path) -> Path:
    prefix = folder / "npm"
    marker = prefix / "installed.txt"
    wanted = "\n".join(NPM_PACKAGES)
    if marker.exists() and marker.read_text() == wanted:
        return prefix / "node_modules" / ".bin"
    npm = shutil.which("npm")
    if npm is None or shutil.which("node") is None:
        raise ClientsUnavailableError("node and npm are not installed")
    prefix.mkdir(exist_ok=True)
    _run(
        [npm, "install", "--no-fund", "--no-audit", "--prefix", str(prefix), *NPM_PACKAGES],
        "the npm clients",
    )
    marker.write_text(wanted)
    return prefix / "node_modules" / ".bin"


def _venv(folder: Path, requirement: str) -> Path:
    return folder / f"py-{requirement.split('==')[0]}"


def _pypi_bin(folder: Path, name: str, requirement: str) -> Path:
    venv = _venv(folder, requirement)
    marker = venv / "installed.txt"
    if marker.exists() and marker.read_text() == requirement:
        return venv / "bin"
    _run([sys.executable, "-m", "venv", "--clear", str(venv)], f"a venv for {name}")
    _run([str(venv / "bin" / "pip"), "install", "-q", requirement], requirement)
    marker.write_text(requirement)
    return venv / "bin"


def client_bin_dirs() -> list[Path]:
    """Folders holding every client's command; installs what is missing (one at a time)."""
    folder = _folder()
    with (folder / "install.lock").open("a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        dirs = [_npm_bin(folder)]
        dirs += [_pypi_bin(folder, name, req) for name, req in PYPI_PACKAGES.items()]
    # Each PyPI venv puts its own python first: expose only the client's command.
    exposed = folder / "bin"
    exposed.mkdir(exist_ok=True)
    for name, requirement in PYPI_PACKAGES.items():
        link = exposed / name
        link.unlink(missing_ok=True)
        link.symlink_to(_venv(folder, requirement) / "bin" / name)
    return [exposed, dirs[0]]
