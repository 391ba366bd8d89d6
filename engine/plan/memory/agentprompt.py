"""How long a coding agent's own first prompt takes on this server, and whether it fits at all.

Agents send a long system prompt and tool list before the user's words. On a GPU that is a
fraction of a second; on a CPU it can take minutes, once: the engine's prompt cache keeps it, so
later requests start in seconds. ``connect`` and ``launch`` say so before the user waits, and
refuse nothing: a prompt that does not fit the served context is a warning with the fix.
"""

from __future__ import annotations

from dataclasses import dataclass

AGENT_PROMPT_TOKENS: dict[str, int] = {
    "codex": 3330,
    "claude-code": 4140,
    "opencode": 2240,
    "qwen-code": 7600,
    "aider": 671,
    "continue": 338,
}
"""Tokens of each agent's first request for a one-line task with the settings `connect` writes
(Codex sends ~4.6K without `model_context_window`), as SmolLM2's engine counted them (prompt
eval in the engine log; tests/e2e/test_agent_clients.py). Other tokenizers differ by a few
tens of percent; the clients' versions are those
support/agentinstall.py installs."""

CPU_PREFILL_BYTE_TOKENS_PER_CORE_S = 2.7e9
"""A CPU's prefill rate x weights bytes / cores: 55 tokens/s measured for SmolLM2-135M Q4_1
(98 MB) on 2 shared cores at a 2-8K prompt; prefill is compute bound, so the rate falls with the
model's size and rises with cores."""

SLOW_PROMPT_S = 10.0
"""Longer than this, a user would think the agent hangs: say so first."""


@dataclass(frozen=True)
class ServedModel:
    """What the estimate needs to know about the server."""

    ctx: int
    on_gpu: bool
    weights_bytes: int
    cpu_cores: int
    measured_prefill_tokens_per_s: float | None = None
    """The running engine's own prefill rate, when it has served a request."""

    def prefill_tokens_per_s(self) -> float | None:
        """Measured, else estimated for a CPU; None on a GPU (fast enough not to matter)."""
        if self.measured_prefill_tokens_per_s:
            return self.measured_prefill_tokens_per_s
        if self.on_gpu or self.weights_bytes <= 0:
            return None
        return CPU_PREFILL_BYTE_TOKENS_PER_CORE_S * self.cpu_cores / self.weights_bytes


def prompt_warnings(client: str, served: ServedModel, output_tokens: int | None) -> list[str]:
    """What to tell the user about ``client``'s own prompt on ``served`` (empty: nothing)."""
    prompt_tokens = AGENT_PROMPT_TOKENS.get(client)
    if prompt_tokens is None:
        return []
    needed = prompt_tokens + (output_tokens or 0)
    if needed > served.ctx:
        return [
            f"{client} sends ~{prompt_tokens} tokens of its own prompt before yours"
            f"{f' and asks for up to {output_tokens} tokens back' if output_tokens else ''}:"
            f" more than the served context of {served.ctx} tokens, so the server will refuse"
            f" it; serve a larger context (`lucebox serve --ctx {_room_for(needed)}`)"
        ]
    rate = served.prefill_tokens_per_s()
    if rate is None:
        return []
    seconds = prompt_tokens / rate
    if seconds <= SLOW_PROMPT_S:
        return []
    how = "measured" if served.measured_prefill_tokens_per_s else "estimated for this CPU"
    return [
        f"{client} sends ~{prompt_tokens} tokens of its own prompt first: at ~{rate:.0f}"
        f" tokens/s ({how}) its first request takes ~{seconds:.0f} s before a word comes back;"
        " the engine's prompt cache keeps that prompt, so later requests start in seconds"
    ]


def _room_for(tokens: int) -> int:
    """The next power of two at or above ``tokens`` (contexts are planned in such steps)."""
    room = 1024
    while room < tokens:
        room *= 2
    return room
