"""`lucebox engine status` with several builds of each kind installed side by side: what each
was built from, and which one each kind uses."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

from lucebox.app.cli.parser import main
from lucebox.engine.core.paths import resolve_paths
from lucebox.engine.engines import bsa, lucebox
from lucebox.engine.engines.known import KnownSources
from lucebox.engine.engines.source import SourceInfo
from tests.conftest import run_lucebox
from tests.engine.builds import llama_build, lucebox_build, put_installed
from tests.engine.engines.test_bsa import BSA_TARBALL, needs_bsa_tarball


def status(home: Path) -> dict:
    result = run_lucebox("engine", "status", "--json", env={"LUCEBOX_HOME": str(home)})
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)


def test_two_builds_of_each_kind_are_listed_with_their_source_and_the_one_in_use(tmp_path):
    paths = resolve_paths({"LUCEBOX_HOME": str(tmp_path)})
    current = lucebox_build(paths, "4cf58a04", "2026-11-01T10:00:00")
    older = lucebox_build(paths, "62880e20", "2026-11-02T10:00:00")
    old_llama = llama_build(paths, "b11401", "2026-11-01T10:00:00")
    llama = llama_build(paths, "b11434", "2026-11-02T10:00:00")
    assert current.id.startswith("lucebox-4cf58a04-cuda-sm90-")
    assert older.id.startswith("lucebox-62880e20-cuda-sm90-")
    assert current.version == "luce-dflash 4cf58a04 (2026-08-11)"

    document = status(tmp_path)
    engines = {e["id"]: e for e in document["engines"]}
    assert set(engines) == {current.id, older.id, old_llama.id, llama.id}
    built_from = {
        i: (e["built_from"]["version"], e["built_from"]["date"]) for i, e in engines.items()
    }
    assert built_from == {
        current.id: ("4cf58a04", "2026-08-11"),
        older.id: ("62880e20", "2026-07-20"),
        old_llama.id: ("b11401", "2026-10-05"),
        llama.id: ("b11434", "2026-10-06"),
    }
    assert engines[current.id]["built_from"]["default"] is True
    assert engines[older.id]["built_from"]["default"] is False
    assert "--paged-attention" in [
        c["new"] for c in engines[current.id]["built_from"]["flag_changes"]
    ]
    # The default source's build serves, though the older one was installed later.
    in_use = {i for i, e in engines.items() if e["in_use"]}
    assert in_use == {current.id, llama.id}
    assert document["selected"] == llama.id
    assert document["selected_per_kind"]["lucebox"] == {
        "id": current.id,
        "reason": "built from the default source 4cf58a04",
    }

    # engine.id names the older build: it serves, and llama-server keeps its own choice.
    config = tmp_path / "config" / "config.toml"
    config.parent.mkdir(parents=True, exist_ok=True)
    config.write_text(f'[engine]\nid = "{older.id}"\n', encoding="utf-8")
    document = status(tmp_path)
    assert {e["id"] for e in document["engines"] if e["in_use"]} == {older.id, llama.id}
    assert document["selected"] == llama.id

    text = run_lucebox("engine", "status", env={"LUCEBOX_HOME": str(tmp_path)}).stdout
    assert f"* {older.id}  lucebox" in text
    assert f"  {current.id}  lucebox" in text
    assert "built from: 4cf58a04 (2026-08-11), the default source" in text
    assert "built from: 62880e20 (2026-07-20), a known source" in text
    assert "built from: b11401 (2026-10-05), a known source" in text
    assert f"using for the Lucebox engine: {older.id} (engine.id = {older.id} in config.toml)" in (
        text
    )


def test_a_source_newer_than_the_default_is_named_not_yet_the_default(
    tmp_path, monkeypatch, capsys
):
    """A source pinned before its GPU self-test makes it the default (as 4cf58a04 was): its
    build says so, and the default source's build serves."""
    monkeypatch.setattr(lucebox, "SOURCES", KnownSources(lucebox.SOURCES.sources, "62880e20"))
    monkeypatch.setenv("LUCEBOX_HOME", str(tmp_path))
    paths = resolve_paths({"LUCEBOX_HOME": str(tmp_path)})
    default = lucebox_build(paths, "62880e20", "2026-11-01T10:00:00")
    newer = lucebox_build(paths, "4cf58a04", "2026-11-02T10:00:00")
    assert main(["engine", "status"]) == 0
    text = capsys.readouterr().out
    assert "built from: 4cf58a04 (2026-08-11), the newest known source, not yet the default" in text
    assert "built from: 62880e20 (2026-07-20), the default source" in text
    assert f"* {default.id}  lucebox" in text and f"  {newer.id}  lucebox" in text


def test_a_build_from_a_checkout_or_a_registered_binary_names_no_known_source(tmp_path):
    paths = resolve_paths({"LUCEBOX_HOME": str(tmp_path)})
    llama = llama_build(paths, "b11434", "2026-11-02T10:00:00")
    checkout = dataclasses.replace(
        llama, id="llama.cpp-src-cpu-0000", source_identity="git:abc123", server_path=""
    )
    checkout = dataclasses.replace(
        checkout, server_path=str(paths.engines_dir / checkout.id / "bin" / "llama-server")
    )
    put_installed(paths, checkout, "2026-11-03T10:00:00")
    engines = {e["id"]: e for e in status(tmp_path)["engines"]}
    assert engines[checkout.id]["built_from"] is None
    text = run_lucebox("engine", "status", env={"LUCEBOX_HOME": str(tmp_path)}).stdout
    assert "built from: a source lucebox does not pin (git:abc123)" in text


@needs_bsa_tarball
def test_status_says_which_lucebox_build_has_bsa_and_that_pflash_is_slow_without(tmp_path):
    paths = resolve_paths({"LUCEBOX_HOME": str(tmp_path)})
    source = SourceInfo(tmp_path / "src", "pin", lucebox.PIN.identity, None)
    bsa.ensure(paths, source, tarball=BSA_TARBALL, online=False)
    fast = lucebox_build(paths, lucebox.PIN.short, "2026-11-02T10:00:00", bsa_source=source.path)
    slow = lucebox_build(paths, lucebox.PIN.short, "2026-11-01T10:00:00")
    llama = llama_build(paths, "b11434", "2026-11-02T10:00:00")
    assert fast.id != slow.id
    engines = {e["id"]: e for e in status(tmp_path)["engines"]}
    assert {i: e["bsa"] for i, e in engines.items()} == {
        fast.id: True,
        slow.id: False,
        llama.id: None,
    }
    text = run_lucebox("engine", "status", env={"LUCEBOX_HOME": str(tmp_path)}).stdout
    assert "PFlash: fast kernel (Block-Sparse-Attention)" in text
    assert "PFlash: no BSA: PFlash runs the slow fallback" in text
