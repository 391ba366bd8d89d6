"""Quant labels from file names, split-file groups and sidecars: how a GGUF repo's files are read.

Pure: (file path, size, sha256) rows in, quant candidates and sidecars out. The name only labels
a candidate; the ranking is by bits per weight (weight bytes over the parameter count of the
header), because names lie (``UD-Q4_K_XL`` holds Q5/Q6 tensors) and some files carry none.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import PurePosixPath
from typing import Literal

_QUANT = re.compile(
    r"(?<![A-Za-z0-9])((?:UD-)?(?:IQ[1-4]_(?:XXS|XS|S|M|NL)|Q[2-8]_K(?:_(?:XXS|XS|S|M|L|XL))?"
    r"|Q[4-8]_[01]|TQ[12]_0|MXFP4(?:_MOE)?|BF16|F16|F32))(?![A-Za-z0-9])",
    re.IGNORECASE,
)
_SPLIT = re.compile(r"^(?P<stem>.+)-(?P<no>\d{5})-of-(?P<count>\d{5})\.gguf$")
SidecarKind = Literal["mmproj", "mtp", "draft"]
LOW_BITS_PER_WEIGHT = 3.0
"""Below this a quant loses too much: never chosen unless the user names it (Q2_K ~2.6 bpw,
IQ3_XXS ~3.06, Q3_K_S ~3.4)."""


@dataclass(frozen=True)
class RepoFile:
    """One file of a repo at a pinned revision, with the LFS sha256 the Hub publishes."""

    path: str
    size_bytes: int
    sha256: str | None


@dataclass(frozen=True)
class QuantGroup:
    """One quant of the model: a single GGUF or its split shards, the first shard first."""

    quant: str
    files: tuple[RepoFile, ...]

    @property
    def size_bytes(self) -> int:
        return sum(f.size_bytes for f in self.files)

    @property
    def first(self) -> RepoFile:
        return self.files[0]


@dataclass(frozen=True)
class Sidecar:
    """A GGUF beside the quants that is not a quant: a projector, an MTP head or a draft."""

    kind: SidecarKind
    file: RepoFile
    quant: str | None


@dataclass(frozen=True)
class RepoLayout:
    candidates: tuple[QuantGroup, ...]
    sidecars: tuple[Sidecar, ...]
    skipped: tuple[str, ...]
    """Why a GGUF was left out (a split group with shards missing)."""


def quant_from_name(path: str) -> str | None:
    """The quant label a file name carries (``Q4_K_M``, ``UD-IQ3_XXS``, ``BF16``), upper-cased.

    The folder counts too: some repos keep each quant's shards in a folder named after it.
    """
    found = _QUANT.findall(path)
    return found[-1].upper() if found else None


def sidecar_kind(path: str) -> SidecarKind | None:
    name = PurePosixPath(path).name.lower()
    if "mmproj" in name:
        return "mmproj"
    if name.startswith("mtp-"):
        return "mtp"
    if any(word in name for word in ("draft", "dflash", "eagle")):
        return "draft"
    return None


def layout(files: list[RepoFile]) -> RepoLayout:
    """Group a repo's GGUFs into quant candidates (split shards together) and sidecars."""
    singles: list[QuantGroup] = []
    sidecars: list[Sidecar] = []
    shards: dict[tuple[str, int], dict[int, RepoFile]] = {}
    for item in sorted(files, key=lambda f: f.path):
        if not item.path.lower().endswith(".gguf"):
            continue
        kind = sidecar_kind(item.path)
        if kind is not None:
            sidecars.append(Sidecar(kind, item, quant_from_name(item.path)))
            continue
        split = _SPLIT.match(item.path)
        if split:
            key = (split["stem"], int(split["count"]))
            shards.setdefault(key, {})[int(split["no"])] = item
            continue
        singles.append(QuantGroup(_label(item.path), (item,)))
    skipped: list[str] = []
    for (stem, count), found in sorted(shards.items()):
        missing = [n for n in range(1, count + 1) if n not in found]
        if missing:
            skipped.append(
                f"{stem}: shards {', '.join(map(str, missing))} of {count} are not in the repo"
            )
            continue
        ordered = tuple(found[n] for n in range(1, count + 1))
        singles.append(QuantGroup(_label(stem), ordered))
    return RepoLayout(tuple(singles), tuple(sidecars), tuple(skipped))


def _label(path: str) -> str:
    return quant_from_name(path) or PurePosixPath(path).name.removesuffix(".gguf")


def bits_per_weight(weight_bytes: int, parameter_count: int) -> float:
    return 8 * weight_bytes / parameter_count if parameter_count else 0.0
