"""What the user asked for on the command line, and the same resolved over config.toml.

``resolve`` runs once per decision (a launch, a preset table, a re-plan); every launch decision
reads the ``Resolved`` it returns.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from typing import Any, Literal, NoReturn, TypeVar

from lucebox.engine.core.errors import UsageError
from lucebox.engine.core.units import MIB
from lucebox.engine.machine.config import Settings
from lucebox.engine.models.shortname import NameMatch
from lucebox.engine.plan.enginechoice import ENGINE_MODES, EngineMode
from lucebox.engine.plan.flagtypes import (
    id_list,
    index_list,
    mib_list,
    non_negative_int,
    peer_list,
    port_number,
    positive_int,
)
from lucebox.engine.plan.lucebox.luceboxdevices import PLACEMENT_MODES, PlacementMode
from lucebox.engine.plan.lucebox.luceboxplan import KV_MODES, PREFILL_MODES, KvMode, PrefillMode
from lucebox.engine.plan.sidemodels import SideRole
from lucebox.engine.plan.speculation import speculation
from lucebox.engine.plan.speculation.speculation import SpecMode

CacheProfile = Literal["agent", "off"]
VisionMode = Literal["auto", "on", "off"]
VISION_MODES: tuple[VisionMode, ...] = ("auto", "on", "off")


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
    p_min: float | None = None
    """Another draft p-min than the mode's own (a calibration trial)."""
    spec_type: str | None = None
    """The one speculation type of the mode's candidates to plan (a calibration trial: a
    combination, ``ngram-mod,draft-mtp``, runs under its model draft's mode)."""
    measured_at: str | None = None
    """The sampling whose measured rates choose the speculation (``greedy``, ``t0.7``: what the
    calibration measured the served mix at); None: the launch's sampling defaults'."""
    engine: EngineMode | None = None
    """Which engine serves; None reads engine.kind (empty: auto, the planner chooses)."""
    engine_id: str | None = None
    """The installed build that serves instead of engine.id's (``engine update``'s self-test
    serves the new build with it before it becomes engine.id)."""
    prefill: PrefillMode | None = None
    """PFlash speculative prefill on the Lucebox engine; None is off."""
    placement: PlacementMode | None = None
    """The Lucebox engine on two GPUs; None is auto (the planner chooses)."""
    kv_mode: KvMode | None = None
    """``--kv-mode``: exact or KVFlash pinned by the user; None is auto."""
    kv_type: str | None = None
    """The Lucebox engine's K=V cache type (a long-context mode's calibration trial); None lets
    the plan choose."""
    rpc: tuple[str, ...] | None = None
    """``host:port`` of `lucebox worker` peers; None reads rpc.peers."""
    models: tuple[str, ...] = ()
    """A served set (several --model): planned by servedsetplan.plan_set, ``model`` stays None."""
    quant: str | None = None
    """The quant of a repo named by name (``--quant``); None lets the planner choose."""
    mmproj: str | None = None
    """The vision projector file (``--mmproj``); None reads model.mmproj, else the one beside
    the weights."""
    vision: VisionMode | None = None
    """Serve the projector; None reads model.vision (empty: auto)."""
    preset_among: tuple[str, ...] = ()
    """The presets a short name named (``up qwen3.6``): the plan picks the one for the card."""
    users: int | None = None
    """People served at once (llama-server slots); None reads server.users."""
    embed_model: str | None = None
    """An embedding model served beside the chat model; None reads embeddings.model."""
    rerank_model: str | None = None
    """A reranker served beside the chat model; None reads rerank.model."""

    @property
    def names_a_model(self) -> bool:
        return bool(self.model or self.models or self.preset or self.preset_among)

    def named(self, match: NameMatch) -> ServeOptions:
        """These options with the model a short name resolved to; refuses a second model."""
        if self.names_a_model:
            refuse_second_model(match.name.text)
        if match.source is not None:
            return replace(self, model=match.source, quant=match.quant or self.quant)
        if len(match.preset_ids) == 1:
            return replace(self, preset=match.preset_ids[0])
        return replace(self, preset_among=match.preset_ids)

    def to_args(self) -> list[str]:
        """The `lucebox serve` arguments that give these options (a detached child's argv)."""
        args = [arg for flag in LAUNCH_FLAGS for arg in flag.argv(getattr(self, flag.field))]
        return args + [item for source in self.models for item in ("--model", source)]


