"""What Codex requires of a model list (``GET /v1/models?client_version=...``), and the real
Codex CLI reading one.

The fields come from codex-rs ``protocol/src/openai_models.rs`` (``ModelsResponse`` and
``ModelInfo``) at commit 8db0700334e35787030da010475ab211649e6b5d: a field without a serde
default and not an ``Option`` fails the whole document where it is missing. Codex 0.169.0
(``codex debug models`` on a catalog file, one field left out at a time) requires the same
set less ``supports_reasoning_summaries`` and ``supports_parallel_tool_calls``, defaulted
since; both are kept here so an older Codex reads the list too.
"""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Mapping
from pathlib import Path
from typing import Any

REQUIRED_FIELDS: Mapping[str, type | tuple[type, ...]] = {
    "slug": str,
    "display_name": str,
    "supported_reasoning_levels": list,
    "shell_type": str,
    "visibility": str,
    "supported_in_api": bool,
    "priority": int,
    "base_instructions": str,
    "supports_reasoning_summaries": bool,
    "support_verbosity": bool,
    "truncation_policy": dict,
    "supports_parallel_tool_calls": bool,
    "experimental_supported_tools": list,
}
"""Each ``ModelInfo`` field Codex requires, with its JSON type."""
EFFORTS = {"none", "minimal", "low", "medium", "high", "xhigh"}
"""``ReasoningEffort`` at that commit (serde lowercase)."""
SHELL_TYPES = {"default", "local", "unified_exec", "disabled", "shell_command"}
VISIBILITIES = {"list", "hide", "none"}
TRUNCATION_MODES = {"bytes", "tokens"}


def problems(document: Any) -> list[str]:
    """What in ``document`` Codex would fail to parse; empty when it reads it."""
    models = document.get("models") if isinstance(document, dict) else None
    if not isinstance(models, list) or not models:
        return ["no 'models' list"]
    return [f"{i}: {p}" for i, model in enumerate(models) for p in _model_problems(model)]


def _model_problems(model: Any) -> list[str]:
    if not isinstance(model, dict):
        return ["not an object"]
    found = [
        f"{name} missing or not {kind}"
        for name, kind in REQUIRED_FIELDS.items()
        if not _is(model.get(name), kind)
    ]
    levels = model.get("supported_reasoning_levels") or []
    efforts = [level.get("effort") for level in levels if isinstance(level, dict)]
    if "default_reasoning_level" in model:
        efforts.append(model["default_reasoning_level"])
    found += [f"effort {e!r} is not Codex's" for e in efforts if e not in EFFORTS]
    for name, allowed in (("shell_type", SHELL_TYPES), ("visibility", VISIBILITIES)):
        if model.get(name) not in allowed:
            found.append(f"{name} {model.get(name)!r} is not Codex's")
    policy = model.get("truncation_policy") or {}
    if policy.get("mode") not in TRUNCATION_MODES or not _is(policy.get("limit"), int):
        found.append(f"truncation_policy {policy!r}")
    return found


def _is(value: Any, kind: type | tuple[type, ...]) -> bool:
    """``isinstance`` where a JSON bool is no number."""
    return isinstance(value, kind) and (kind is bool or not isinstance(value, bool))


def codex_reads(codex: str, document: Any, folder: Path) -> dict[str, Any]:
    """The catalog the real Codex CLI makes of ``document`` (``codex debug models`` with it as
    ``model_catalog_json``, parsed as Codex's own ``ModelsResponse``), in a HOME of its own.

    Raises:
        AssertionError: Codex refused the document; the message is its error.
    """
    catalog = folder / "catalog.json"
    catalog.write_text(json.dumps(document))
    home = folder / "home"
    home.mkdir(exist_ok=True)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OPENAI_", "CODEX_"))}
    done = subprocess.run(
        [codex, "debug", "models", "-c", f"model_catalog_json={json.dumps(str(catalog))}"],
        env={**env, "HOME": str(home)},
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    if done.returncode != 0:
        error = [line for line in done.stderr.splitlines() if line.startswith("Error")]
        raise AssertionError(" / ".join(error) or done.stderr[-500:])
    read: dict[str, Any] = json.loads(done.stdout)
    return read
