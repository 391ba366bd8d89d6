"""GGUFs other programs keep (a Hugging Face cache, LM Studio's folder, Ollama's blob store),
planted in fake home folders with the layouts those programs write: found, used in place
without a copy, caught by their hash when changed, never deleted."""

from __future__ import annotations

import dataclasses
import hashlib
import json
from pathlib import Path

import pytest

from lucebox.engine.core.errors import HashMismatchError
from lucebox.engine.core.paths import resolve_paths
from lucebox.engine.models import ondisk
from lucebox.engine.models.pull import pull_model
from lucebox.engine.models.records import remove_model
from support.ggufgen import ModelSpec, cached_gguf
from support.hubserver import COMMIT, HubFile, HubState, serve_hub
from tests.conftest import run_lucebox

REPO = "acme/tiny-GGUF"


@pytest.fixture(scope="module")
def quants() -> dict[str, bytes]:
    return {
        q: cached_gguf(dataclasses.replace(ModelSpec(basename="tiny-ondisk"), quant=q)).read_bytes()
        for q in ("Q8_0", "Q4_0")
    }


@pytest.fixture
def home(monkeypatch, tmp_path) -> Path:
    home = tmp_path / "home"
    home.mkdir()
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.setenv("HF_HOME", str(home / ".cache" / "huggingface"))
    for name in ("HF_HUB_CACHE", "OLLAMA_MODELS", "XDG_CACHE_HOME", "HF_TOKEN", "HF_HUB_OFFLINE"):
        monkeypatch.delenv(name, raising=False)
    return home


def plant_hf_cache(home: Path, repo: str, name: str, body: bytes) -> Path:
    """The layout huggingface-hub writes: blobs named by sha256, snapshot links, refs/main."""
    root = home / ".cache" / "huggingface" / "hub" / f"models--{repo.replace('/', '--')}"
    sha = hashlib.sha256(body).hexdigest()
    (root / "blobs").mkdir(parents=True)
    (root / "blobs" / sha).write_bytes(body)
    snapshot = root / "snapshots" / COMMIT
    snapshot.mkdir(parents=True)
    (snapshot / name).symlink_to(Path("..") / ".." / "blobs" / sha)
    (root / "refs").mkdir()
    (root / "refs" / "main").write_text(COMMIT)
    return snapshot / name


def plant_lmstudio(home: Path, name: str, body: bytes) -> Path:
    path = home / ".lmstudio" / "models" / name
    path.parent.mkdir(parents=True)
    path.write_bytes(body)
    return path


def plant_ollama(home: Path, model: str, tag: str, body: bytes) -> Path:
    """Ollama's store: content-addressed blobs and a manifest naming the model layer."""
    root = home / ".ollama" / "models"
    sha = hashlib.sha256(body).hexdigest()
    blob = root / "blobs" / f"sha256-{sha}"
    blob.parent.mkdir(parents=True)
    blob.write_bytes(body)
    template = b"{{ .Prompt }}"
    (root / "blobs" / f"sha256-{hashlib.sha256(template).hexdigest()}").write_bytes(template)
    manifest = root / "manifests" / "registry.ollama.ai" / "library" / model / tag
    manifest.parent.mkdir(parents=True)
    layers = [
        {"mediaType": ondisk.OLLAMA_MODEL_LAYER, "digest": f"sha256:{sha}", "size": len(body)},
        {
            "mediaType": "application/vnd.ollama.image.template",
            "digest": f"sha256:{hashlib.sha256(template).hexdigest()}",
            "size": len(template),
        },
    ]
    manifest.write_text(json.dumps({"schemaVersion": 2, "layers": layers}))
    return blob


@pytest.fixture
def hub(monkeypatch, quants):
    state = HubState()
    for q, body in quants.items():
        state.add(REPO, f"tiny-{q}.gguf", HubFile(body))
    with serve_hub(state) as served:
        monkeypatch.setenv("HF_ENDPOINT", served.base_url)
        yield served


def test_every_kind_of_store_is_found(home, quants):
    plant_hf_cache(home, "acme/cached-GGUF", "cached-Q4_0.gguf", quants["Q4_0"])
    plant_lmstudio(home, "acme/lm-GGUF/lm-Q8_0.gguf", quants["Q8_0"])
    blob = plant_ollama(home, "tiny", "latest", quants["Q4_0"])
    found = {f.origin: f for f in ondisk.find_all()}
    assert set(found) == {"hf-cache", "lmstudio", "ollama"}
    assert found["hf-cache"].name == "acme/cached-GGUF/cached-Q4_0.gguf"
    assert found["hf-cache"].sha256 == hashlib.sha256(quants["Q4_0"]).hexdigest()
    assert (
        found["lmstudio"].name == "acme/lm-GGUF/lm-Q8_0.gguf" and found["lmstudio"].sha256 is None
    )
    assert (found["ollama"].name, found["ollama"].path) == ("tiny:latest", blob)

    listed = run_lucebox("models", "list", "--all", "--json")
    assert listed.returncode == 0, listed.stderr
    assert {f["origin"] for f in json.loads(listed.stdout)["on_disk"]} == set(found)


def test_a_pull_uses_ollamas_blob_in_place_and_never_deletes_it(home, hub, quants):
    blob = plant_ollama(home, "tiny", "q4", quants["Q4_0"])
    paths = resolve_paths()
    record = pull_model(paths, f"hf:{REPO}/tiny-Q4_0.gguf")
    assert record.main_path == blob and not record.files[0].owned
    assert record.sha256_source == "ollama-blob" and record.revision == COMMIT
    assert not hub.bytes_served.get((REPO, "tiny-Q4_0.gguf"))  # not a byte downloaded
    assert not list((paths.models_dir / "files").rglob("*.gguf"))  # nor copied

    # The plan serves that very file.
    plan = run_lucebox("plan", "--model", f"hf:{REPO}/tiny-Q4_0.gguf", "--json")
    assert plan.returncode == 0, plan.stderr
    assert json.loads(plan.stdout)["target"]["path"] == str(blob)

    assert remove_model(paths, record.name, delete_foreign=True) == []
    assert blob.exists()


def test_a_changed_file_is_caught_by_its_hash(home, hub, quants):
    blob = plant_ollama(home, "tiny", "q8", quants["Q8_0"])
    changed = bytearray(blob.read_bytes())
    changed[-1] ^= 0xFF
    blob.write_bytes(bytes(changed))
    with pytest.raises(HashMismatchError, match="changed on disk"):
        pull_model(resolve_paths(), f"hf:{REPO}/tiny-Q8_0.gguf")


def test_lm_studio_files_are_matched_by_name_then_hash(home, hub, quants):
    same = plant_lmstudio(home, "acme/tiny-GGUF/tiny-Q8_0.gguf", quants["Q8_0"])
    record = pull_model(resolve_paths(), f"hf:{REPO}/tiny-Q8_0.gguf")
    assert record.main_path == same and record.sha256_source == "lmstudio"
    # Same name and size, other bytes: not this model, so it is downloaded instead.
    other = bytearray(quants["Q4_0"].ljust(len(quants["Q4_0"]), b"\0"))
    other[-1] ^= 0xFF
    plant_lmstudio(home, "other/tiny-GGUF/tiny-Q4_0.gguf", bytes(other))
    record = pull_model(resolve_paths(), f"hf:{REPO}/tiny-Q4_0.gguf")
    assert record.files[0].owned and hub.bytes_served[(REPO, "tiny-Q4_0.gguf")] > 0
