"""Vision projectors (``mmproj*.gguf``): what one is, where a model's is, whether it fits it.

A projector turns an image into embeddings of the text model's width; llama-server loads it
with ``--mmproj``. Its header names the projector type and (by the tensor the pinned engine's
``clip_n_mmproj_embd`` reads, tools/mtmd/clip.cpp) the width it projects to, which must be the
target's ``n_embd``: the engine refuses a mismatch only after loading both.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from lucebox.engine.models import ondisk
from lucebox.engine.models.checkresult import CheckResult, Problem, verdict_of
from lucebox.engine.models.gguf import GgufFormatError, GgufHeader, TensorInfo, read_header
from lucebox.engine.models.guard import check_model

CLIP_ARCH = "clip"
MISMATCH_CODE = "mmproj-mismatch"
PRECISION_ORDER = ("f16", "bf16", "f32", "q8_0")
"""Projector precisions most precise first (f16 is what the repos and the engine's docs
recommend; f32 is twice its size for no visible gain); any other name comes after."""

_OUT_WIDTH: dict[str, tuple[str, int]] = {
    "mlp": ("mm.2.weight", 1),
    "mlp_norm": ("mm.3.bias", 0),
    "gemma3": ("mm.input_projection.weight", 0),
    "gemma3nv": ("mm.input_projection.weight", 0),
    "gemma4v": ("mm.input_projection.weight", 1),
    "qwen2vl_merger": ("mm.1.bias", 0),
    "qwen2.5vl_merger": ("mm.1.bias", 0),
    "idefics3": ("mm.model.fc.weight", 1),
    "pixtral": ("mm.2.weight", 1),
    "lfm2": ("mm.2.weight", 1),
    "kimivl": ("mm.2.weight", 1),
    "internvl": ("mm.model.mlp.3.weight", 1),
}
"""Projector type -> (tensor, ggml dimension) that ``clip_n_mmproj_embd`` reads as the width
it projects to; a type not listed falls back to ``clip.vision.projection_dim``."""


@dataclass(frozen=True)
class ProjectorInfo:
    path: Path
    projector_type: str
    out_width: int | None
    """The text model width its embeddings have; None when the header does not say."""
    weights_bytes: int
    """Its tensors' bytes: what it takes on the device it runs on."""
    image_size: int
    patch_size: int
    n_embd: int
    """The vision encoder's own width (``clip.vision.embedding_length``)."""
    n_ff: int
    stand_in: str = ""
    """Why its size and image shape are not from its header ("" when they are)."""

    @property
    def precision(self) -> str:
        """The precision its file name says (``mmproj-...-F16.gguf``), lower case; "" if none."""
        stem = self.path.name.lower().removesuffix(".gguf")
        return next((p for p in PRECISION_ORDER if stem.endswith(p)), "")

    def to_json(self) -> dict[str, Any]:
        return {
            "path": str(self.path),
            "projector_type": self.projector_type,
            "out_width": self.out_width,
            "weights_bytes": self.weights_bytes,
            "image_size": self.image_size,
            "patch_size": self.patch_size,
        }


def _int(meta: dict[str, Any], key: str) -> int:
    value = meta.get(key)
    return int(value) if isinstance(value, int) and not isinstance(value, bool) else 0


def projector_of(header: GgufHeader, path: Path) -> ProjectorInfo | None:
    """The projector a header describes; None when it is not a vision projector."""
    meta = header.metadata
    if meta.get("general.architecture") != CLIP_ARCH or not meta.get("clip.has_vision_encoder"):
        return None
    kind = str(meta.get("clip.vision.projector_type") or meta.get("clip.projector_type") or "")
    tensors: dict[str, TensorInfo] = {t.name: t for t in header.tensors}
    out_width = _int(meta, "clip.vision.projection_dim") or None
    named = _OUT_WIDTH.get(kind)
    if named is not None and named[0] in tensors and len(tensors[named[0]].shape) > named[1]:
        out_width = tensors[named[0]].shape[named[1]]
    image_size = _int(meta, "clip.vision.image_size")
    patch_size = _int(meta, "clip.vision.patch_size")
    if kind in RUNTIME_SIZED:
        # The header's size is a placeholder: the pulled file must not plan a smaller image
        # buffer than the stand-in planned before the pull.
        image_size, patch_size = STAND_IN_SHAPES[kind].image_size, STAND_IN_SHAPES[kind].patch_size
    return ProjectorInfo(
        path=path,
        projector_type=kind,
        out_width=out_width,
        weights_bytes=sum(t.n_bytes for t in header.tensors),
        image_size=image_size,
        patch_size=patch_size,
        n_embd=_int(meta, "clip.vision.embedding_length"),
        n_ff=_int(meta, "clip.vision.feed_forward_length"),
    )


