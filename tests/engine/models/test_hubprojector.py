"""A vision model named by its repo on the local Hub: the projector that matches it (type and
width from its header, read by range requests) in the precision that fits, pulled and
hash-checked with the weights; ``--vision off`` pulls none and reads none."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from lucebox.engine import pipeline
from lucebox.engine.core.paths import Paths, resolve_paths
from lucebox.engine.models.records import list_models
from lucebox.engine.plan.options import ServeOptions
from support.ggufgen import ModelSpec, ProjectorSpec, write_gguf
from support.hubserver import COMMIT, HubFile
from support.smolserver import private_engine_home
from tests.conftest import run_lucebox
from tests.engine.plan.test_vision_plan import SIGLIP, TEXT

REPO = "acme/tiny-vision-GGUF"


def _repo(folder: Path, text: ModelSpec, projector: ProjectorSpec) -> dict[str, bytes]:
    """Weights, the projector in F16 and Q8_0, and one made for a model of another width."""
    folder.mkdir()
    files = {
        "tiny-vision-Q8_0.gguf": text,
        "mmproj-tiny-vision-F16.gguf": projector,
        "mmproj-tiny-vision-Q8_0.gguf": dataclasses.replace(projector, quant="Q8_0"),
        "mmproj-bigger-model-BF16.gguf": dataclasses.replace(
            projector, target_n_embd=text.n_embd * 2
        ),
    }
    return {name: write_gguf(folder / name, spec).read_bytes() for name, spec in files.items()}


def _prepare(paths: Paths, options: ServeOptions, *, dry_run: bool) -> pipeline.Prepared:
    return pipeline.prepare(paths, options, lambda _: None, dry_run=dry_run)


def _mmproj_sidecars(prepared: pipeline.Prepared) -> dict[str, dict]:
    document = prepared.launch.source_choice
    assert document is not None
    return {s["path"]: s for s in document["sidecars"] if s["kind"] == "mmproj"}


def test_the_plan_picks_the_precision_that_fits_and_leaves_the_other_models(hub, tmp_path):
    # Header-only files: the Hub lists their sizes, the plan reads the projectors' headers.
    text = dataclasses.replace(TEXT, basename="tiny-vision")
    for name, body in _repo(tmp_path / "repo", text, SIGLIP).items():
        hub.add(REPO, name, HubFile(body))
    paths = resolve_paths({"LUCEBOX_HOME": str(tmp_path / "home")})

    def plan(vram_mib: int) -> pipeline.Prepared:
        return _prepare(paths, ServeOptions(model=REPO, vram_mib=(vram_mib,)), dry_run=True)

    roomy, tight = plan(2000), plan(1300)
    chosen = {mib: plan(mib).launch.vision for mib in (2000, 1600)}
    assert {mib: Path(v.path or "").name for mib, v in chosen.items()} == {
        2000: "mmproj-tiny-vision-F16.gguf",
        1600: "mmproj-tiny-vision-Q8_0.gguf",
    }
    # Where the store will keep it: beside the weights it is pulled with.
    assert Path(roomy.launch.server.model_path).parent == Path(chosen[2000].path or "").parent
    sidecars = _mmproj_sidecars(roomy)
    assert sidecars["mmproj-tiny-vision-F16.gguf"]["served"]
    assert not sidecars["mmproj-tiny-vision-Q8_0.gguf"]["served"]
    other = sidecars["mmproj-bigger-model-BF16.gguf"]
    assert not other["served"] and "belongs to another model" in other["note"]
    # Too tight for either: not served, and the plan says what the smaller one would cost.
    assert not tight.launch.vision.served
    assert "mmproj-tiny-vision-Q8_0.gguf" in tight.launch.vision.reason
    assert "--vision on" in tight.launch.vision.reason
    assert not any(s["served"] for s in _mmproj_sidecars(tight).values())


@pytest.mark.slow
def test_serve_pulls_the_matching_projector_with_the_weights(built_engine_home, hub, tmp_path):
    for name, body in _repo(tmp_path / "repo", ModelSpec(), ProjectorSpec()).items():
        hub.add(REPO, name, HubFile(body))
    paths = resolve_paths({"LUCEBOX_HOME": str(private_engine_home(tmp_path / "home"))})
    prepared = _prepare(paths, ServeOptions(model=REPO, ctx=2048), dry_run=False)
    vision = prepared.launch.vision
    assert vision.served and vision.path is not None
    mmproj = Path(vision.path)
    assert mmproj.name == "mmproj-tiny-vision-F16.gguf" and mmproj.is_file()
    argv = prepared.launch.argv
    assert argv[argv.index("--mmproj") + 1] == str(mmproj)
    records = {Path(r.main_path).name: r for r in list_models(paths)}
    assert set(records) == {"tiny-vision-Q8_0.gguf", "mmproj-tiny-vision-F16.gguf"}
    record = records[mmproj.name]
    assert record.source == f"hf:{REPO}/{mmproj.name}@{COMMIT}"
    assert record.sha256_source == "hub-lfs"
    assert record.files[0].sha256 == hub.files[(REPO, mmproj.name)].sha256
    assert mmproj.parent == Path(prepared.launch.server.model_path).parent
    assert _mmproj_sidecars(prepared)[mmproj.name]["served"]


@pytest.mark.slow
def test_vision_off_reads_and_pulls_no_projector(built_engine_home, hub, tmp_path):
    for name, body in _repo(tmp_path / "repo", ModelSpec(), ProjectorSpec()).items():
        hub.add(REPO, name, HubFile(body))
    paths = resolve_paths({"LUCEBOX_HOME": str(private_engine_home(tmp_path / "home"))})
    options = ServeOptions(model=REPO, ctx=2048, vision="off")
    prepared = _prepare(paths, options, dry_run=False)
    assert not prepared.launch.vision.served and "--mmproj" not in prepared.launch.argv
    assert [Path(r.main_path).name for r in list_models(paths)] == ["tiny-vision-Q8_0.gguf"]
    assert not [path for (_, path), n in hub.bytes_served.items() if "mmproj" in path and n]


def test_models_pull_by_name_pulls_the_projector_beside_the_weights(hub, tmp_path):
    for name, body in _repo(tmp_path / "repo", ModelSpec(), ProjectorSpec()).items():
        hub.add(REPO, name, HubFile(body))
    home = tmp_path / "home"
    env = {"LUCEBOX_HOME": str(home), "HF_ENDPOINT": hub.base_url}
    done = run_lucebox("models", "pull", REPO, "--json", env=env)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["source"] == f"hf:{REPO}/tiny-vision-Q8_0.gguf@{COMMIT}"
    assert "vision projector mmproj-tiny-vision-F16" in done.stderr
    stored = {Path(r.main_path).name for r in list_models(resolve_paths(env))}
    assert stored == {"tiny-vision-Q8_0.gguf", "mmproj-tiny-vision-F16.gguf"}
