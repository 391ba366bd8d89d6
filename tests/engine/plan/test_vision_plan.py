"""Vision in the plan: the projector's terms, --vision auto/on/off, the Lucebox engine, and a
projector made for another model refused with ``mmproj-mismatch``."""

from __future__ import annotations

import dataclasses
import hashlib
import json
from pathlib import Path

import pytest

from benchmarks.lucebox_models import DRAFT, TARGET
from lucebox.engine.core.paths import resolve_paths
from lucebox.engine.core.units import GIB, MIB
from lucebox.engine.machine.budget import DeviceBudget, pool_of
from lucebox.engine.machine.config import Settings
from lucebox.engine.models import ondisk
from lucebox.engine.models.projector import (
    STAND_IN_SHAPES,
    check_projector,
    embedded_vision,
    read_projector,
)
from lucebox.engine.plan.options import ServeOptions, resolve
from lucebox.engine.plan.planner import installs_of, plan_launch
from lucebox.engine.plan.servedset.router import router_ini
from lucebox.engine.plan.servedset.servedsetplan import plan_set
from lucebox.engine.plan.visionplan import projector_bytes
from support.ggufgen import ModelSpec, ProjectorSpec, cached_gguf, write_gguf

H100 = pool_of((DeviceBudget(0, "NVIDIA H100 80GB HBM3", 81079 * MIB, 80_500 * MIB),), 128 * GIB)
RTX_4090 = pool_of((DeviceBudget(0, "NVIDIA GeForce RTX 4090", 24 * GIB, 23 * GIB),), 64 * GIB)
TEXT = ModelSpec(n_ctx=131072, header_only=True)
SIGLIP = ProjectorSpec(
    n_layer=27, n_embd=1152, n_head=16, n_ff=4288, image_size=896, patch_size=14,
    header_only=True,
)  # fmt: skip
"""Gemma 3's projector's shape (SigLIP at 896 px; its 4304-wide FFN rounded to Q8_0 blocks),
projecting to the generated model's width."""


def card(free_mib: int):
    return pool_of((DeviceBudget(0, "NVIDIA Test", free_mib * MIB, free_mib * MIB),), 64 * GIB)


@pytest.fixture()
def model(tmp_path: Path) -> Path:
    """The text model with two projector precisions beside it (as a pull leaves them)."""
    text = write_gguf(tmp_path / "tiny-Q8_0.gguf", TEXT)
    write_gguf(tmp_path / "mmproj-tiny-F16.gguf", SIGLIP)
    write_gguf(tmp_path / "mmproj-tiny-Q8_0.gguf", dataclasses.replace(SIGLIP, quant="Q8_0"))
    return text


def plan(options: ServeOptions, budget=H100, settings: Settings | None = None):
    return plan_launch(
        resolve_paths(), options, resolved=resolve(options, settings or Settings()), budget=budget,
        installs=installs_of(),
    )  # fmt: skip


def test_auto_serves_the_f16_projector_when_it_costs_no_context(model):
    launch = plan(ServeOptions(model=str(model)))
    f16 = model.parent / "mmproj-tiny-F16.gguf"
    assert launch.vision.served and launch.vision.path == str(f16)
    assert launch.argv[launch.argv.index("--mmproj") + 1] == str(f16)
    document = launch.to_json()
    assert document["vision"]["served"] and document["vision"]["projector"] == str(f16)
    projector = read_projector(f16)
    assert projector is not None and projector.out_width == TEXT.n_embd
    assert document["memory_bytes"]["projector"] == projector_bytes(projector, on_gpu=True)
    assert document["vision"]["memory_bytes"] == projector_bytes(projector, on_gpu=True)
    assert projector.weights_bytes < projector_bytes(projector, on_gpu=False)
    assert "projector" in launch.plan.reasons and "vision" in launch.plan.reasons


def test_auto_says_the_tokens_a_projector_costs_when_it_keeps_the_context_wanted(model):
    """None asked, auto serves a projector that leaves 32K or more, and says what it cost."""
    plain = plan(ServeOptions(model=str(model), vision="off"), card(2000))
    launch = plan(ServeOptions(model=str(model)), card(2000))
    assert launch.vision.served and 32768 <= launch.plan.ctx < plain.plan.ctx
    assert launch.vision.reason.startswith(
        f"served: it leaves {launch.plan.ctx} tokens ({plain.plan.ctx} without it)"
    )


def test_auto_drops_the_projector_when_it_costs_context_and_says_what_it_would_cost(model):
    plain = plan(ServeOptions(model=str(model), vision="off"), card(1100))
    launch = plan(ServeOptions(model=str(model)), card(1100))
    assert launch.refusal is None and not launch.vision.served
    assert "--mmproj" not in launch.argv
    assert launch.plan.ctx == plain.plan.ctx
    assert launch.to_json()["memory_bytes"]["projector"] == 0
    reason = launch.to_json()["vision"]["reason"]
    assert reason.startswith("not served:") and "--vision on" in reason
    assert "mmproj-tiny-Q8_0.gguf" in reason and "MiB weights" in reason