def refuse_second_model(name: str) -> NoReturn:
    raise UsageError(f"'{name}' and --model/--preset both name the model", hint="give one of them")


@dataclass(frozen=True)
class LaunchFlag:
    """One flag of `up`, `serve` and `plan`: the CLI's parser is built from it, and a detached
    child gets its options back through it, so the two cannot drift."""

    name: str
    field: str
    """The ServeOptions field it sets."""
    help: str
    metavar: str | None = None
    parse: Callable[[str], Any] | None = None
    choices: tuple[str, ...] | None = None
    switch: bool = False
    """A flag without a value (True when given)."""
    exclusive: str = ""
    """Flags that share this name exclude each other."""
    alias: bool = False
    """Another spelling of a field a main flag writes back (only that one is written)."""
    repeat: bool = False
    """May be given several times (argparse collects a list)."""

    def argv(self, value: Any) -> list[str]:
        if self.alias or value is None or value is False or value == ():
            return []
        if self.switch:
            return [self.name]
        text = ",".join(map(str, value)) if isinstance(value, tuple) else str(value)
        return [self.name, text]


def _one_index(text: str) -> tuple[int, ...]:
    return (non_negative_int(text),)


LAUNCH_FLAGS: tuple[LaunchFlag, ...] = (
    LaunchFlag("--preset", "preset", "model set to run (see `lucebox presets`)", "ID",
               exclusive="what"),
    LaunchFlag("--model", "model",
               "target model: OWNER/REPO[:QUANT] (the quant that fits), hf:..., pypi:..., a "
               "path or a preset id; several: a served set", "SRC", exclusive="what", repeat=True),
    LaunchFlag("--quant", "quant", "the quant of a repo named by --model (e.g. Q4_K_M)", "Q"),
    LaunchFlag("--draft", "draft", "speculative-decoding draft model", "SRC"),
    LaunchFlag("--engine", "engine",
               "which engine serves: auto (default: the planner chooses and says why), "
               "llama-server, or lucebox (the Lucebox engine: DDTree, KVFlash, PFlash; CUDA only)",
               choices=ENGINE_MODES),
    LaunchFlag("--engine-id", "engine_id",
               "serve with this installed build (an id from `lucebox engine status`) instead "
               "of engine.id's", "ID"),
    LaunchFlag("--prefill", "prefill",
               "PFlash speculative prefill on the Lucebox engine: off (default), auto (long "
               "single prompts) or pflash (always); it keeps only a share of a long prompt",
               choices=PREFILL_MODES),
    LaunchFlag("--placement", "placement",
               "the Lucebox engine on two GPUs: auto (default: the planner chooses and says "
               "why), one (one card), draft-apart (the draft on the second card) or tensor "
               "(tensor parallel across both; builds that offer it)", choices=PLACEMENT_MODES),
    LaunchFlag("--kv-mode", "kv_mode",
               "the attention cache: auto (default: exact while it fits, KVFlash only when no "
               "exact cache gives --ctx), exact (never KVFlash), or kvflash (a KVFlash pool on "
               "the Lucebox engine even where the exact cache fits; sparse, not exact)",
               choices=KV_MODES),
    LaunchFlag("--spec", "spec",
               "speculative decoding: auto (default) picks per model; off, mtp, dflash, draft, "
               "ngram", choices=speculation.SPEC_MODES),
    LaunchFlag("--cache", "cache",
               "prompt cache: agent (default: reuse growing prompts) or off (re-read every "
               "prompt)", choices=("agent", "off")),
    LaunchFlag("--ctx", "ctx", "context length in tokens", "N", positive_int),
    LaunchFlag("--users", "users",
               "people served at once (default 1, setting server.users): llama-server slots "
               "sharing the context; the Lucebox engine queues them", "N", positive_int),
    LaunchFlag("--host", "host", "address to bind (default 127.0.0.1)", "H"),
    LaunchFlag("--port", "port", "TCP port (default 8080)", "P", port_number),
    LaunchFlag("--gpus", "gpus",
               "GPUs to use (NVML indices); default: every NVIDIA GPU, one alone unless a split "
               "pays", "0,1", index_list, exclusive="gpus"),
    LaunchFlag("--gpu", "gpus", "one GPU to use (same as --gpus INDEX)", "INDEX", _one_index,
               exclusive="gpus", alias=True),
    LaunchFlag("--allow-base", "allow_base", "serve a base (non-instruct) model anyway",
               switch=True),
    LaunchFlag("--vram-mib", "vram_mib",
               "plan for cards with N MiB free each (one number per card)", "N[,N...]",
               mib_list),
    LaunchFlag("--mmproj", "mmproj",
               "vision projector (mmproj GGUF) of the model; default: the one beside it",
               "PATH"),
    LaunchFlag("--vision", "vision",
               "serve images: auto (default: when the projector costs no context), on (refuse "
               "a plan that cannot hold it; moves off the Lucebox engine), off",
               choices=VISION_MODES),
    LaunchFlag("--preset-among", "preset_among",
               "the presets to pick from for this card (what a short name names)", "ID[,ID...]",
               id_list, exclusive="what"),
    LaunchFlag("--embed-model", "embed_model",
               "an embedding model (GGUF path or source) served beside the chat model at "
               "/v1/embeddings, in the memory the chat model leaves (setting embeddings.model)",
               "SRC"),
    LaunchFlag("--rerank-model", "rerank_model",
               "a reranker model (GGUF, pooling rank) served beside the chat model at /v1/rerank "
               "(setting rerank.model)", "SRC"),
    LaunchFlag("--rpc", "rpc",
               "`lucebox worker` peers whose devices join the split (setting rpc.peers)",
               "HOST:PORT[,...]", peer_list),
)  # fmt: skip


