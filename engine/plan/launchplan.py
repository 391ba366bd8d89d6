"""What the one planner decides for a launch: the LaunchPlan (files, speculation, memory plan,
argv, engine and why), and the refusal that carries it."""

from __future__ import annotations

import shlex
from dataclasses import dataclass, field, replace
from typing import Any

from lucebox.engine.core.errors import GuardRefusal
from lucebox.engine.core.paths import Paths
from lucebox.engine.engines import kinds
from lucebox.engine.engines.kinds import EngineKind
from lucebox.engine.engines.registry import KindName
from lucebox.engine.machine.apikey import api_key_path
from lucebox.engine.machine.budget import GpuBudget
from lucebox.engine.models.checkresult import Problem
from lucebox.engine.models.presets import Preset
from lucebox.engine.plan.chatdefaults import chat_defaults
from lucebox.engine.plan.enginechoice import EngineChoice
from lucebox.engine.plan.engineview import EngineView, Installs
from lucebox.engine.plan.launch import (
    ServerLaunch,
    key_file_of,
    private_port,
    server_argv,
    server_env,
)
from lucebox.engine.plan.lucebox.kvmodes import KvModesPlan
from lucebox.engine.plan.memory.memory import Plan
from lucebox.engine.plan.modelfiles import ModelFile
from lucebox.engine.plan.options import Resolved, ServeOptions
from lucebox.engine.plan.samplingdefaults import SamplingDefaults, sampling_defaults
from lucebox.engine.plan.sidemodels import NO_SIDES, SidePlan
from lucebox.engine.plan.speculation import measurements, speculation
from lucebox.engine.plan.users import UsersPlan
from lucebox.engine.plan.visionplan import NO_PROJECTOR, Vision


class PlanRefusal(GuardRefusal):
    """A launch plan that must not start; carries the plan so `plan` can still print it."""

    def __init__(self, launch: LaunchPlan, refusal: GuardRefusal) -> None:
        super().__init__(refusal.message, hint=refusal.hint, problem_codes=refusal.problem_codes)
        self.launch = launch


@dataclass(frozen=True)
class Speculation:
    spec_type: str | None
    draft: ModelFile | None
    draft_max: int | None
    p_min: float | None
    reason: str
    candidates: tuple[speculation.SpecCandidate, ...] = ()
    """What the mode allows on this backend, before memory and measurements choose."""
    measurement_key: measurements.MeasurementKey | None = None
    """Where the measurement store keeps this launch's rates; None for a file not here."""

    def to_json(self) -> dict[str, Any]:
        return {"type": self.spec_type, "draft_max": self.draft_max, "reason": self.reason}