def test_vision_on_serves_it_at_the_cost_of_context_or_refuses(model):
    room = card(1600)
    plain = plan(ServeOptions(model=str(model), vision="off"), room)
    on = plan(ServeOptions(model=str(model), vision="on"), room)
    assert on.refusal is None and on.vision.served
    assert on.plan.ctx < plain.plan.ctx
    assert "--mmproj" in on.argv
    refused = plan(ServeOptions(model=str(model), vision="on"), card(900))
    assert refused.refusal is not None and "vision is on" in str(refused.refusal)


def test_off_frees_the_memory(model):
    launch = plan(ServeOptions(model=str(model)), settings=Settings(vision="off"))
    assert not launch.vision.served and "--mmproj" not in launch.argv
    assert launch.to_json()["vision"]["reason"] == 'off (model.vision = "off" in config.toml)'


def test_a_projector_for_another_model_is_refused_with_its_code(model, tmp_path):
    other = write_gguf(
        tmp_path / "mmproj-other.gguf", dataclasses.replace(SIGLIP, target_n_embd=96)
    )
    launch = plan(ServeOptions(model=str(model), mmproj=str(other)))
    assert launch.refusal is not None
    assert launch.refusal.problem_codes == ("mmproj-mismatch",)
    assert "projects images to width 96" in str(launch.refusal)
    assert "--mmproj" not in launch.argv
    checked = check_projector(other, model)
    assert not checked.usable and [p.code for p in checked.problems] == ["mmproj-mismatch"]
    assert check_projector(model.parent / "mmproj-tiny-F16.gguf", model).usable


@pytest.fixture(scope="module")
def lucebox_files(tmp_path_factory) -> tuple[Path, Path, Path]:
    target = cached_gguf(dataclasses.replace(TARGET, header_only=True))
    draft = cached_gguf(dataclasses.replace(DRAFT, header_only=True))
    projector = write_gguf(
        tmp_path_factory.mktemp("mmproj") / "mmproj-F16.gguf",
        dataclasses.replace(SIGLIP, target_n_embd=TARGET.n_embd),
    )
    return target, draft, projector


def test_auto_on_a_lucebox_engine_launch_keeps_the_engine_and_says_what_on_costs(lucebox_files):
    target, draft, projector = lucebox_files
    options = ServeOptions(model=str(target), draft=str(draft), mmproj=str(projector))
    launch = plan(options, RTX_4090)
    assert launch.engine_kind == "lucebox" and launch.refusal is None
    vision = launch.to_json()["vision"]
    assert not vision["served"] and vision["memory_bytes"] > 0
    assert "--vision on would move the launch to llama-server" in vision["reason"]
    assert "--mmproj" not in launch.argv


def test_vision_on_moves_a_lucebox_launch_to_llama_server(lucebox_files):
    target, draft, projector = lucebox_files
    options = ServeOptions(model=str(target), draft=str(draft), mmproj=str(projector), vision="on")
    launch = plan(options, RTX_4090)
    assert launch.engine_kind == "llama-server"
    assert launch.engine_choice is not None
    assert "vision is on" in launch.engine_choice.reason
    assert "DDTree gain" in launch.engine_choice.reason
    assert launch.vision.served and "--mmproj" in launch.argv
    forced = plan(dataclasses.replace(options, engine="lucebox"), RTX_4090)
    assert forced.refusal is not None and "no vision" in str(forced.refusal)


def test_a_mismatched_projector_is_refused_on_a_lucebox_launch_too(lucebox_files, tmp_path):
    target, draft, _ = lucebox_files
    other = write_gguf(tmp_path / "mmproj-other.gguf", SIGLIP)
    launch = plan(ServeOptions(model=str(target), draft=str(draft), mmproj=str(other)), RTX_4090)
    assert launch.engine_kind == "lucebox"
    assert launch.refusal is not None and launch.refusal.problem_codes == ("mmproj-mismatch",)


def test_an_ollama_models_projector_layer_is_served_in_place(tmp_path, monkeypatch):
    root = tmp_path / "ollama"
    monkeypatch.setenv("OLLAMA_MODELS", str(root))
    blobs = root / "blobs"
    blobs.mkdir(parents=True)
    text = write_gguf(tmp_path / "text.gguf", TEXT).read_bytes()
    projector = write_gguf(tmp_path / "projector.gguf", SIGLIP).read_bytes()
    digests = [hashlib.sha256(body).hexdigest() for body in (text, projector)]
    for digest, body in zip(digests, (text, projector), strict=True):
        (blobs / f"sha256-{digest}").write_bytes(body)
    manifest = root / "manifests" / "registry.ollama.ai" / "library" / "tiny-vision" / "latest"
    manifest.parent.mkdir(parents=True)
    layers = [
        {"mediaType": ondisk.OLLAMA_MODEL_LAYER, "digest": f"sha256:{digests[0]}"},
        {"mediaType": ondisk.OLLAMA_PROJECTOR_LAYER, "digest": f"sha256:{digests[1]}"},
    ]
    manifest.write_text(json.dumps({"schemaVersion": 2, "layers": layers}))
    launch = plan(ServeOptions(model=str(blobs / f"sha256-{digests[0]}")))
    assert launch.vision.served
    assert launch.vision.path == str(blobs / f"sha256-{digests[1]}")


