"""Shared fixtures: every test runs with LUCEBOX_HOME in its own temp folder and the real
Hugging Face Hub out of reach."""

from __future__ import annotations

import gc
import os
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import huggingface_hub.constants  # noqa: F401  (see hub_offline)
import pytest

from support.hubserver import HubState, serve_hub


@pytest.fixture(autouse=True)
def garbage_collected() -> Iterator[None]:
    """Cyclic garbage collected as each test ends, so a socket or file a test leaves unclosed
    fails that test (warnings are errors) rather than whichever later test the collector
    happens to run in."""
    yield
    gc.collect()


@pytest.fixture(autouse=True)
def hub_offline(monkeypatch: pytest.MonkeyPatch) -> None:
    """No test reads the real Hugging Face Hub: a plan or pull that would is told the Hub is
    offline, the same on a networked CI machine as here. support/hubserver.py's local Hub lifts
    this while it runs. huggingface-hub reads HF_HUB_OFFLINE once, on import: it is imported
    above, before this is set, so that the local Hub's tests find it online in this process."""
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")


@pytest.fixture
def hub(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Iterator[HubState]:
    """The local Hub (support/hubserver.py), empty, with this process pointed at it and no token;
    a test adds the repos it needs to the state it yields."""
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf-home"))
    monkeypatch.delenv("HF_TOKEN", raising=False)
    with serve_hub() as served:
        monkeypatch.setenv("HF_ENDPOINT", served.base_url)
        yield served


@pytest.fixture(autouse=True)
def lucebox_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    home = tmp_path / "lucebox-home"
    monkeypatch.setenv("LUCEBOX_HOME", str(home))
    return home


@dataclass(frozen=True)
class CliResult:
    returncode: int
    stdout: str
    stderr: str


def run_lucebox(*args: str, env: dict[str, str] | None = None, timeout_s: float = 120) -> CliResult:
    """Run the installed ``lucebox`` command line in a subprocess, as a user would."""
    merged = {**os.environ, **(env or {})}
    done = subprocess.run(
        [sys.executable, "-m", "lucebox.app.cli", *args],
        capture_output=True,
        text=True,
        env=merged,
        timeout=timeout_s,
        check=False,
    )
    return CliResult(done.returncode, done.stdout, done.stderr)


def assert_one_line_error(result: CliResult) -> None:
    """A user-facing failure ends stderr with one error line and never shows a traceback.

    Progress lines may come before it; they are not errors.
    """
    assert "Traceback" not in result.stderr
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    errors = [line for line in lines if line.startswith("lucebox: ")]
    assert len(errors) == 1, result.stderr
    assert lines[-1] == errors[0], result.stderr


@pytest.fixture(scope="session")
def built_engine_home() -> Path:
    """LUCEBOX_HOME with the CPU engine built through the CLI (cached across runs)."""
    from support.realmodels import engine_home, gemma_model
    from support.smolserver import no_calibration

    gemma_model()  # warms pip's cache for the store's own pull of the same source
    env = {"LUCEBOX_HOME": str(engine_home())}
    source = run_lucebox("engine", "source", env=env, timeout_s=600)
    assert source.returncode == 0, source.stderr
    build = run_lucebox("engine", "build", "--cpu", env=env, timeout_s=3600)
    assert build.returncode == 0, build.stderr
    no_calibration(engine_home())
    return engine_home()


def alive(pid: int) -> bool:
    """Whether a process with this pid exists (a zombie counts until it is reaped)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True
