"""Snapshots of every plan document: a refactor of the planner must leave each one byte-identical.

Writes, one file per document, what `lucebox plan --json` prints for every preset in
``presets/*.toml`` on scripted cards (``--vram-mib``) of 8, 12, 16, 24, 32, 48 and 80 GiB and
two cards of 24 GiB, the same at 24 GiB with each engine forced (``--engine``), and what
`lucebox presets --json` prints at 8, 16, 24 and 24+24 GiB.

    python -m benchmarks.plan_snapshots OUT_DIR [--jobs N]
    python -m benchmarks.plan_snapshots --compare DIR_A DIR_B

Each document is ``NAME.json``, the command's stdout byte for byte, beside ``NAME.run.json``:
the command line, its exit code and its stderr (a refused plan prints its document, exits 3
and says why on stderr). ``--compare`` lists every document whose stdout, exit code or stderr
differs, or that only one folder has, and exits 1 if any does, 0 when all are byte-identical.

Every command runs the CLI (``python -m lucebox.app.cli``) in a subprocess with
``LUCEBOX_HOME`` at one fixed folder under the system temp dir, emptied first, and no other
``LUCEBOX_*`` variable: the documents name that folder (the models' paths), so two runs on
this machine write the same bytes and nothing of the user's home leaks in. Do not run two
at once. The planner also reads this PC's total RAM (the host-RAM prompt cache) and its CPU
cores (the CPU's read rate), so ``MANIFEST.json`` records both; ``--compare`` says when the
two folders come from different machines, where those documents differ by design.
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
import tomllib
from collections.abc import Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import psutil

REPO = Path(__file__).resolve().parent.parent
PRESETS_DIR = REPO / "presets"
HOME_DIR = Path(tempfile.gettempdir()) / "lucebox-plan-snapshots-home"
MANIFEST = "MANIFEST.json"
RUN_SUFFIX = ".run.json"
MIB_PER_GIB = 1024

PLAN_BUDGETS_GIB: tuple[tuple[int, ...], ...] = (
    (8,),
    (12,),
    (16,),
    (24,),
    (32,),
    (48,),
    (80,),
    (24, 24),
)
PRESETS_BUDGETS_GIB: tuple[tuple[int, ...], ...] = ((8,), (16,), (24,), (24, 24))
FORCED_ENGINES_BUDGET_GIB: tuple[int, ...] = (24,)
FORCED_ENGINES = ("llama-server", "lucebox")


@dataclass(frozen=True)
class Document:
    """One CLI command whose stdout is snapshotted under ``name``."""

    name: str
    args: tuple[str, ...]


@dataclass(frozen=True)
class Captured:
    stdout: bytes
    stderr: str
    exit_code: int


def budget_label(cards_gib: Sequence[int]) -> str:
    return "+".join(str(gib) for gib in cards_gib) + "gib"


def vram_mib_arg(cards_gib: Sequence[int]) -> str:
    return ",".join(str(gib * MIB_PER_GIB) for gib in cards_gib)


def preset_ids(presets_dir: Path = PRESETS_DIR) -> list[str]:
    """The id of every shipped preset, read from the TOML files rather than through lucebox."""
    return sorted(
        tomllib.loads(path.read_text(encoding="utf-8"))["id"] for path in presets_dir.glob("*.toml")
    )


def _plan(preset: str, cards_gib: Sequence[int], *extra: str) -> tuple[str, ...]:
    return ("plan", "--preset", preset, "--vram-mib", vram_mib_arg(cards_gib), *extra, "--json")


def documents(ids: Iterable[str]) -> list[Document]:
    """Every document to snapshot, each under a name that depends only on its command."""
    docs: list[Document] = []
    for preset in ids:
        for cards in PLAN_BUDGETS_GIB:
            docs.append(Document(f"plan--{preset}--{budget_label(cards)}", _plan(preset, cards)))
        cards = FORCED_ENGINES_BUDGET_GIB
        for engine in FORCED_ENGINES:
            name = f"plan--{preset}--{budget_label(cards)}--engine-{engine}"
            docs.append(Document(name, _plan(preset, cards, "--engine", engine)))
    for cards in PRESETS_BUDGETS_GIB:
        name = f"presets--{budget_label(cards)}"
        docs.append(Document(name, ("presets", "--vram-mib", vram_mib_arg(cards), "--json")))
    return docs


def cli_env(home: Path) -> dict[str, str]:
    """This process's environment with LUCEBOX_HOME at ``home`` and no other LUCEBOX_ setting."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("LUCEBOX_")}
    env["LUCEBOX_HOME"] = str(home)
    return env


def run_cli(args: Sequence[str], env: dict[str, str]) -> Captured:
    done = subprocess.run(
        [sys.executable, "-m", "lucebox.app.cli", *args],
        capture_output=True,
        env=env,
        timeout=300,
        check=False,
    )
    return Captured(done.stdout, done.stderr.decode("utf-8", "replace"), done.returncode)


