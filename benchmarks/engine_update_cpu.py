"""The real engine update on this machine (issue 42): llama.cpp b11401 (the older PyPI sdist,
a known source) built and serving, then ``lucebox engine update`` builds b11434 beside it,
self-tests it against b11401 with SmolLM2-135M-Instruct and switches; ``engine rollback`` goes
back. Not a test: it compiles twice (about 15 minutes on 2 cores).

    .venv/bin/python -m benchmarks.engine_update_cpu [--home DIR] [--reuse-from HOME]
        [--out benchmarks/results/cpu-engine-update-cpu.json]

``--home`` is the LUCEBOX_HOME it uses (default: a new temporary folder; one given is reused, so
a second run finds both builds and measures only the self-test). ``--reuse-from`` registers the
builds installed in another LUCEBOX_HOME (their manifests; the binaries stay where they are):
the update then uses a b11434 build made with the same options, as it would its own, instead of
compiling it again (11 minutes on a quiet 2-core PC, far more on a busy one). It prints and
writes the build times, the update's self-test document, and how long the update and the
rollback took.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from lucebox.engine.core.paths import resolve_paths
from lucebox.engine.engines import build, install, kinds
from lucebox.engine.machine import config
from support.realmodels import smol_model

OLDER = "b11401"


def lucebox(home: Path, *args: str) -> tuple[int, str, str, float]:
    """One ``lucebox`` command in ``home``: its exit code, stdout, stderr and seconds."""
    started_s = time.monotonic()
    done = subprocess.run(
        [sys.executable, "-m", "lucebox.app.cli", *args],
        capture_output=True,
        text=True,
        env={**os.environ, "LUCEBOX_HOME": str(home)},
        check=False,
    )
    return done.returncode, done.stdout, done.stderr, time.monotonic() - started_s


def build_older(home: Path) -> tuple[str, float]:
    """b11401 built for this CPU and made engine.id; returns its id and the build's seconds."""
    paths = resolve_paths({"LUCEBOX_HOME": str(home)})
    older = kinds.LLAMA_SERVER.known.by_version(OLDER)
    assert older is not None, f"{OLDER} is not a known source"
    started_s = time.monotonic()
    source = kinds.LLAMA_SERVER.ensure_source(paths, known=older)
    engine, _ = install.build_and_install(paths, source, build.cpu_options())
    config.set_setting(paths, "engine.id", engine.id)
    return engine.id, time.monotonic() - started_s


def register_builds(home: Path, other_home: Path) -> list[str]:
    """The manifests of ``other_home``'s installed builds copied into ``home``; their ids."""
    source = resolve_paths({"LUCEBOX_HOME": str(other_home)}).engines_dir
    target = resolve_paths({"LUCEBOX_HOME": str(home)}).engines_dir
    ids = []
    for manifest in sorted(source.glob("*/manifest.json")):
        (target / manifest.parent.name).mkdir(parents=True, exist_ok=True)
        shutil.copy(manifest, target / manifest.parent.name / manifest.name)
        ids.append(manifest.parent.name)
    return ids


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--home", type=Path, help="LUCEBOX_HOME (default: a new temp folder)")
    parser.add_argument("--out", type=Path, help="write the figures here as JSON")
    parser.add_argument(
        "--reuse-from", type=Path, metavar="HOME", help="register the builds installed there"
    )
    args = parser.parse_args()
    home: Path = args.home or Path(tempfile.mkdtemp(prefix="lucebox-engine-update-"))
    reused = register_builds(home, args.reuse_from) if args.reuse_from else []
    older_id, older_build_s = build_older(home)
    print(f"{older_id}: built in {older_build_s:.0f} s", file=sys.stderr)
    update_args = ("engine", "update", "--model", str(smol_model()), "--ctx", "4096", "--json")
    code, out, err, update_s = lucebox(home, *update_args)
    print(err, file=sys.stderr)
    report: dict[str, Any] = json.loads(out) if out.strip() else {}
    rollback_code, rollback_out, _, rollback_s = lucebox(home, "engine", "rollback")
    figures = {
        "home": str(home),
        "older": {"id": older_id, "build_s": round(older_build_s, 1)},
        "registered_from_elsewhere": reused,
        "update": {"exit_code": code, "wall_s": round(update_s, 1), "report": report},
        "rollback": {
            "exit_code": rollback_code,
            "wall_s": round(rollback_s, 2),
            "said": rollback_out.strip(),
        },
    }
    text = json.dumps(figures, indent=2)
    print(text)
    if args.out is not None:
        args.out.write_text(text + "\n", encoding="utf-8")
    return 0 if code == 0 and rollback_code == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
