"""The engines a plan is made for: each kind's installed build, or its pinned one before any
build."""

from __future__ import annotations

import json
from dataclasses import dataclass
from importlib import resources

from lucebox.engine.engines.registry import EngineCapabilities, EngineManifest, KindName

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


@dataclass(frozen=True)
class Installs:
    """Every engine kind's build a plan may route to, found once by the caller
    (:func:`lucebox.engine.plan.planner.find_installs`) and handed to the planner."""

    llama_server: EngineView
    lucebox: EngineView

    def of(self, kind: KindName) -> EngineView:
        """The build of ``kind``."""
        return {"llama-server": self.llama_server, "lucebox": self.lucebox}[kind]

    @property
    def missing_build(self) -> KindName | None:
        """The kind not built yet (llama-server first), if one is not."""
        if self.llama_server.id is None:
            return "llama-server"
        if self.lucebox.id is None:
            return "lucebox"
        return None
