"""`up NAME --dry-run --json` and `models pull NAME` as a user types them, against the local
Hub: a family, a family with size, with a quant tag, an ambiguous name, an unknown one and a
full Hub name; each says what it resolved and exits as documented (2 for a name that does not
name one model)."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from lucebox.engine.core.errors import EXIT_OK, EXIT_USAGE
from lucebox.engine.core.paths import resolve_paths
from lucebox.engine.models.headerinfo import inspect_model
from support.ggufgen import ModelSpec, cached_gguf
from support.hubserver import HubFile, HubState, serve_hub
from tests.conftest import assert_one_line_error, run_lucebox

SPEC = ModelSpec(n_layer=8, n_embd=512, n_ff=1024, n_head=4, n_head_kv=2, n_ctx=16384)
SIZES = {"7b": 8, "13b": 12}
"""Each size of the family and the card tier its preset is made for."""


def _preset(size: str, tier_gib: int, family: str, path: Path) -> str:
    info = inspect_model(path)
    return f"""id = "{family}-{size}"
title = "{family} {size} for the tests"
family = "{family}"
vram_tier_gib = {tier_gib}
engine = "llama.cpp"
native_ctx = 16384
evidence = "a model gguf-py generated for the tests"

[target]
source = "hf:acme/{family.title()}-{size.upper()}-GGUF/{family}-{size}-Q4_0.gguf"
size_bytes = {path.stat().st_size}

[facts]
architecture = "llama"
n_layer = 8
n_embd = 512
n_vocab = {info.vocab_size}
full_kv_layers = 8
kv_heads = 2
head_dim = 128
"""


@pytest.fixture
def hub(monkeypatch, tmp_path):
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf-home"))
    monkeypatch.delenv("HF_TOKEN", raising=False)
    quants = {q: cached_gguf(dataclasses.replace(SPEC, quant=q)) for q in ("Q4_0", "Q8_0")}
    state = HubState()
    folder = resolve_paths().config_dir / "presets"
    folder.mkdir(parents=True, exist_ok=True)
    for family in ("tiny", "tinier"):
        for size, tier in SIZES.items():
            repo = f"acme/{family.title()}-{size.upper()}-GGUF"
            for q, path in quants.items():
                state.add(repo, f"{family}-{size}-{q}.gguf", HubFile(path.read_bytes()))
            state.downloads[repo] = tier
            text = _preset(size, tier, family, quants["Q4_0"])
            (folder / f"{family}-{size}.toml").write_text(text)
    state.add("acme/Wombat-3B-GGUF", "wombat-3b-Q4_0.gguf", HubFile(quants["Q4_0"].read_bytes()))
    with serve_hub(state) as served:
        yield {"HF_ENDPOINT": served.base_url}


def _up(name: str, vram_mib: int, env: dict[str, str]) -> tuple[int, dict, str]:
    done = run_lucebox("up", name, "--dry-run", "--json", "--vram-mib", str(vram_mib), env=env)
    plan = json.loads(done.stdout) if done.returncode == EXIT_OK else {}
    return done.returncode, plan, done.stderr


def test_up_by_name_plans_what_the_name_resolves_to(hub):
    code, plan, said = _up("tiny", 8192, hub)
    assert code == EXIT_OK, said
    assert "the presets tiny-7b, tiny-13b" in said and plan["preset"] == "tiny-7b"
    code, plan, said = _up("tiny", 12288, hub)  # a larger card gets the larger one
    assert code == EXIT_OK and plan["preset"] == "tiny-13b", said

    code, plan, said = _up("tiny:7b", 12288, hub)
    assert code == EXIT_OK and plan["preset"] == "tiny-7b", said
    assert "names the preset tiny-7b" in said

    code, plan, said = _up("tiny:13b-q8_0", 24576, hub)
    assert code == EXIT_OK, said
    assert "no preset is Q8_0" in said
    assert plan["source"]["repo"] == "acme/Tiny-13B-GGUF" and plan["source"]["quant"] == "Q8_0"

    code, plan, said = _up("acme/Tiny-7B-GGUF:Q8_0", 24576, hub)  # a full Hub name
    assert code == EXIT_OK, said
    assert plan["source"]["repo"] == "acme/Tiny-7B-GGUF" and plan["source"]["quant"] == "Q8_0"

    code, plan, said = _up("wombat", 24576, hub)  # no preset: the Hub's search answers
    assert code == EXIT_OK, said
    assert "acme/Wombat-3B-GGUF, the most downloaded GGUF repo" in said
    assert plan["source"]["repo"] == "acme/Wombat-3B-GGUF"


def test_names_that_do_not_name_one_model_exit_2_and_say_what_to_do(hub):
    ambiguous = run_lucebox("up", "tin", "--dry-run", "--vram-mib", "8192", env=hub)
    assert ambiguous.returncode == EXIT_USAGE
    assert_one_line_error(ambiguous)
    assert "tinier: tinier-7b, tinier-13b" in ambiguous.stderr and "tiny: " in ambiguous.stderr

    unknown = run_lucebox("up", "zebra", "--dry-run", "--vram-mib", "8192", env=hub)
    assert unknown.returncode == EXIT_USAGE
    assert_one_line_error(unknown)
    assert "lucebox models search zebra" in unknown.stderr

    twice = run_lucebox("up", "tiny", "--model", "x.gguf", "--dry-run", env=hub)
    assert twice.returncode == EXIT_USAGE and "both name the model" in twice.stderr


def test_models_pull_by_name(hub):
    pulled = run_lucebox("models", "pull", "tiny", "--json", env=hub)
    assert pulled.returncode == EXIT_OK, pulled.stderr
    assert Path(json.loads(pulled.stdout)["files"][0]["path"]).name == "tiny-7b-Q4_0.gguf"

    quant = run_lucebox("models", "pull", "wombat:q4_0", "--json", env=hub)
    assert quant.returncode == EXIT_OK, quant.stderr
    assert Path(json.loads(quant.stdout)["files"][0]["path"]).name == "wombat-3b-Q4_0.gguf"

    unknown = run_lucebox("models", "pull", "zebra", env=hub)
    assert unknown.returncode == EXIT_USAGE
    assert_one_line_error(unknown)
