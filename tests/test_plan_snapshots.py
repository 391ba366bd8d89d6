"""benchmarks/plan_snapshots.py: each document has its own name; --compare finds a changed byte."""

from __future__ import annotations

import json
from pathlib import Path

from benchmarks import plan_snapshots


def _write(folder: Path, name: str, stdout: bytes, exit_code: int = 0) -> None:
    folder.mkdir(exist_ok=True)
    (folder / f"{name}.json").write_bytes(stdout)
    run = {"command": ["lucebox", name], "exit_code": exit_code, "stderr": ""}
    (folder / f"{name}{plan_snapshots.RUN_SUFFIX}").write_text(json.dumps(run))


def test_every_preset_and_budget_gets_its_own_document():
    ids = plan_snapshots.preset_ids()
    docs = plan_snapshots.documents(ids)
    names = [doc.name for doc in docs]
    assert len(set(names)) == len(names) == len(ids) * 10 + 4
    assert "plan--qwen3.6-27b--24+24gib" in names and "presets--24+24gib" in names
    two_cards = next(doc for doc in docs if doc.name == "plan--qwen3.6-27b--24+24gib")
    assert two_cards.args[two_cards.args.index("--vram-mib") + 1] == "24576,24576"


def test_compare_finds_a_changed_byte_an_exit_code_and_a_missing_document(tmp_path, capsys):
    base, after = tmp_path / "base", tmp_path / "after"
    for folder in (base, after):
        _write(folder, "same", b'{"ctx": 4096}\n')
    assert plan_snapshots.main(["--compare", str(base), str(after)]) == 0

    _write(base, "byte", b'{"ctx": 4096}\n')
    _write(after, "byte", b'{"ctx": 4097}\n')
    _write(base, "code", b"{}\n", exit_code=0)
    _write(after, "code", b"{}\n", exit_code=3)
    _write(base, "gone", b"{}\n")
    capsys.readouterr()
    assert plan_snapshots.main(["--compare", str(base), str(after)]) == 1
    assert capsys.readouterr().out.splitlines() == [
        "byte: differs in stdout",
        "code: differs in exit code (0 -> 3)",
        f"gone: only in {base}",
        "3 of 4 documents differ",
    ]
