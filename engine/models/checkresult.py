"""What a model check finds: each problem with its stable code (docs/contracts.md) and the
verdict they add up to; a refused result becomes the error that carries those codes."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from lucebox.engine.core.errors import GuardRefusal
from lucebox.engine.models.headerinfo import ModelInfo

Severity = Literal["error", "warning"]
Verdict = Literal["ok", "warn", "refuse"]


@dataclass(frozen=True)
class Problem:
    code: str
    severity: Severity
    message: str


@dataclass(frozen=True)
class CheckResult:
    path: str
    verdict: Verdict
    problems: tuple[Problem, ...]
    info: ModelInfo | None
    notes: tuple[str, ...] = ()
    """Checks that could not run and why (not problems of the file)."""
    speculative_type: str | None = None
    """For a draft checked against its target: the type the pair would use."""

    @property
    def usable(self) -> bool:
        return self.verdict != "refuse"

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "path": self.path,
            "verdict": self.verdict,
            "problems": [p.__dict__ for p in self.problems],
            "info": self.info.to_json() if self.info else {},
            "notes": list(self.notes),
        }
        if self.speculative_type is not None:
            out["speculative_type"] = self.speculative_type
        return out


ALLOW_BASE_CODES = frozenset({"base-model", "no-chat-template"})
"""The problems that allowing a base model (``--allow-base``) turns into warnings."""


def refusal(result: CheckResult) -> GuardRefusal:
    """The error for a model the check refused, carrying the codes of what refused it."""
    return GuardRefusal(
        f"{Path(result.path).name} was refused by the model check",
        hint="see the problems above",
        problem_codes=tuple(p.code for p in result.problems if p.severity == "error"),
    )


def allow_base_serves(refused: GuardRefusal) -> bool:
    """Whether allowing a base model would let this refused model be served."""
    return bool(refused.problem_codes) and set(refused.problem_codes) <= ALLOW_BASE_CODES


def verdict_of(problems: list[Problem]) -> Verdict:
    if any(p.severity == "error" for p in problems):
        return "refuse"
    return "warn" if problems else "ok"
