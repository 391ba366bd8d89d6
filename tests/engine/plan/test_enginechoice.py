"""The planner's engine choice: architectures x drafts x cards x flags."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

from lucebox.engine.plan.enginechoice import EngineFacts, choose_engine

BASE = EngineFacts(
    mode="auto", mode_from="", target_arch="qwen35", target_has_mtp=False,
    on_nvidia_gpu=True,
)  # fmt: skip
LUCEBOX_DRAFT: dict[str, Any] = {
    "draft_name": "dflash-draft-3.6-q4_k_m.gguf",
    "draft_arch": "qwen35-dflash-draft",
}
UPSTREAM_DRAFT = {"draft_name": "Qwen3.6-27B-DFlash.gguf", "draft_arch": "dflash"}
GEMMA_DRAFT = {
    "draft_name": "gemma-4-26B-A4B-it-DFlash-q8_0.gguf",
    "draft_arch": "gemma4-dflash-draft",
}
ASKED = {"mode": "lucebox", "mode_from": "--engine lucebox as asked"}
LLAMA = {"mode": "llama-server", "mode_from": "--engine llama-server as asked"}
LONG = {"llama_fits_ctx": False, "ctx_asked": 262144}


@pytest.mark.parametrize(
    ("changes", "kind", "reason", "refused"),
    [
        ({}, "llama-server", "the default engine", False),
        (LUCEBOX_DRAFT, "lucebox", "is a Lucebox DFlash draft", False),
        ({**LUCEBOX_DRAFT, "target_arch": "qwen35moe"}, "lucebox", "Lucebox DFlash draft", False),
        ({**GEMMA_DRAFT, "target_arch": "gemma4"}, "lucebox", "Lucebox DFlash draft", False),
        (UPSTREAM_DRAFT, "llama-server", "the default engine", False),
        ({**LUCEBOX_DRAFT, "target_arch": "gemma4"}, "llama-server", "drafts for qwen35", False),
        ({**LUCEBOX_DRAFT, "target_arch": "llama"}, "llama-server", "does not serve", False),
        ({**LUCEBOX_DRAFT, "target_has_mtp": True}, "llama-server", "MTP block", False),
        ({**LUCEBOX_DRAFT, "on_nvidia_gpu": False}, "llama-server", "only on NVIDIA", False),
        (LONG, "lucebox", "KVFlash serves it", False),
        ({**LONG, "target_arch": "gemma4"}, "lucebox", "KVFlash serves it", False),
        ({**LONG, "target_arch": "llama"}, "llama-server", "KVFlash cannot serve it", False),
        ({**LONG, "target_has_mtp": True}, "llama-server", "MTP block", False),
        ({**LONG, "on_nvidia_gpu": False}, "llama-server", "only on NVIDIA", False),
        ({"on_nvidia_gpu": False}, "llama-server", "CPU", False),
        (ASKED, "lucebox", "--engine lucebox as asked", False),
        ({**ASKED, "on_nvidia_gpu": False}, "lucebox", "", True),
        ({**ASKED, "target_arch": "llama"}, "lucebox", "", True),
        ({**ASKED, "target_has_mtp": True}, "lucebox", "", True),
        ({**LLAMA, **LUCEBOX_DRAFT}, "llama-server", "llama-server cannot use it", False),
        ({**LLAMA, **LONG}, "llama-server", "--engine llama-server as asked", False),
    ],
)
def test_engine_choice(changes, kind, reason, refused):
    choice = choose_engine(dataclasses.replace(BASE, **changes))
    assert choice.kind == kind
    assert reason in choice.reason
    assert (choice.refusal is not None) == refused
    document = choice.to_json()
    assert {k: document[k] for k in ("kind", "reason")} == {"kind": kind, "reason": choice.reason}
    assert document["measured"] is False
    # Where both engines serve, the plan says what is not measured yet.
    assert (document["unmeasured"] is not None) == choice.both


def test_a_lucebox_draft_is_never_dropped_without_its_name():
    """Whatever blocks the Lucebox engine, the reason names the draft and why."""
    blockers: tuple[dict[str, Any], ...] = ({"on_nvidia_gpu": False}, {"target_has_mtp": True})
    for blocker in blockers:
        choice = choose_engine(dataclasses.replace(BASE, **LUCEBOX_DRAFT, **blocker))
        assert "dflash-draft-3.6-q4_k_m.gguf cannot be used" in choice.reason