def test_vision_tensors_inside_the_model_file_are_told_apart(tmp_path):
    # Ollama's own vision blobs keep the encoder's ``v.*`` tensors in the model file itself.
    assert embedded_vision(write_gguf(tmp_path / "with-v.gguf", SIGLIP))
    text = write_gguf(tmp_path / "text.gguf", TEXT)
    assert not embedded_vision(text)
    launch = plan(ServeOptions(model=str(text)))
    assert launch.vision.reason.startswith("no projector: pass --mmproj PATH")


def test_off_loopback_images_wait_for_the_user_to_allow_url_fetches(model):
    # The pinned llama-server downloads any http(s) image_url a client names (handle_media).
    exposed = plan(ServeOptions(model=str(model), host="0.0.0.0"))
    assert not exposed.vision.served and "--mmproj" not in exposed.argv
    assert "fetches any http(s) image URL" in exposed.vision.reason
    assert "model.image_urls" in exposed.vision.reason
    f16 = read_projector(model.parent / "mmproj-tiny-F16.gguf")
    assert f16 is not None  # what it would cost is said, as on every other branch
    assert exposed.to_json()["vision"]["memory_bytes"] == projector_bytes(f16, on_gpu=True)
    on = plan(ServeOptions(model=str(model), host="0.0.0.0", vision="on"))
    assert on.refusal is not None and "fetches any http(s) image URL" in str(on.refusal)
    assert on.vision.memory_bytes == projector_bytes(f16, on_gpu=True)
    allowed = plan(
        ServeOptions(model=str(model), host="0.0.0.0"), settings=Settings(image_urls=True)
    )
    assert allowed.vision.served and "--mmproj" in allowed.argv
    assert plan(ServeOptions(model=str(model), host="127.0.0.1")).vision.served


def _set(sources: tuple[str, ...], free_mib: int, **options: object):
    return plan_set(
        resolve_paths(), ServeOptions(models=sources, **options), sources,  # type: ignore[arg-type]
        settings=Settings(), budget=card(free_mib), installs=installs_of(),
    )  # fmt: skip


def test_a_set_plans_the_projector_in_its_budget(model, tmp_path):
    (tmp_path / "other").mkdir()
    other = write_gguf(tmp_path / "other" / "other-Q8_0.gguf", TEXT)
    sources = (str(model), str(other))
    roomy = _set(sources, 2900)
    seeing = roomy.launches[0]
    assert seeing.vision.served and roomy.models_max == 2
    assert seeing.plan.memory_bytes.projector > 0
    ini = router_ini(roomy, Path("/slots"))
    section = ini.split(f"[{seeing.alias}]\n", 1)[1].split("\n\n", 1)[0]
    assert f"mmproj = {model.parent / 'mmproj-tiny-F16.gguf'}" in section.splitlines()
    # On a card where the projector would cost the set a model at once, auto leaves it out
    # and says so; --vision on serves it one model at a time.
    tight = _set(sources, 2500)
    assert tight.models_max == 2 and not tight.launches[0].vision.served
    reason = tight.launches[0].vision.reason
    assert "1 model(s) at once instead of 2" in reason and "--vision on" in reason
    assert tight.launches[0].plan.reasons["vision"] == reason
    assert "mmproj" not in router_ini(tight, Path("/slots"))
    on = _set(sources, 2500, vision="on")
    assert on.launches[0].vision.served and on.models_max == 1


def test_the_projector_term_matches_the_gpu_after_an_image(tmp_path):
    """`benchmarks/device/drive.sh vision_on_gpu` on an H200: the same text model served with
    and without this projector shape (F16, 896 px) held 1,104 MiB more after one image."""
    recorded = json.loads(
        (Path(__file__).parents[3] / "benchmarks/results/h200-vision-on-gpu.json").read_text()
    )["run"]["projector"]
    projector = read_projector(write_gguf(tmp_path / "mmproj-siglip-F16.gguf", SIGLIP))
    assert projector is not None
    measured_mib = recorded["engine_on_minus_off_mib"]
    assert abs(projector_bytes(projector, on_gpu=True) / MIB - measured_mib) / measured_mib < 0.05


def test_a_runtime_sized_projector_keeps_its_stand_in_image_after_the_pull(tmp_path):
    """gemma4v's converter writes a 224 px placeholder: the pulled file is planned at the
    shape planned before the pull, not at 1/16 of its image buffer."""
    header_says = dataclasses.replace(SIGLIP, projector_type="gemma4v", image_size=224)
    projector = read_projector(write_gguf(tmp_path / "mmproj-gemma4.gguf", header_says))
    stand_in = STAND_IN_SHAPES["gemma4v"]
    assert projector is not None and projector.projector_type == "gemma4v"
    assert (projector.image_size, projector.patch_size) == (
        stand_in.image_size,
        stand_in.patch_size,
    )
    plain = read_projector(write_gguf(tmp_path / "mmproj-siglip.gguf", SIGLIP))
    assert plain is not None and plain.image_size == SIGLIP.image_size  # other types: the header
