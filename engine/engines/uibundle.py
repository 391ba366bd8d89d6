"""The llama.cpp web UI's built files, for a front that serves the chat page itself.

llama-server embeds the page in its binary; an engine without it (the Lucebox engine, a
llama-server built without the UI) still gets the page: lucebox's front serves the same pinned
bundle from the llama.cpp build that lucebox installed beside it (installed into the engine's
folder as ``ui/``; an older install still has it in its build folder, ``tools/ui/dist``).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from lucebox.engine.core.paths import Paths
from lucebox.engine.engines.registry import EngineManifest, list_engines

UI_FOLDER = "ui"
"""The bundle's folder inside an installed engine's folder."""
BUILD_UI_FOLDER = Path("tools") / "ui" / "dist"
"""Where the llama.cpp build writes the built bundle (``scripts/ui-assets.cmake``)."""


@dataclass(frozen=True)
class UiBundle:
    """Where the page's files are, or why there are none."""

    folder: Path | None
    why_none: str = ""


def bundle_folder(paths: Paths, engine: EngineManifest) -> Path | None:
    """The folder holding ``engine``'s built UI (its ``index.html``), if it has one."""
    installed = Path(engine.server_path).parent.parent / UI_FOLDER
    folders = [installed]
    if engine.build_key:
        folders.append(paths.builds_dir / engine.build_key / BUILD_UI_FOLDER)
    return next((f for f in folders if (f / "index.html").is_file()), None)


def find_bundle(paths: Paths) -> UiBundle:
    """The UI of the newest installed llama.cpp build that has one; else why none has."""
    builds = [e for e in list_engines(paths) if e.kind == "llama-server"]
    for engine in sorted(builds, key=lambda e: e.installed_at, reverse=True):
        folder = bundle_folder(paths, engine)
        if folder is not None:
            return UiBundle(folder)
    if not builds:
        return UiBundle(None, "no llama.cpp build is installed: run `lucebox engine build`")
    newest = max(builds, key=lambda e: e.installed_at)
    why = newest.webui_detail or "it was built without the UI"
    return UiBundle(None, f"{newest.id} has no web UI: {why}")