def machine_facts() -> dict[str, int]:
    """What the planner reads from this PC even when the cards are scripted."""
    return {
        "ram_total_bytes": psutil.virtual_memory().total,
        "cpu_cores_physical": psutil.cpu_count(logical=False) or 0,
        "cpu_cores_logical": psutil.cpu_count() or 0,
    }


def write_snapshots(out_dir: Path, jobs: int) -> int:
    """Run every document's command into ``out_dir`` (emptied first); returns their count."""
    docs = documents(preset_ids())
    shutil.rmtree(HOME_DIR, ignore_errors=True)
    shutil.rmtree(out_dir, ignore_errors=True)
    out_dir.mkdir(parents=True)
    env = cli_env(HOME_DIR)

    def snapshot(doc: Document) -> None:
        captured = run_cli(doc.args, env)
        (out_dir / f"{doc.name}.json").write_bytes(captured.stdout)
        run = {
            "command": ["lucebox", *doc.args],
            "exit_code": captured.exit_code,
            "stderr": captured.stderr,
        }
        (out_dir / f"{doc.name}{RUN_SUFFIX}").write_text(
            json.dumps(run, indent=2) + "\n", encoding="utf-8"
        )

    with ThreadPoolExecutor(max_workers=max(jobs, 1)) as pool:
        list(pool.map(snapshot, docs))
    manifest = {"machine": machine_facts(), "documents": [doc.name for doc in docs]}
    (out_dir / MANIFEST).write_text(json.dumps(manifest, indent=2) + "\n", encoding="utf-8")
    shutil.rmtree(HOME_DIR, ignore_errors=True)
    return len(docs)


def _document_names(folder: Path) -> set[str]:
    return {
        path.name.removesuffix(".json")
        for path in folder.glob("*.json")
        if path.name != MANIFEST and not path.name.endswith(RUN_SUFFIX)
    }


def _read(path: Path) -> bytes | None:
    return path.read_bytes() if path.is_file() else None


def _run_record(folder: Path, name: str) -> dict[str, object]:
    raw = _read(folder / f"{name}{RUN_SUFFIX}")
    record: dict[str, object] = json.loads(raw) if raw is not None else {}
    return record


def differences(dir_a: Path, dir_b: Path) -> list[str]:
    """One line per document that is not byte-identical in the two folders, sorted by name."""
    lines: list[str] = []
    names_a, names_b = _document_names(dir_a), _document_names(dir_b)
    for name in sorted(names_a | names_b):
        if name not in names_b:
            lines.append(f"{name}: only in {dir_a}")
            continue
        if name not in names_a:
            lines.append(f"{name}: only in {dir_b}")
            continue
        parts: list[str] = []
        if _read(dir_a / f"{name}.json") != _read(dir_b / f"{name}.json"):
            parts.append("stdout")
        run_a, run_b = _run_record(dir_a, name), _run_record(dir_b, name)
        if run_a.get("exit_code") != run_b.get("exit_code"):
            parts.append(f"exit code ({run_a.get('exit_code')} -> {run_b.get('exit_code')})")
        if run_a.get("stderr") != run_b.get("stderr"):
            parts.append("stderr")
        if run_a.get("command") != run_b.get("command"):
            parts.append("command")
        if parts:
            lines.append(f"{name}: differs in {', '.join(parts)}")
    return lines


def machine_note(dir_a: Path, dir_b: Path) -> str | None:
    """A warning when the two folders were written on machines the planner tells apart."""
    facts = []
    for folder in (dir_a, dir_b):
        raw = _read(folder / MANIFEST)
        facts.append(json.loads(raw).get("machine") if raw is not None else None)
    if facts[0] == facts[1]:
        return None
    return (
        f"note: the folders come from different machines ({facts[0]} vs {facts[1]}): "
        "documents that depend on the RAM or the CPU cores differ by design"
    )


def compare(dir_a: Path, dir_b: Path) -> int:
    for folder in (dir_a, dir_b):
        if not folder.is_dir():
            print(f"plan_snapshots: {folder} is not a folder", file=sys.stderr)
            return 2
    note = machine_note(dir_a, dir_b)
    if note:
        print(note)
    lines = differences(dir_a, dir_b)
    for line in lines:
        print(line)
    total = len(_document_names(dir_a) | _document_names(dir_b))
    print(f"{len(lines)} of {total} documents differ")
    return 1 if lines else 0


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.plan_snapshots",
        description="snapshot every plan and presets document, or compare two snapshots",
    )
    parser.add_argument("out_dir", nargs="?", type=Path, help="folder to write (emptied first)")
    parser.add_argument("--compare", nargs=2, type=Path, metavar=("DIR_A", "DIR_B"))
    parser.add_argument(
        "--jobs", type=int, default=os.cpu_count() or 1, help="commands run at once"
    )
    args = parser.parse_args(argv)
    if args.compare:
        if args.out_dir is not None:
            parser.error("--compare takes no OUT_DIR")
        return compare(*args.compare)
    if args.out_dir is None:
        parser.error("give OUT_DIR, or --compare DIR_A DIR_B")
    started_s = time.monotonic()
    count = write_snapshots(args.out_dir, args.jobs)
    print(f"{count} documents in {args.out_dir} ({time.monotonic() - started_s:.1f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
