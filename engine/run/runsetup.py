"""What a server run is built from: what it serves and tells `status` (:class:`RunFacts`), how
it watches its speculation (:class:`SpecSetup`) and what it measures once idle
(:class:`Calibrations`). :mod:`lucebox.engine.runstart` makes them from a prepared launch."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from lucebox.engine.plan.launch import ServerLaunch
from lucebox.engine.plan.samplingdefaults import SamplingDefaults
from lucebox.engine.plan.sidemodels import SideModel
from lucebox.engine.plan.speculation.specguard import Decision, SpecGuard
from lucebox.engine.run.calibrate.calibrator import Calibrator
from lucebox.engine.run.calibrate.enginecalibrator import EngineCalibrator
from lucebox.engine.run.calibrate.kvcalibrator import KvModeCalibrator
from lucebox.engine.run.calibrate.probing import ProbeSender
from lucebox.engine.run.front.chatpage import ChatPage
from lucebox.engine.run.hang import DEFAULT_BOUNDS, HangBounds
from lucebox.engine.run.sample import EngineStatus, PeerStatus


@dataclass(frozen=True, kw_only=True)
class RunFacts:
    """What a run serves and tells `status`, fixed for its life."""

    model: str
    """The served model's name (the preset id, or the file's stem)."""
    gpu_index: int
    """The card the sampler reads first."""
    api_key: str | None = None
    """The key the engine was started with (read once from its key file)."""
    webui_url: str | None = None
    """Where the engine's own web UI answers; None when it has none."""
    peers: tuple[PeerStatus, ...] = ()
    """The launch's RPC peers as they answered before it."""
    thinking_default: bool | None = None
    """Whether the served model thinks when a request does not say (plan/chatdefaults.py);
    the front asks both engines the same way."""
    sampling: SamplingDefaults | None = None
    """What a request that leaves sampling unset gets (plan/samplingdefaults.py): the front
    fills it in on both engines; None leaves it to the engine."""
    planned_engine: EngineStatus | None = None
    """The engine kind the launch was planned on and what chose it; None: not said."""
    hang_bounds: HangBounds | None = DEFAULT_BOUNDS
    """How long a running request may go without progress, by phase (``server.hang_s``);
    None: never judged hung."""
    allowed_origins: tuple[str, ...] = ()
    """Web origins whose pages may call the API (``server.allowed_origins``)."""
    mdns_name: str = ""
    """The name announced on the LAN while serving beyond loopback; empty: none."""
    sleep_idle_s: float = 0.0
    """Seconds without a client request before the engine sleeps (``server.sleep_idle_s``);
    0: never."""
    sides: tuple[SideModel, ...] = ()
    """The embedding and reranker models served beside the chat engine (plan/sidemodels.py)."""
    chat_page: ChatPage | None = None
    """The chat page the front serves itself (the engine has none); None: the engine's own,
    or none (``no_page_reason`` says why)."""
    no_page_reason: str = ""


@dataclass(frozen=True)
class SpecSetup:
    """How a run watches its speculation."""

    reason: str | None = None
    """Why the planned speculation runs (or none does)."""
    guard: SpecGuard | None = None
    """The speculation guard; None when nothing speculates."""
    asked: bool = False
    """The user chose the mode: a decision of the guard only warns."""
    on_decision: Callable[[Decision, ServerLaunch], ServerLaunch | None] | None = None
    """The re-plan a guard's decision asks for (None keeps what runs)."""


@dataclass(frozen=True)
class Calibrations:
    """What a run measures on the card once idle; None where that measurement does not
    apply."""

    speculation: Calibrator | None = None
    """The speculation modes; None when nothing can speculate."""
    engine: EngineCalibrator | None = None
    """Both engines, where both can serve the launch."""
    kv_modes: KvModeCalibrator | None = None
    """A long-context Lucebox launch's modes."""

    def present(self) -> tuple[ProbeSender[Any], ...]:
        """The measurements this run has, in the order they start."""
        found = (self.speculation, self.engine, self.kv_modes)
        return tuple(c for c in found if c is not None)

    @property
    def measuring(self) -> bool:
        """Whether one sends its probes now (the served requests are then its own)."""
        return any(c.active for c in self.present())
