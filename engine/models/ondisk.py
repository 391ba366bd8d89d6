"""GGUFs other programs already keep on this PC: the Hugging Face cache, LM Studio's models
folder and Ollama's blob store. lucebox uses them where they are (never a copy) and never
deletes them: they belong to those programs.

Where the name of a file carries its sha256 (a Hugging Face cache blob, an Ollama blob), a
pull whose expected sha256 matches uses the file after hashing it once; LM Studio's files are
matched by name and size, then hashed. Folders: ``HF_HUB_CACHE``/``HF_HOME`` as
huggingface-hub reads them; LM Studio's ``~/.lmstudio/models`` and its older
``~/.cache/lm-studio/models``; Ollama's ``OLLAMA_MODELS`` or ``~/.ollama/models``.
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

Origin = Literal["hf-cache", "lmstudio", "ollama"]
OLLAMA_MODEL_LAYER = "application/vnd.ollama.image.model"
"""The manifest layer that holds the GGUF (others: template, params, license, projector)."""
_SHA256 = re.compile(r"^[0-9a-f]{64}$")


@dataclass(frozen=True)
class FoundGguf:
    """A GGUF another program keeps."""

    origin: Origin
    name: str
    """How that program names it: OWNER/REPO/FILE, PUBLISHER/REPO/FILE, or NAME:TAG."""
    path: Path
    size_bytes: int
    sha256: str | None
    """Known without reading the file when its name carries it (HF blob, Ollama digest)."""

    def to_json(self) -> dict[str, Any]:
        return {
            "origin": self.origin,
            "name": self.name,
            "path": str(self.path),
            "size_bytes": self.size_bytes,
            "sha256": self.sha256,
        }


def hf_cache_dir() -> Path:
    if os.environ.get("HF_HUB_CACHE"):
        return Path(os.environ["HF_HUB_CACHE"])
    home = os.environ.get("HF_HOME") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache", "huggingface"
    )
    return Path(home) / "hub"


def lmstudio_dirs() -> list[Path]:
    home = Path.home()
    return [home / ".lmstudio" / "models", home / ".cache" / "lm-studio" / "models"]


def ollama_dir() -> Path:
    return Path(os.environ.get("OLLAMA_MODELS") or Path.home() / ".ollama" / "models")


def other_app_dirs() -> list[Path]:
    """Folders whose files lucebox never deletes."""
    return [hf_cache_dir(), *lmstudio_dirs(), ollama_dir()]


def belongs_to_other_app(path: Path) -> bool:
    resolved = path.absolute()
    return any(resolved.is_relative_to(folder.absolute()) for folder in other_app_dirs())


def _hf_cache() -> list[FoundGguf]:
    from huggingface_hub import scan_cache_dir
    from huggingface_hub.errors import CacheNotFound

    try:
        info = scan_cache_dir(hf_cache_dir())
    except (CacheNotFound, OSError):
        return []
    found = []
    for repo in info.repos:
        for revision in repo.revisions:
            for item in revision.files:
                if not item.file_name.endswith(".gguf"):
                    continue
                blob = item.blob_path.name
                found.append(
                    FoundGguf(
                        "hf-cache",
                        f"{repo.repo_id}/{item.file_name}",
                        item.file_path,
                        item.size_on_disk,
                        blob if _SHA256.match(blob) else None,
                    )
                )
    return found


def _lmstudio() -> list[FoundGguf]:
    found = []
    for folder in lmstudio_dirs():
        if not folder.is_dir():
            continue
        for path in sorted(folder.rglob("*.gguf")):
            if path.is_file():
                name = path.relative_to(folder).as_posix()
                found.append(FoundGguf("lmstudio", name, path, path.stat().st_size, None))
    return found


def _ollama() -> list[FoundGguf]:
    root = ollama_dir()
    manifests = root / "manifests"
    if not manifests.is_dir():
        return []
    found = []
    for manifest in sorted(p for p in manifests.rglob("*") if p.is_file()):
        try:
            layers = json.loads(manifest.read_text("utf-8")).get("layers") or []
        except (OSError, ValueError, AttributeError):
            continue
        for layer in layers:
            digest = str(layer.get("digest", "")) if isinstance(layer, dict) else ""
            if layer.get("mediaType") != OLLAMA_MODEL_LAYER or not digest.startswith("sha256:"):
                continue
            sha = digest.removeprefix("sha256:")
            blob = root / "blobs" / f"sha256-{sha}"
            if blob.is_file() and _SHA256.match(sha):
                # registry/namespace/name/tag, written as Ollama prints it: `tiny:latest` for
                # its own library, `hf.co/OWNER/REPO:Q4_K_M` for a model pulled from the Hub.
                parts = list(manifest.relative_to(manifests).parts)
                if parts[:2] == ["registry.ollama.ai", "library"]:
                    parts = parts[2:]
                name = f"{'/'.join(parts[:-1])}:{parts[-1]}"
                found.append(FoundGguf("ollama", name, blob, blob.stat().st_size, sha))
    return found


OLLAMA_PROJECTOR_LAYER = "application/vnd.ollama.image.projector"


def ollama_projectors(model_blob: Path) -> tuple[Path, ...]:
    """The projector blobs of Ollama's manifests whose model layer is ``model_blob`` (a vision
    model Ollama pulled with a separate projector); none for any other file."""
    root = ollama_dir()
    manifests = root / "manifests"
    name = model_blob.name
    if (
        not name.startswith("sha256-")
        or model_blob.parent != root / "blobs"
        or not manifests.is_dir()
    ):
        return ()
    found: list[Path] = []
    for manifest in sorted(p for p in manifests.rglob("*") if p.is_file()):
        try:
            layers = json.loads(manifest.read_text("utf-8")).get("layers") or []
        except (OSError, ValueError, AttributeError):
            continue
        digests = {
            str(layer.get("mediaType")): str(layer.get("digest", "")).replace(":", "-", 1)
            for layer in layers
            if isinstance(layer, dict)
        }
        projector = digests.get(OLLAMA_PROJECTOR_LAYER)
        if digests.get(OLLAMA_MODEL_LAYER) == name and projector:
            path = root / "blobs" / projector
            if path.is_file() and path not in found:
                found.append(path)
    return tuple(found)


def find_all() -> list[FoundGguf]:
    """Every GGUF the other programs keep here, by origin."""
    return [*_hf_cache(), *_lmstudio(), *_ollama()]


def find_match(file_name: str, size_bytes: int | None, sha256: str) -> FoundGguf | None:
    """A file another program keeps that should be this one: the same sha256 by name, else
    (LM Studio) the same file name and size. The caller hashes it before use."""
    candidates = find_all()
    for item in candidates:
        if item.sha256 == sha256:
            return item
    for item in candidates:
        if (
            item.sha256 is None
            and item.path.name == Path(file_name).name
            and (size_bytes is None or item.size_bytes == size_bytes)
        ):
            return item
    return None
