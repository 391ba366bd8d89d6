"""The chat template and thinking default the plan prints, per family and engine."""

from __future__ import annotations

import dataclasses

import pytest

from benchmarks.lucebox_models import TARGET
from lucebox.engine.core.paths import resolve_paths
from lucebox.engine.core.units import GIB
from lucebox.engine.engines import kinds
from lucebox.engine.engines.kinds import LLAMA_SERVER
from lucebox.engine.machine.budget import DeviceBudget, pool_of
from lucebox.engine.machine.config import Settings
from lucebox.engine.plan.chatdefaults import chat_defaults, thinking_default
from lucebox.engine.plan.options import ServeOptions, resolve
from lucebox.engine.plan.planner import installs_of, plan_launch
from support.ggufgen import cached_gguf

RTX_4090 = pool_of((DeviceBudget(0, "NVIDIA GeForce RTX 4090", 24 * GIB, 23 * GIB),), 64 * GIB)


@pytest.mark.parametrize(
    ("kind", "arch", "template", "thinking"),
    [
        ("llama-server", "qwen35", "gguf", False),
        ("lucebox", "qwen35", "builtin:qwen35", False),
        ("lucebox", "gemma4", "builtin:gemma4", False),
        ("llama-server", "llama", "gguf", None),
    ],
)
def test_chat_defaults_per_family(kind, arch, template, thinking):
    chosen = chat_defaults(kinds.kind(kind), arch, has_gguf_template=True)
    assert (chosen.template, chosen.thinking_default) == (template, thinking)
    assert thinking_default(arch) is thinking
    assert chat_defaults(LLAMA_SERVER, "llama", False).template == "chatml"
    assert chat_defaults(LLAMA_SERVER, "gemma3", False, "gemma").template == "builtin:gemma"


@pytest.mark.parametrize("engine", ["llama-server", "lucebox"])
def test_the_plan_prints_one_thinking_default_for_a_qwen35_on_either_engine(engine):
    target = cached_gguf(dataclasses.replace(TARGET, header_only=True))
    options = ServeOptions(model=str(target), ctx=8192, engine=engine)
    launch = plan_launch(
        resolve_paths(),
        options,
        resolved=resolve(options, Settings()),
        budget=RTX_4090,
        installs=installs_of(),
    )
    chat = launch.to_json()["chat"]
    assert launch.engine_kind == engine and chat["thinking_default"] is False
    assert chat["template"] == ("builtin:qwen35" if engine == "lucebox" else "gguf")
    assert "DDTree" in chat["reason"]