@dataclass(frozen=True)
class ImageShape:
    """What sizes an image's compute buffer: the header's image size, patch size and the
    vision encoder's widths."""

    image_size: int
    patch_size: int
    n_embd: int
    n_ff: int


_SIGLIP_896 = ImageShape(896, 14, 1152, 4304)
STAND_IN_SHAPES: dict[str, ImageShape] = {
    "gemma3": _SIGLIP_896,
    "qwen3vl_merger": ImageShape(768, 16, 1152, 4304),
    "gemma4v": _SIGLIP_896,
}
"""Projector type -> the shape a plan takes before the header is here. gemma3: Gemma 3's
SigLIP (vision_config: 896 px, 14 px patches, width 1152, FFN 4304). qwen3vl_merger: Qwen3.5
and 3.6's vision tower (width 1152, FFN 4304, 16 px patches, 2,304 position embeddings: the
768 px the converter writes). gemma4v: its converter writes a 224 px placeholder and the
engine sizes images at run time, so Gemma 3's 4,096 patches, the most of the three, stand in."""
RUNTIME_SIZED = ("gemma4v",)
"""Projector types whose header's image size is a placeholder: planned at their stand-in shape
after the pull too."""


def stand_in_projector(
    path: Path, projector_type: str, weights_bytes: int, why: str
) -> ProjectorInfo:
    """A projector not here yet, planned from what its preset says: its file size as its
    weights and its type's STAND_IN_SHAPES; ``why`` says so in the plan."""
    shape = STAND_IN_SHAPES[projector_type]
    return ProjectorInfo(
        path=path,
        projector_type=projector_type,
        out_width=None,
        weights_bytes=weights_bytes,
        image_size=shape.image_size,
        patch_size=shape.patch_size,
        n_embd=shape.n_embd,
        n_ff=shape.n_ff,
        stand_in=why,
    )


def read_projector(path: Path) -> ProjectorInfo | None:
    """The projector in ``path``; None when the file is not one (or cannot be read)."""
    try:
        return projector_of(read_header(path), path)
    except (GgufFormatError, OSError):
        return None


def projectors_beside(model_path: Path) -> tuple[Path, ...]:
    """``mmproj*.gguf`` files in the model's folder (the store, an HF snapshot, an LM Studio
    folder keep them beside the weights), most precise first; for an Ollama blob, the
    projector layer of its manifest."""
    folder = model_path.parent
    if not folder.is_dir():
        return ()
    found = [p for p in folder.iterdir() if p.name.lower().startswith("mmproj")]
    found = [p for p in found if p.name.lower().endswith(".gguf") and p.is_file()]
    ranked = sorted(found, key=lambda path: precision_rank(path.name))
    return (*ranked, *ondisk.ollama_projectors(model_path))


def embedded_vision(model_path: Path) -> bool:
    """Whether the model file holds vision tensors itself (Ollama's own vision models keep
    them in the one model blob): the pinned llama-server takes images only from a projector
    in a file of its own (``--mmproj``)."""
    try:
        header = read_header(model_path)
    except (GgufFormatError, OSError):
        return False
    return any(t.name.startswith("v.") for t in header.tensors)


def precision_rank(name: str) -> tuple[int, str]:
    """Where a projector file of this name comes in PRECISION_ORDER (then by name)."""
    stem = name.lower().removesuffix(".gguf")
    order = [i for i, p in enumerate(PRECISION_ORDER) if stem.endswith(p)]
    return (order[0] if order else len(PRECISION_ORDER), name)


def mismatch(projector: ProjectorInfo | None, path: Path, target_width: int | None) -> str | None:
    """Why this projector cannot serve a target of ``target_width``; None when it can."""
    if projector is None:
        return f"{path.name} is not a vision projector (no clip header with a vision encoder)"
    if projector.out_width is None or target_width is None:
        return None
    if projector.out_width != target_width:
        return (
            f"{path.name} ({projector.projector_type}) projects images to width "
            f"{projector.out_width}, but the model's embeddings are {target_width} wide: "
            "it belongs to another model"
        )
    return None


def check_projector(path: Path, target_path: Path) -> CheckResult:
    """``models check MODEL --mmproj P``: the projector against its target."""
    target = check_model(target_path, instruct_guard=False)
    width = target.info.embedding_length if target.info is not None else None
    projector = read_projector(path)
    why = mismatch(projector, path, width)
    problems = [Problem(MISMATCH_CODE, "error", why)] if why else []
    return CheckResult(str(path), verdict_of(problems), tuple(problems), None)
