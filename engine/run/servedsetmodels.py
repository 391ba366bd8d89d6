"""The models of a served set as `status` shows them, read from the router's ``/models``.

The router (tools/server/server-models.cpp of the pinned source) answers ``GET /models`` with
``{"data": [{"id", "aliases", "status": {"value": ...}}]}``; ``value`` is one of
downloading, downloaded, unloaded, loading, loaded, sleeping. It does not say when a model was
last used, so that comes from its log line ``proxying request to model NAME on port N``. Nor
does ``/models`` carry load progress: the router announces that, and every change of state, on
``GET /models/sse`` (one ``data: {"model", "event", "data": {"status", "progress"}}`` line each).
A model whose process exited on its own shows ``"failed": true`` and its ``exit_code``, with the
process's argv (and so its ``--port``) in ``args``; the router relays each process's lines into
its own log prefixed ``[PORT] ``.
"""

from __future__ import annotations

import contextlib
import json
import re
from dataclasses import dataclass
from typing import Any, Literal, get_args

from lucebox.engine.core.errors import UsageError
from lucebox.engine.run.sample import GpuStatus, SpecStatus

ModelStateName = Literal["loaded", "sleeping", "unloaded", "loading"]
_STATES: dict[str, ModelStateName] = {name: name for name in get_args(ModelStateName)}
_PROXIED = re.compile(r"proxying request to model (\S+) on port \d+")
_CHILD_LINE = re.compile(r"\[(\d+)\] (.*)")
_STATE_EVENTS = ("model_status", "status_change")


@dataclass(frozen=True)
class ModelStatus:
    """One model of the set: its state in the router, where it runs, what it holds."""

    alias: str
    state: ModelStateName
    device: str
    memory_bytes: int
    """What its process holds now (resident memory), 0 when it runs no process."""
    last_used_s: float | None
    """Seconds since a request last went to it; None when none has since the start."""
    planned_bytes: int = 0
    """What the plan gives it (the set's plan keeps any ``models_max`` of them within it)."""
    load_progress: float | None = None
    """How far its load is, 0 to 1, while it loads (the router's word); None otherwise."""
    spec: SpecStatus | None = None
    """Its speculation as planned, the acceptance of its process, and the guard's switch-off;
    None when it does not speculate."""
    last_slot: str | None = None
    """What the last save or restore of its slot did ("restored the saved slot (N tokens)",
    "save failed: ..."); None before either."""

    def to_json(self) -> dict[str, Any]:
        return {
            "alias": self.alias,
            "state": self.state,
            "device": self.device,
            "memory_bytes": self.memory_bytes,
            "last_used_s": self.last_used_s,
            "planned_bytes": self.planned_bytes,
            "load_progress": self.load_progress,
            "spec": self.spec.to_json() if self.spec is not None else None,
            "last_slot": self.last_slot,
        }

    @classmethod
    def from_json(cls, data: Any) -> ModelStatus | None:
        """The status a state file holds; None when it is not one."""
        if not isinstance(data, dict) or data.get("state") not in get_args(ModelStateName):
            return None
        last, progress = data.get("last_used_s"), data.get("load_progress")
        return cls(
            alias=str(data.get("alias", "")),
            state=data["state"],
            device=str(data.get("device", "")),
            memory_bytes=int(data.get("memory_bytes") or 0),
            last_used_s=float(last) if isinstance(last, int | float) else None,
            planned_bytes=int(data.get("planned_bytes") or 0),
            load_progress=float(progress) if isinstance(progress, int | float) else None,
            spec=SpecStatus.from_json(data.get("spec")),
            last_slot=data["last_slot"] if isinstance(data.get("last_slot"), str) else None,
        )


@dataclass(frozen=True)
class ModelsSample:
    """The set's models as the run sees them now (each poll, and each change the router
    announces), for a dashboard to show."""

    models: tuple[ModelStatus, ...]
    gpus: tuple[GpuStatus, ...] = ()
    """Every card's memory and load as NVML read them with these models."""


@dataclass(frozen=True)
class ModelNote:
    """Something the run did to one model of the set, or would not do, in a sentence."""

    alias: str
    message: str