@dataclass(frozen=True)
class LaunchPlan:
    """Everything a launch needs, decided once; ``argv`` is exactly what starts."""

    title: str
    alias: str
    preset: Preset | None
    budget: GpuBudget
    target: ModelFile
    speculation: Speculation
    server: ServerLaunch
    """How the engine starts: its kind, binary, model, memory plan, address and flags."""
    resolved: Resolved
    options: ServeOptions
    """What it was planned from: a re-plan changes only what it must."""
    installs: Installs
    """Every engine kind's build it was planned with: a re-plan plans with the same."""
    ctx_cap: int | None = None
    """The bound an out-of-memory re-plan put on the context; later re-plans keep it."""
    refusal: GuardRefusal | None = None
    """Why this plan must not start (a refused file, a plan that does not fit)."""
    fit_check: dict[str, Any] | None = field(default=None, compare=False)
    engine_choice: EngineChoice | None = None
    """Which engine serves and why (None for a plan made before the choice existed)."""
    source_choice: dict[str, Any] | None = field(default=None, compare=False)
    """How a repo named by name became this file: the quant, why, every candidate."""
    vision: Vision = NO_PROJECTOR
    """Whether images are served, with which projector, and why."""
    kv_modes: KvModesPlan | None = None
    """A long-context Lucebox launch's modes (exact at each KV type, KVFlash), measured on this
    card once idle; None for a short context or another engine."""
    users: UsersPlan | None = None
    """The people it serves at once and what each gets; None for a served set's model."""
    sides: SidePlan = NO_SIDES
    """The embedding and reranker models served beside the chat model (llama-server each)."""

    @property
    def engine(self) -> EngineView:
        """The build of the engine kind that serves this launch."""
        return self.installs.of(self.engine_kind)

    @property
    def plan(self) -> Plan:
        """The memory plan: context, KV types, offload and every memory term with its reason."""
        return self.server.plan

    def with_plan(self, plan: Plan) -> LaunchPlan:
        """The same launch on another memory plan (held once, in the server launch)."""
        return replace(self, server=replace(self.server, plan=plan))

    def with_vision_left_out(self, why: str) -> LaunchPlan:
        """This launch with ``why`` as the reason it serves no images (a preset's projector
        that could not be weighed); itself when ``why`` is "" or vision is served."""
        if not why or self.vision.served:
            return self
        return replace(self, vision=replace(self.vision, reason=why))

    @property
    def argv(self) -> list[str]:
        return server_argv(self.server)

    @property
    def command(self) -> str:
        """The command line, quoted so it pastes into a shell."""
        return shlex.join(self.argv)

    @property
    def sampling(self) -> SamplingDefaults:
        """What a request that leaves sampling unset gets, on either engine (the front fills
        it in): the preset's ``[sampling]``, else the GGUF's, else llama.cpp's defaults."""
        info = self.target.info
        return sampling_defaults(
            self.preset.sampling if self.preset else None, info.sampling if info else None
        )

    @property
    def engine_kind(self) -> KindName:
        """The engine that serves this launch (llama-server for a plan made before the choice)."""
        return self.engine_choice.kind if self.engine_choice is not None else "llama-server"

    @property
    def served_by(self) -> EngineKind:
        """The engine kind that serves this launch, to ask what it can do."""
        return kinds.kind(self.engine_kind)

    @property
    def misfit(self) -> str:
        """ "" when the set runs wholly on the device, else one word: offload, vram (ram
        without a GPU, or when the RAM beside the GPU is short), slow (even the smallest
        context takes the CPU too long to read), or refused (the plan fits but must not
        start: ``refusal`` says why)."""
        if not self.plan.fits:
            if "ram" in self.plan.reasons:
                return "ram"
            if self.budget.is_gpu:
                return "vram"
            return "slow" if "too_slow" in self.plan.reasons else "ram"
        if self.refusal is not None:
            return "refused"
        if self.plan.n_gpu_layers >= 0 and self.plan.memory_bytes.cuda_context:
            return "offload"
        return ""

    @property
    def problems(self) -> tuple[Problem, ...]:
        found = self.target.check.problems if self.target.check else ()
        draft = self.speculation.draft
        return found + (draft.check.problems if draft and draft.check else ())

    def to_json(self) -> dict[str, Any]:
        """The document `plan --json` and `up/serve --dry-run --json` print."""
        return {
            **self.plan.to_json(),
            "fits": self.refusal is None,
            "model": self.title,
            "alias": self.alias,
            "preset": self.preset.id if self.preset else None,
            "device": self.budget.device,
            "devices": [{"name": n, "memory_bytes": b} for n, b in self.plan.device_bytes],
            "placement": self.server.lucebox.placement if self.server.lucebox else None,
            "env": server_env(self.server),
            "engine": {
                "id": self.engine.id,
                "version": self.engine.version,
                **(self.engine_choice.to_json() if self.engine_choice else {}),
            },
            "target": self.target.to_json(),
            "draft": self.speculation.draft.to_json() if self.speculation.draft else None,
            "spec": self.speculation.to_json(),
            "argv": self.argv,
            "command": self.command,
            "refusal": str(self.refusal) if self.refusal else None,
            "vision": self.vision.to_json(),
            "chat": chat_defaults(
                self.served_by,
                self.target.facts.architecture,
                self.target.info is None or self.target.info.has_chat_template,
                self.server.chat_template,
            ).to_json(),
            "sampling": self.sampling.to_json(),
            "fit_check": self.fit_check,
            **({"source": self.source_choice} if self.source_choice else {}),
            **({"kv_modes": self.kv_modes.to_json()} if self.kv_modes else {}),
            **({"users": self.users.to_json()} if self.users else {}),
            **({"side_models": self.sides.to_json()} if self.sides.models else {}),
        }


@dataclass(frozen=True)
class LaunchBasis:
    """What a launch is planned from, whichever engine serves it: one assembly of the plan."""

    options: ServeOptions
    resolved: Resolved
    preset: Preset | None
    target: ModelFile
    ctx_cap: int | None
    installs: Installs

    @property
    def alias(self) -> str:
        return self.preset.id if self.preset else self.target.path.stem

    def server(
        self,
        paths: Paths,
        engine: EngineView,
        plan: Plan,
        budget: GpuBudget,
        speculation: Speculation,
    ) -> ServerLaunch:
        """How the engine starts, as every kind shares it: its binary and model on the local
        GPUs of ``budget``, behind the front with the user's key, with the chosen draft. Each
        kind's route adds its own switches."""
        resolved = self.resolved
        return ServerLaunch(
            server_path=engine.server_path,
            model_path=str(self.target.path),
            plan=plan,
            alias=self.alias,
            host=resolved.host,
            port=resolved.port,
            engine_port=private_port(resolved.port),
            api_key_file=key_file_of(str(api_key_path(paths)), resolved.host, resolved.has_api_key),
            draft_path=str(speculation.draft.path) if speculation.draft else None,
            spec_type=speculation.spec_type,
            draft_max=speculation.draft_max,
            draft_p_min=speculation.p_min,
            gpus=tuple(d.index for d in budget.local_gpus),
        )

    def launch(
        self,
        server: ServerLaunch,
        speculation: Speculation,
        *,
        budget: GpuBudget,
        refusal: GuardRefusal | None,
        engine_choice: EngineChoice,
        vision: Vision = NO_PROJECTOR,
        users: UsersPlan | None = None,
    ) -> LaunchPlan:
        return LaunchPlan(
            title=self.preset.title if self.preset else self.target.facts.name,
            alias=server.alias,
            preset=self.preset,
            budget=budget,
            target=self.target,
            speculation=speculation,
            server=server,
            resolved=self.resolved,
            options=self.options,
            installs=self.installs,
            ctx_cap=self.ctx_cap,
            refusal=refusal,
            engine_choice=engine_choice,
            vision=vision,
            users=users,
        )
