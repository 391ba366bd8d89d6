"""One real server for the client tests: `lucebox serve` of SmolLM2-135M-Instruct on the CPU."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from lucebox.engine.bench.compare import ServeConfig, Served, serving
from lucebox.engine.core.paths import resolve_paths
from lucebox.engine.pipeline import ServeOptions
from support.realmodels import smol_model
from support.smolserver import private_engine_home


@pytest.fixture(scope="session")
def smol_home(built_engine_home, tmp_path_factory) -> Path:
    """LUCEBOX_HOME of the shared SmolLM2 server (it holds that server's status)."""
    return private_engine_home(tmp_path_factory.mktemp("smol-home"))


@pytest.fixture(scope="session")
def smol_server(smol_home) -> Iterator[Served]:
    """Served through the same machinery as `bench --compare`; stopped after the session."""
    paths = resolve_paths({"LUCEBOX_HOME": str(smol_home)})
    options = ServeOptions(model=str(smol_model()), ctx=4096)
    env = {**os.environ, "LUCEBOX_HOME": str(smol_home)}
    with serving(paths, options, ServeConfig("smol"), env=env, ready_timeout_s=600) as served:
        yield served
