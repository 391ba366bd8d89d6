"""The engine a plan is made for: the installed one, or the pinned one before any build."""

from __future__ import annotations

import json
from dataclasses import dataclass
from importlib import resources

from lucebox.engine.engines.registry import EngineCapabilities, EngineManifest

PLANNED_SERVER_PATH = "llama-server"
"""argv[0] of a plan made before any engine is built (the build decides the folder)."""


@dataclass(frozen=True)
class EngineView:
    """The engine a plan is made for: the installed one, or the pinned one not built yet."""

    id: str | None
    version: str
    server_path: str
    capabilities: EngineCapabilities
    bsa: bool = False
    """A Lucebox build with Block-Sparse-Attention, PFlash's fast kernel."""

    @classmethod
    def of(cls, manifest: EngineManifest | None) -> EngineView:
        if manifest is None:
            return pinned_engine()
        return cls(
            manifest.id,
            manifest.version,
            manifest.server_path,
            manifest.capabilities,
            bool(manifest.options.get("bsa")),
        )


def pinned_engine() -> EngineView:
    """The pinned engine's capabilities as recorded beside the pin (pin_capabilities.json)."""
    text = (
        resources.files("lucebox.engine.engines")
        .joinpath("pin_capabilities.json")
        .read_text("utf-8")
    )
    data = json.loads(text)
    caps = EngineCapabilities(
        spec_types=tuple(data["spec_types"]),
        kv_cache_types=tuple(data["kv_cache_types"]),
        model_archs=tuple(data["model_archs"]),
        swa_patterns={k: (int(v[0]), bool(v[1])) for k, v in data["swa_patterns"].items()},
    )
    return EngineView(None, data["version"], PLANNED_SERVER_PATH, caps)
