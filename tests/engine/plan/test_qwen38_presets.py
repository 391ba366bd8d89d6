"""The Qwen3.8 27B presets planned from their files: header-only GGUFs at the real layout
(``SHAPES["qwen35-27b"]``: 64 qwen35 layers, 16 of them attention, and the MTP block unsloth's
quants keep), at each file's quant, where the pull puts them. On its card each set fits with a
context and MTP speculation read from the header, and `presets`, `plan` and `serve --dry-run`
agree. That a generated qwen35 target with its MTP head serves on the CPU is covered by
tests/engine/engines/test_engine_speculation.py and tests/engine/plan/test_speculation.py."""

from __future__ import annotations

import dataclasses
import json

import pytest

from lucebox.engine.core.paths import resolve_paths
from lucebox.engine.models.gguf import read_header
from lucebox.engine.models.modelsource import parse_source
from lucebox.engine.models.presets import find_preset
from lucebox.engine.models.pullcheck import check_and_record
from lucebox.engine.models.records import stored_path
from support.ggufgen import SHAPES, write_gguf

SETS = (
    ("qwen3.8-27b-iq3", 16, "IQ3_XXS"),
    ("qwen3.8-27b", 24, "Q4_K"),
    ("qwen3.8-27b-q6", 32, "Q6_K"),
)
"""Each preset, its card and the quant of its weight matrices."""


def _main_json(capsys, *argv: str) -> tuple[int, dict]:
    from lucebox.app.cli.parser import main

    code = main([*argv, "--json"])
    return code, json.loads(capsys.readouterr().out)


def _pulled(preset_id: str, quant: str) -> int:
    """Write the preset's target as a header-only file where the pull puts it, and record it
    as the pull does (checked); its size."""
    paths = resolve_paths()
    source = parse_source(find_preset(paths, preset_id).target.source)
    path = stored_path(paths, source)
    path.parent.mkdir(parents=True, exist_ok=True)
    write_gguf(path, dataclasses.replace(SHAPES["qwen35-27b"], quant=quant, header_only=True))
    check_and_record(paths, source, [(path, "0" * 64, True)], "hub-lfs", None)
    header = read_header(path)
    assert header.metadata["qwen35.block_count"] == 65
    assert header.metadata["qwen35.nextn_predict_layers"] == 1
    return path.stat().st_size


@pytest.mark.parametrize(("preset_id", "gib", "quant"), SETS, ids=[s[0] for s in SETS])
def test_each_set_fits_its_card_with_mtp_read_from_its_file(capsys, preset_id, gib, quant):
    size = _pulled(preset_id, quant)
    preset = find_preset(resolve_paths(), preset_id)
    # One quant throughout: a little smaller than the file, whose mix keeps some tensors wider.
    assert 0.8 * preset.target.size_bytes < size <= preset.target.size_bytes
    vram = str(gib * 1024)

    code, planned = _main_json(capsys, "plan", "--preset", preset_id, "--vram-mib", vram)
    dry_code, dry = _main_json(
        capsys, "serve", "--preset", preset_id, "--vram-mib", vram, "--dry-run"
    )
    _, table = _main_json(capsys, "presets", "--vram-mib", vram)

    assert (code, planned) == (dry_code, dry)
    assert code == 0 and planned["fits"] and planned["target"]["present"]
    assert planned["ctx"] >= 32768 and planned["ctx"] % 256 == 0
    assert planned["spec"]["type"] == "draft-mtp"
    assert "carries MTP layers" in planned["spec"]["reason"]  # from the header, not the preset
    argv = planned["argv"]
    assert argv[argv.index("--spec-type") + 1] == "draft-mtp" and "-md" not in argv
    row = {entry["id"]: entry for entry in table["presets"]}[preset_id]
    assert (row["fits"], row["ctx"], row["spec"]) == (True, planned["ctx"], "draft-mtp")
