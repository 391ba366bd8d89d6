"""The benchmarks' one index lists every benchmark module, each driver and results file it names
exists, and the one entry point lists and refuses as it says."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from benchmarks.index import INDEX

ROOT = Path(__file__).resolve().parents[1]
FOLDER = ROOT / "benchmarks"


def test_every_benchmark_is_in_the_index_and_what_it_names_exists():
    modules = {p.stem for p in FOLDER.glob("*.py")} - {"__init__", "__main__", "index"}
    assert sorted(b.name for b in INDEX) == sorted(modules)
    for bench in INDEX:
        assert bench.machine in ("cpu", "gpu", "tool"), bench
        assert bench.question.endswith(("?", ".")), bench
        assert not bench.driver or (FOLDER / "device" / bench.driver).is_file(), bench
        assert not bench.results or (FOLDER / bench.results).is_file(), bench


def test_the_entry_point_lists_them_and_refuses_an_unknown_name():
    listed = subprocess.run(
        [sys.executable, "-m", "benchmarks"], cwd=ROOT, capture_output=True, text=True, check=True
    )
    assert "engine_choice_on_auto [gpu]" in listed.stdout
    unknown = subprocess.run(
        [sys.executable, "-m", "benchmarks", "nosuch"], cwd=ROOT, capture_output=True, text=True
    )
    assert unknown.returncode == 2 and "`python -m benchmarks` lists them" in unknown.stderr
