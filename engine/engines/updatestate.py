"""The state of the last engine update: which build it replaced, and a rollback lucebox made.

Kept apart from :mod:`lucebox.engine.engines.update` so ``lucebox status`` reads it without
loading the engine registry (the light status path imports nothing heavy).
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from lucebox.engine.core.atomic import write_text_atomic
from lucebox.engine.core.paths import Paths

if TYPE_CHECKING:
    from lucebox.engine.engines.registry import KindName

STATE_NAME = "engine-update.json"


@dataclass(frozen=True)
class AutoRollback:
    """Why lucebox went back to the previous build by itself."""

    from_id: str
    to_id: str
    code: str
    """The death code the new build gave up with."""
    at: str
    why: str


@dataclass(frozen=True)
class UpdateState:
    """The last switch of the active build: from which, to which, and what happened since."""

    kind: KindName
    previous_id: str
    current_id: str
    switched_at: str
    starts: int = 0
    """Starts of ``current_id`` since the switch."""
    auto_rollback: AutoRollback | None = None

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> UpdateState:
        auto = data.get("auto_rollback")
        return cls(
            kind=data["kind"],
            previous_id=str(data["previous_id"]),
            current_id=str(data["current_id"]),
            switched_at=str(data.get("switched_at", "")),
            starts=int(data.get("starts", 0)),
            auto_rollback=AutoRollback(**auto) if auto else None,
        )


def state_file(paths: Paths) -> Path:
    return paths.state_dir / STATE_NAME


def read_state(paths: Paths) -> UpdateState | None:
    try:
        return UpdateState.from_json(json.loads(state_file(paths).read_text("utf-8")))
    except (OSError, ValueError, KeyError, TypeError):
        return None


def write_state(paths: Paths, state: UpdateState) -> None:
    paths.ensure(paths.state_dir)
    write_text_atomic(state_file(paths), json.dumps(state.to_json(), indent=2))
