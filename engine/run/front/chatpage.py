"""The chat page served by the front itself, for an engine that has none (pure but for reading
the page's files).

The page is llama.cpp's web UI (:mod:`lucebox.engine.engines.uibundle` finds its files). At start
it reads ``/props`` (the model, its context, its defaults and whether it sees images; a 401
there makes it ask for the key), ``/v1/models``, and may read ``/slots``, ``/tools`` and
``POST /v1/streams/lookup`` (streams to resume after a reload). llama-server answers these
itself; for an engine that lacks them the front answers them from what lucebox planned. The
page's files are public as llama-server has them; the calls above want the key like any API
path.
"""

from __future__ import annotations

import json
import mimetypes
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from lucebox.engine.run.front.frontguard import is_page_file

if TYPE_CHECKING:
    from lucebox.engine.plan.samplingdefaults import SamplingDefaults

INDEX = "index.html"
_TYPES = {
    ".html": "text/html; charset=utf-8",
    ".js": "application/javascript",
    ".css": "text/css",
    ".json": "application/json",
    ".webmanifest": "application/manifest+json",
    ".svg": "image/svg+xml",
    ".woff2": "font/woff2",
}
BUILD_INFO = "lucebox front (the Lucebox engine serves)"


@dataclass(frozen=True)
class ChatPage:
    """The page the front serves and what it answers for the engine."""

    folder: Path
    """The built UI (its ``index.html``)."""
    answers_api: bool
    """The engine lacks the page's calls (``/props``...): the front answers them."""


@dataclass(frozen=True)
class PageFacts:
    """What ``/props`` and ``/slots`` say: the served model as planned."""

    model: str
    ctx: int
    images: bool
    sampling: SamplingDefaults | None = None


def page_file(folder: Path, path: str) -> tuple[bytes, str] | None:
    """The page's file at URL ``path`` and its content type; None when the bundle has none
    there (a path leaving the folder finds nothing)."""
    name = path.lstrip("/") or INDEX
    root = folder.resolve()
    found = (root / name).resolve()
    if not found.is_relative_to(root) or not found.is_file():
        return None
    content_type = _TYPES.get(found.suffix) or mimetypes.guess_type(found.name)[0]
    return found.read_bytes(), content_type or "application/octet-stream"


def page_api(method: str, path: str, facts: PageFacts) -> bytes | None:
    """The front's answer to one of the page's calls the engine lacks; None for any other."""
    if method == "GET" and path in ("/props", "/v1/props"):
        return json.dumps(props(facts)).encode()
    if method == "GET" and path == "/slots":
        return json.dumps([slot(facts)]).encode()
    if method == "GET" and path == "/tools":
        return b"[]"  # no server-side tools: the page offers none
    if method == "POST" and path == "/v1/streams/lookup":
        return b"[]"  # no stream outlives its connection: nothing to resume
    return None


def props(facts: PageFacts) -> dict[str, Any]:
    """llama-server's ``/props`` in the fields the page reads."""
    return {
        "default_generation_settings": slot(facts),
        "total_slots": 1,
        "model_path": facts.model,
        "model_alias": facts.model,
        "role": "model",
        "modalities": {"vision": facts.images, "audio": False, "video": False},
        "chat_template": "",
        "bos_token": "",
        "eos_token": "",
        "build_info": BUILD_INFO,
        "is_sleeping": False,
    }


def slot(facts: PageFacts) -> dict[str, Any]:
    """One slot as llama-server's ``/slots`` has it: the context and the sampling defaults."""
    params: dict[str, Any] = {"n_predict": -1, "max_tokens": -1, "stream": True}
    if facts.sampling is not None:
        params.update(facts.sampling.fields())
    return {
        "id": 0,
        "id_task": -1,
        "n_ctx": facts.ctx,
        "speculative": False,
        "is_processing": False,
        "params": params,
    }


def page_answer(
    page: ChatPage | None, method: str, path: str, facts: PageFacts
) -> tuple[bytes, str] | None:
    """What the front answers itself for the page (its files, its calls the engine lacks),
    with the content type; None: the request goes on as any other."""
    if page is None:
        return None
    if page.answers_api and (api := page_api(method, path, facts)) is not None:
        return api, "application/json"
    if method == "GET" and is_page_file(path):
        return page_file(page.folder, path)
    return None