def options_from(values: Mapping[str, Any]) -> ServeOptions:
    """The options a parsed command line gives (flags it does not have are left unset);
    several --model make a served set."""
    fields = {flag.field for flag in LAUNCH_FLAGS}
    given = {k: v for k, v in values.items() if k in fields and v is not None}
    models = tuple(given.pop("model", None) or ())
    if len(models) == 1:
        given["model"] = models[0]
    elif models:
        given["models"] = models
    return ServeOptions(**given)


@dataclass(frozen=True)
class Resolved:
    """Flags over config.toml, resolved once: every launch decision reads this."""

    preset_id: str | None
    preset_among: tuple[str, ...]
    """The presets the plan picks from when no one preset is named; empty: all of them."""
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
    has_api_key: bool
    """server.api_key is set: the engine reads a key file (the key itself stays out of plans)."""
    keep_free_ram_bytes: int | None = None
    """RAM a plan leaves to the rest of the PC (machine.keep_free_ram_mib); None: the rule."""
    cpu_read_s: float = 0.0
    """A chosen CPU context is at most what the CPU reads in this long (model.cpu_read_s)."""
    engine_mode: EngineMode = "auto"
    engine_from: str = ""
    """Where a mode other than auto comes from, for the plan's reason."""
    prefill: PrefillMode = "off"
    placement: PlacementMode = "auto"
    kv_mode: KvMode = "auto"
    kv_type: str | None = None
    """The Lucebox engine's cache type a calibration trial pins; None: the plan's choice."""
    engine_id: str = ""
    """The installed build ``engine.id`` names; empty: each kind's default build."""
    vision: VisionMode = "auto"
    vision_from: str = ""
    """Where a mode other than auto comes from, for the plan's reason."""
    mmproj: str = ""
    """The projector named by --mmproj or model.mmproj; empty: look beside the weights."""
    image_urls: bool = False
    """model.image_urls: off loopback, images are served although the engine fetches the
    http(s) image URLs clients name."""
    users: int = 1
    """People served at once (--users or server.users); the plan may seat fewer, and says."""
    side_models: tuple[tuple[SideRole, str], ...] = ()
    """(role, source) of the embedding and reranker models served beside the chat model."""