@dataclass(frozen=True)
class ModelChange:
    """One model's new state, as the router announces it on ``/models/sse``."""

    alias: str
    state: ModelStateName
    load_progress: float | None
    """How far the load is, 0 to 1, when the router said (only while loading)."""


def router_states(payload: Any) -> dict[str, ModelStateName]:
    """Each model's state in a ``/models`` answer; a download counts as not loaded."""
    found: dict[str, ModelStateName] = {}
    entries = payload.get("data") if isinstance(payload, dict) else None
    for entry in entries if isinstance(entries, list) else []:
        if not isinstance(entry, dict) or not isinstance(entry.get("id"), str):
            continue
        status = entry.get("status")
        value = status.get("value") if isinstance(status, dict) else None
        found[entry["id"]] = (
            _STATES.get(value, "unloaded") if isinstance(value, str) else "unloaded"
        )
    return found


def failed_children(payload: Any) -> dict[str, int | None]:
    """Each model whose process failed in a ``/models`` answer, with the port it ran on (None
    when its argv does not say)."""
    found: dict[str, int | None] = {}
    entries = payload.get("data") if isinstance(payload, dict) else None
    for entry in entries if isinstance(entries, list) else []:
        status = entry.get("status") if isinstance(entry, dict) else None
        if not isinstance(status, dict) or status.get("failed") is not True:
            continue
        found[str(entry.get("id"))] = _child_port(status)
    return found


def loaded_children(payload: Any) -> dict[str, int]:
    """Each loaded model in a ``/models`` answer with the port its process serves on."""
    found: dict[str, int] = {}
    entries = payload.get("data") if isinstance(payload, dict) else None
    for entry in entries if isinstance(entries, list) else []:
        status = entry.get("status") if isinstance(entry, dict) else None
        if not isinstance(status, dict) or status.get("value") != "loaded":
            continue
        port = _child_port(status)
        if port is not None:
            found[str(entry.get("id"))] = port
    return found


def _child_port(status: dict[str, Any]) -> int | None:
    """The port in a model process's argv (``status.args``); None when it does not say."""
    args = status.get("args")
    argv = [str(a) for a in args] if isinstance(args, list) else []
    port = argv[argv.index("--port") + 1] if "--port" in argv[:-1] else ""
    return int(port) if port.isdigit() else None


def child_line(line: str) -> tuple[int, str] | None:
    """The port and the line of a model process's line as the router relays it; None for the
    router's own lines."""
    match = _CHILD_LINE.match(line)
    return (int(match.group(1)), match.group(2)) if match else None


def router_change(line: str) -> ModelChange | None:
    """The change of state an ``/models/sse`` line announces; None for any other line.

    A load reports each of its stages (the model, then a draft, then a projector) from 0 to 1;
    the progress here is of the whole load, the stages counted alike.
    """
    event: Any = None
    with contextlib.suppress(ValueError):
        event = json.loads(line.removeprefix("data: "))
    if not isinstance(event, dict) or event.get("event") not in _STATE_EVENTS:
        return None
    data, alias = event.get("data"), event.get("model")
    if (
        not isinstance(data, dict)
        or not isinstance(alias, str)
        or data.get("status") not in _STATES
    ):
        return None
    return ModelChange(alias, _STATES[data["status"]], _load_fraction(data.get("progress")))


def _load_fraction(progress: Any) -> float | None:
    if not isinstance(progress, dict) or not isinstance(progress.get("value"), int | float):
        return None
    stages = progress.get("stages")
    stages = stages if isinstance(stages, list) and stages else [progress.get("current")]
    done = stages.index(progress.get("current")) if progress.get("current") in stages else 0
    return min((done + float(progress["value"])) / len(stages), 1.0)


def proxied_model(line: str) -> str | None:
    """The model a router log line says a request went to, if it is such a line."""
    match = _PROXIED.search(line)
    return match.group(1) if match else None


def find_model(models: tuple[ModelStatus, ...], name: str) -> ModelStatus:
    """The served model called ``name``; an unknown name is refused with the served ones."""
    for model in models:
        if model.alias == name:
            return model
    served = ", ".join(m.alias for m in models) or "none (no set is served)"
    raise UsageError(f"no served model is called {name!r}", hint=f"the served models: {served}")
