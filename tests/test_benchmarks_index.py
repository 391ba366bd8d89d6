"""The benchmarks' one index lists every benchmark module, each step of the GPU machine's driver
and results file it names exists, every results file is named by its entry and carries its
command, and the one entry point lists and refuses as it says."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from benchmarks.index import INDEX

ROOT = Path(__file__).resolve().parents[1]
FOLDER = ROOT / "benchmarks"
DRIVER = FOLDER / "device" / "drive.sh"


def driver_steps() -> set[str]:
    listed = subprocess.run(
        ["bash", str(DRIVER), "steps"], cwd=ROOT, capture_output=True, text=True, check=True
    )
    return {line.split("\t")[0] for line in listed.stdout.splitlines()}


def test_every_benchmark_is_in_the_index_and_what_it_names_exists():
    modules = {p.stem for p in FOLDER.glob("*.py")} - {"__init__", "__main__", "index"}
    names = [b.name for b in INDEX]
    assert len(names) == len(set(names))
    assert modules <= set(names)
    for bench in INDEX:
        assert bench.machine in ("cpu", "gpu", "tool"), bench
        assert bench.question.endswith(("?", ".")), bench
        assert bench.name in modules or bench.device_step, bench
        assert all((FOLDER / path).is_file() for path in bench.results), bench


def test_every_results_file_is_named_by_its_entry_and_carries_its_command():
    named = {path: bench for bench in INDEX for path in bench.results}
    machines = ("cpu", "h100", "h200", "h200x2", "h200x4")
    for path in sorted((FOLDER / "results").iterdir()):
        bench = named.get(f"results/{path.name}")
        assert bench is not None, f"{path.name} is named by no index entry"
        slug = bench.name.replace("_", "-")
        machine, _, rest = path.stem.partition("-")
        assert machine in machines, path.name
        assert rest == slug or rest.startswith(f"{slug}-"), path.name
        assert path.suffix == ".json" and "command" in json.loads(path.read_text()), path.name


def test_each_gpu_benchmark_names_a_step_the_driver_knows():
    steps = driver_steps()
    for bench in INDEX:
        assert bench.machine != "gpu" or bench.device_step, bench
        assert not bench.device_step or bench.device_step in steps, bench
    assert {"env", "wheels", "build-llama", "build-lucebox", "wait-builds", "models"} <= steps
    assert {"serve", "collect", "detach"} <= steps


def test_the_driver_refuses_an_unknown_step():
    unknown = subprocess.run(
        ["bash", str(DRIVER), "nosuch"], cwd=ROOT, capture_output=True, text=True
    )
    assert unknown.returncode == 2 and "steps` lists them" in unknown.stderr


def test_the_entry_point_lists_them_and_refuses_an_unknown_name():
    listed = subprocess.run(
        [sys.executable, "-m", "benchmarks"], cwd=ROOT, capture_output=True, text=True, check=True
    )
    assert "engine_choice_on_auto [gpu]" in listed.stdout
    assert "benchmarks/device/drive.sh engine_choice_on_auto" in listed.stdout
    unknown = subprocess.run(
        [sys.executable, "-m", "benchmarks", "nosuch"], cwd=ROOT, capture_output=True, text=True
    )
    assert unknown.returncode == 2 and "`python -m benchmarks` lists them" in unknown.stderr
    device_only = subprocess.run(
        [sys.executable, "-m", "benchmarks", "kv_calibration_gpu"],
        cwd=ROOT,
        capture_output=True,
        text=True,
    )
    assert device_only.returncode == 2
    assert "drive.sh kv_calibration_gpu" in device_only.stderr
