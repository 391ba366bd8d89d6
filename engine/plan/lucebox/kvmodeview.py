"""The long-context modes as `plan`, `status` and the dashboard show them (values only: `lucebox
status` reads them without the planner's measurement store, plan/lucebox/kvmodes.py)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class ModeView:
    """One measured mode as `plan`, `status` and the dashboard show it."""

    label: str
    serving: bool
    short_tok_s: float
    long_tok_s: float | None
    long_prompt_tokens: int | None
    long_ttft_s: float | None
    gives_up: str

    def text(self) -> str:
        speed = f"{self.short_tok_s:.1f} tok/s"
        if self.long_tok_s is not None and self.long_prompt_tokens:
            speed += (
                f", {self.long_tok_s:.1f} tok/s after {self.long_prompt_tokens:,} tokens "
                f"(first token {self.long_ttft_s or 0:.1f} s)"
            )
        mark = " (serving)" if self.serving else ""
        return f"{self.label}{mark}: {speed}; gives up {self.gives_up}"

    def to_json(self) -> dict[str, Any]:
        return {
            "mode": self.label,
            "serving": self.serving,
            "short_tok_s": round(self.short_tok_s, 1),
            "long_tok_s": round(self.long_tok_s, 1) if self.long_tok_s is not None else None,
            "long_prompt_tokens": self.long_prompt_tokens,
            "long_ttft_s": round(self.long_ttft_s, 2) if self.long_ttft_s is not None else None,
            "gives_up": self.gives_up,
        }

    @classmethod
    def from_json(cls, data: Any) -> ModeView | None:
        if not isinstance(data, dict) or not isinstance(data.get("mode"), str):
            return None

        def number(name: str) -> float | None:
            value = data.get(name)
            return float(value) if isinstance(value, int | float) else None

        tokens = data.get("long_prompt_tokens")
        return cls(
            data["mode"],
            bool(data.get("serving")),
            number("short_tok_s") or 0.0,
            number("long_tok_s"),
            tokens if isinstance(tokens, int) else None,
            number("long_ttft_s"),
            str(data.get("gives_up") or ""),
        )


@dataclass(frozen=True)
class ModesStatus:
    """The long-context modes as `status` reports them while the server runs."""

    state: str
    """The measurement's: waiting (for an idle server), running, paused, done."""
    measuring: str | None
    modes: tuple[ModeView, ...]
    unmeasured: tuple[str, ...]

    def to_json(self) -> dict[str, Any]:
        return {
            "state": self.state,
            "measuring": self.measuring,
            "modes": [view.to_json() for view in self.modes],
            "unmeasured": list(self.unmeasured),
        }

    @classmethod
    def from_json(cls, data: Any) -> ModesStatus | None:
        if not isinstance(data, dict) or not isinstance(data.get("modes"), list):
            return None
        found = (ModeView.from_json(item) for item in data["modes"])
        unmeasured = data.get("unmeasured")
        measuring = data.get("measuring")
        return cls(
            str(data.get("state") or ""),
            measuring if isinstance(measuring, str) else None,
            tuple(view for view in found if view is not None),
            tuple(str(x) for x in unmeasured) if isinstance(unmeasured, list) else (),
        )

    def lines(self) -> list[str]:
        """What `status` and the dashboard print."""
        shown = [view.text() for view in self.modes]
        if self.measuring is not None and self.state == "running":
            shown.append(f"measuring {self.measuring} now")
        if self.unmeasured:
            shown.append(f"unmeasured: {', '.join(self.unmeasured)} (once the server is idle)")
        return shown
