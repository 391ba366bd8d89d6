"""What the user asked for on the command line, and the same resolved over config.toml.

``resolve`` runs once per decision (a launch, a preset table, a re-plan); every launch decision
reads the ``Resolved`` it returns.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from lucebox.engine.core.errors import UsageError
from lucebox.engine.machine.config import Settings
from lucebox.engine.plan import speculation
from lucebox.engine.plan.speculation import SpecMode

CacheProfile = Literal["agent", "off"]


@dataclass(frozen=True)
class ServeOptions:
    """What the user asked for on the command line; None means "not given"."""

    preset: str | None = None
    model: str | None = None
    draft: str | None = None
    spec: SpecMode | None = None
    cache: CacheProfile | None = None
    ctx: int | None = None
    host: str | None = None
    port: int | None = None
    gpus: tuple[int, ...] | None = None
    """NVML indices of the GPUs to use; None reads gpu.indices (empty: every NVIDIA GPU)."""
    allow_base: bool = False
    vram_mib: tuple[int, ...] | None = None
    """Plan for cards with this much free memory instead of the GPUs that are here."""
    draft_max: int | None = None
    """A shorter draft length than the mode's own (the speculation guard's re-plan)."""
    rpc: tuple[str, ...] | None = None
    """``host:port`` of `lucebox worker` peers; None reads rpc.peers."""

    def to_args(self) -> list[str]:
        """The `lucebox serve` arguments that give these options."""
        pairs = [
            ("--preset", self.preset),
            ("--model", self.model),
            ("--draft", self.draft),
            ("--spec", self.spec),
            ("--cache", self.cache),
            ("--ctx", self.ctx),
            ("--host", self.host),
            ("--port", self.port),
            ("--gpus", ",".join(map(str, self.gpus)) if self.gpus is not None else None),
            ("--vram-mib", ",".join(map(str, self.vram_mib)) if self.vram_mib else None),
            ("--rpc", ",".join(self.rpc) if self.rpc is not None else None),
        ]
        args = [item for flag, value in pairs if value is not None for item in (flag, str(value))]
        return [*args, "--allow-base"] if self.allow_base else args


@dataclass(frozen=True)
class Resolved:
    """Flags over config.toml, resolved once: every launch decision reads this."""

    preset_id: str | None
    ctx: int | None
    spec: SpecMode
    cache: CacheProfile
    host: str
    port: int
    gpus: tuple[int, ...]
    """The GPUs asked for; empty: every NVIDIA GPU lucebox finds."""
    rpc: tuple[str, ...]
    """The RPC peers asked for, in the order the engine numbers their devices."""
    allow_base: bool
    api_key: str | None


def resolve(options: ServeOptions, settings: Settings) -> Resolved:
    spec = options.spec or settings.spec or "auto"
    if spec not in speculation.SPEC_MODES:
        raise UsageError(
            f"model.spec = {spec!r} in config.toml is not a speculation mode",
            hint=f"use one of {', '.join(speculation.SPEC_MODES)}",
        )
    return Resolved(
        preset_id=None if options.model else (options.preset or settings.preset or None),
        ctx=options.ctx or settings.ctx or None,
        spec=spec,
        cache=options.cache or "agent",
        host=options.host or settings.host,
        port=options.port or settings.port,
        gpus=options.gpus if options.gpus is not None else settings.gpu_indices,
        rpc=options.rpc if options.rpc is not None else settings.rpc_peers,
        allow_base=options.allow_base or settings.allow_base,
        api_key=settings.api_key or None,
    )
