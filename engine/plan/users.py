"""Several people at once: how many llama-server slots a launch gets, what each person's
context is, and whether the agent's saved slot still seats.

llama-server serves ``-np N`` slots from one unified KV pool (``--kv-unified``): any slot may
use the whole context while the others are idle, and when all N are busy they share it. The
planner sizes the pool from memory as for one slot; each person's share is then the context
over N, and where that share falls under :data:`SHARE_MIN_CTX` fewer users are planned, with
the reason. The Lucebox engine serves one request at a time: the others queue in the front.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

from lucebox.engine.core.units import MIB
from lucebox.engine.plan.memory.ctxchoice import MIN_CTX
from lucebox.engine.plan.memory.memory import Plan
from lucebox.engine.plan.memory.request import PlanRequest

SHARE_MIN_CTX = MIN_CTX
"""The least context a person's share may have: the smallest context the planner plans for
one user (a system prompt, a few turns and a reply)."""


@dataclass(frozen=True)
class UsersPlan:
    """The concurrent users a launch serves, and what each gets."""

    asked: int
    """``--users`` or server.users."""
    slots: int
    """Requests the engine serves at once (``-np``); the rest wait in the front's queue."""
    ctx: int
    """The context one person may use while the others are idle (the whole pool)."""
    share_ctx: int
    """Each person's context while all ``slots`` are busy."""
    reason: str

    @property
    def note(self) -> str:
        """What `up` says before it serves: why not everyone gets a slot ("" when all do)."""
        return self.reason if self.slots < self.asked else ""

    @property
    def queued(self) -> int:
        """Users beyond the engine's slots: their requests wait their turn in the front."""
        return max(0, self.asked - self.slots)

    def to_json(self) -> dict[str, Any]:
        return {
            "asked": self.asked,
            "slots": self.slots,
            "queued": self.queued,
            "ctx": self.ctx,
            "share_ctx": self.share_ctx,
            "reason": self.reason,
        }


def fit_users(
    request: PlanRequest, asked: int, plan_of: Callable[[PlanRequest], Plan]
) -> tuple[PlanRequest, str]:
    """The request with the most slots up to ``asked`` whose plan fits, keeps the weights where
    one slot keeps them and leaves each person ``SHARE_MIN_CTX``; with why fewer, when fewer
    ("" when all were seated)."""
    if asked == 1:
        return request, ""
    one = plan_of(replace(request, parallel=1))
    placed = (one.n_gpu_layers, one.n_cpu_moe)
    for slots in range(asked, 1, -1):
        held = replace(request, parallel=slots)
        plan = plan_of(held)
        seated = plan.fits and (plan.n_gpu_layers, plan.n_cpu_moe) == placed
        if seated and plan.ctx // slots >= SHARE_MIN_CTX:
            break
    else:
        held = replace(request, parallel=1)
    if held.parallel == asked:
        return held, ""
    return held, _fewer_reason(asked, held.parallel, plan_of(replace(request, parallel=asked)), one)


def _fewer_reason(asked: int, slots: int, plan: Plan, one: Plan) -> str:
    share = plan.ctx // asked
    if not plan.fits:
        why = f"{asked} slots do not fit (each keeps its own state)"
    elif (plan.n_gpu_layers, plan.n_cpu_moe) != (one.n_gpu_layers, one.n_cpu_moe):
        why = f"{asked} slots would move weights off the GPU (each keeps its own state)"
    else:
        why = f"{asked} would share {plan.ctx} tokens, {share} each, under {SHARE_MIN_CTX}"
    return f"{asked} users asked, {slots} planned: {why}; fewer users (server.users) get more each"


def llama_users(asked: int, plan: Plan, fewer_reason: str) -> UsersPlan:
    """llama-server's users: ``plan.parallel`` slots sharing ``plan.ctx`` tokens, and where the
    agent's conversation stays."""
    slots = plan.parallel
    share = plan.ctx // slots
    if slots == 1:
        said = f"one slot: a person uses up to {plan.ctx} tokens; others wait their turn"
    else:
        said = (
            f"{slots} slots share one {plan.ctx}-token KV pool: a person uses up to "
            f"{plan.ctx} tokens while the others are idle, about {share} each when all "
            f"{slots} are busy"
        )
    agent = _agent_reason(plan) if slots > 1 else ""
    reason = "; ".join(filter(None, [fewer_reason, said, agent]))
    return UsersPlan(asked, slots, plan.ctx, share, reason)


def _agent_reason(plan: Plan) -> str:
    """Where an agent's conversation goes while others chat: the engine saves idle slots to its
    host-RAM prompt cache and clears them when another starts, and restores them from there."""
    cache_mib = plan.cache_ram_mib or 0
    kv_mib = plan.memory_bytes.kv // MIB
    saved = (
        "the agent's saved slot restores into slot 0 as with one user (same context and KV types)"
    )
    if cache_mib <= 0:
        return (
            f"{saved}; with no host-RAM prompt cache, another person's request clears the "
            "agent's cached prompt and its next turn reads it again"
        )
    kept = "a whole pool" if cache_mib >= kv_mib else f"{cache_mib} MiB of the {kv_mib} MiB pool"
    return (
        f"{saved}; while others chat its cached prompt waits in the {cache_mib} MiB host-RAM "
        f"prompt cache ({kept}) and comes back from there instead of being read again"
    )


def queued_users(asked: int, ctx: int) -> UsersPlan:
    """An engine that serves one request at a time: every user beyond the first queues."""
    if asked == 1:
        reason = f"one request at a time: a person uses up to {ctx} tokens"
    else:
        reason = (
            f"{asked} users asked; this engine serves one request at a time: the others "
            "queue in lucebox's front and hear their place (llama-server serves several at "
            "once: --engine llama-server)"
        )
    return UsersPlan(asked, 1, ctx, ctx, reason)