ModeT = TypeVar("ModeT", bound=str)
"""One of a mode setting's values (speculation, engine, vision)."""


def resolve(options: ServeOptions, settings: Settings) -> Resolved:
    spec = _checked_mode(
        options.spec or settings.spec or "auto",
        speculation.SPEC_MODES,
        "model.spec",
        "a speculation mode",
    )
    engine = _checked_mode(
        options.engine or settings.engine_kind or "auto", ENGINE_MODES, "engine.kind", "an engine"
    )
    vision = _checked_mode(
        options.vision or settings.vision or "auto", VISION_MODES, "model.vision", "a vision mode"
    )
    return Resolved(
        preset_id=None
        if options.model or options.models or options.preset_among
        else (options.preset or settings.preset or None),
        preset_among=() if options.model or options.models else options.preset_among,
        ctx=options.ctx or settings.ctx or None,
        spec=spec,
        cache=options.cache or "agent",
        host=options.host or settings.host,
        port=options.port or settings.port,
        gpus=options.gpus if options.gpus is not None else settings.gpu_indices,
        rpc=options.rpc if options.rpc is not None else settings.rpc_peers,
        allow_base=options.allow_base or settings.allow_base,
        has_api_key=bool(settings.api_key),
        keep_free_ram_bytes=settings.keep_free_ram_mib * MIB or None,
        cpu_read_s=settings.cpu_read_s,
        engine_mode=engine,
        engine_from=_mode_from("--engine", "engine.kind", engine, asked=bool(options.engine)),
        prefill=options.prefill or "off",
        placement=options.placement or "auto",
        kv_mode=options.kv_mode or "auto",
        kv_type=options.kv_type,
        engine_id=settings.engine_id,
        vision=vision,
        vision_from=_mode_from("--vision", "model.vision", vision, asked=bool(options.vision)),
        mmproj=options.mmproj or settings.mmproj,
        image_urls=settings.image_urls,
        users=_users(options.users or settings.users),
        side_models=side_models_of(options, settings),
    )


MAX_USERS = 64
"""More people at once than a home PC serves well; also bounds the planner's search."""


def _users(users: int) -> int:
    """--users or server.users as planned (only config.toml can hold one under 1)."""
    if not 1 <= users <= MAX_USERS:
        raise UsageError(
            f"{users} users (--users or server.users) is not a number lucebox plans for",
            hint=f"use 1 to {MAX_USERS} (1: one person at a time)",
        )
    return users


def side_models_of(options: ServeOptions, settings: Settings) -> tuple[tuple[SideRole, str], ...]:
    """(role, source) of each side model asked for, the flag over the setting."""
    asked: tuple[tuple[SideRole, str], ...] = (
        ("embeddings", options.embed_model or settings.embed_model),
        ("rerank", options.rerank_model or settings.rerank_model),
    )
    return tuple((role, source) for role, source in asked if source)


def _checked_mode(value: str, modes: tuple[ModeT, ...], key: str, what: str) -> ModeT:
    """``value`` as one of ``modes``; only config.toml's ``key`` can hold another (the flags
    check their choices), so the refusal names it."""
    for mode in modes:
        if mode == value:
            return mode
    raise UsageError(
        f"{key} = {value!r} in config.toml is not {what}", hint=f"use one of {', '.join(modes)}"
    )


def _mode_from(flag: str, key: str, mode: str, *, asked: bool) -> str:
    """Where a mode other than auto comes from, for the plan's reason: the flag, else
    config.toml."""
    return f"{flag} {mode} as asked" if asked else f'{key} = "{mode}" in config.toml'
