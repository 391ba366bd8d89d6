"""llama-server's router for a served set (pure): its preset INI and its own command line.

The router (llama-server started with no model) runs each model in a process of its own,
started with the router's arguments, then the model's INI section, then the ``[*]`` section;
anything on the router's command line overrides every model (tools/server/server-models.cpp
and common/preset.cpp of the pinned source). So each section carries exactly the flags that
model's plan would launch a single server with, and the router's argv only what belongs to
the router: address, API key file, the preset file and ``--models-max``. The router sets each
child's host, port and alias itself.

Each section's ``slot-save-path`` is the set's own folder of slot files. The file sets no
``sleep-idle-seconds``: a model that sleeps in its process drops its cache with no word to
lucebox, so the idle unload is lucebox's proxy's, which saves the slot first
(run/servedset/servedsetslots.py).
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from lucebox.engine.core.errors import UsageError
from lucebox.engine.plan.launch import ServerLaunch, server_argv
from lucebox.engine.plan.servedset.setplan import SetPlan

ROUTER_ONLY_FLAGS = {"--host", "--port", "--alias", "--api-key-file"}
"""Flags of a single server's argv the router owns: it sets them for each child itself."""
FLAGS_WITHOUT_VALUE = {"--metrics", "--jinja", "--swa-full", "--kv-unified"}
"""The flags lucebox's launches pass without a value (launch.py, memory.Plan.server_flags)."""
_INI_FORBIDDEN = (";", "#", "\n", "\r")
"""An INI value ends at ``;`` or ``#`` (a comment) and at a line break."""


def section_options(argv: list[str]) -> list[tuple[str, str]]:
    """A single server's argv (after argv[0]) as INI keys and values, router flags left out."""
    options: list[tuple[str, str]] = []
    items = argv[1:]
    index = 0
    while index < len(items):
        flag = items[index]
        if flag in FLAGS_WITHOUT_VALUE:
            value, index = "true", index + 1
        else:
            value, index = items[index + 1], index + 2
        if flag in ROUTER_ONLY_FLAGS:
            continue
        if any(mark in value for mark in _INI_FORBIDDEN):
            raise UsageError(
                f"{value!r} cannot go in llama-server's preset file (it ends a value at ; # "
                "or a line break)",
                hint="rename or move the model file so its path has none of them",
            )
        options.append((flag.lstrip("-"), value))
    return options


def _devices(server: ServerLaunch, visible: tuple[int, ...]) -> str | None:
    """The section's ``device`` value: its GPUs by position among those the router sees."""
    if not server.gpus:
        return None
    return ",".join(f"CUDA{visible.index(g)}" for g in server.gpus)


def visible_gpus(planned: SetPlan) -> tuple[int, ...]:
    """Every GPU some model of the set runs on, in NVML order: what the router may see."""
    return tuple(sorted({g for launch in planned.launches for g in launch.server.gpus}))


def router_ini(planned: SetPlan, slot_folder: Path) -> str:
    """The preset file: one section per model, by alias; a model whose plan saves its slot
    saves it in ``slot_folder``, the set's own."""
    visible = visible_gpus(planned)
    lines = ["; written by lucebox from the set's plans: edit the plan, not this file"]
    for launch in planned.launches:
        alias = launch.alias
        if any(mark in alias for mark in (*_INI_FORBIDDEN, "[", "]", ":")):
            raise UsageError(
                f"the alias {alias!r} cannot name a section of llama-server's preset file",
                hint="rename the model file: letters, digits, dots, dashes and underscores",
            )
        server = launch.server
        if server.slot_save_path is not None:
            server = replace(server, slot_save_path=str(slot_folder))
        lines += ["", f"[{alias}]"]
        lines += [f"{key} = {value}" for key, value in section_options(server_argv(server))]
        device = _devices(launch.server, visible)
        if device:
            lines.append(f"device = {device}")
    return "\n".join(lines) + "\n"


def router_launch(planned: SetPlan, ini_path: str, models_max: int | None = None) -> ServerLaunch:
    """The router's launch: the first model's address and key file, router flags only;
    ``models_max`` 0 lifts the count limit (lucebox's proxy evicts by memory instead)."""
    first = planned.launches[0].server
    limit = planned.models_max if models_max is None else models_max
    return replace(
        first,
        model_path=ini_path,
        alias="router",
        router=("--models-preset", ini_path, "--models-max", str(limit)),
        gpus=visible_gpus(planned),
        rpc=(),
        chat_template=None,
        draft_path=None,
        spec_type=None,
        draft_max=None,
        draft_p_min=None,
        slot_save_path=None,
        sampling=(),
        engine_port=None,  # the router serves the address (behind the set's own proxy)
    )
