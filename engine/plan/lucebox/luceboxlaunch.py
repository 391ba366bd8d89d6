"""Launch (pure) for the Lucebox engine: the flags a plan decided -> ``dflash_server`` argv.

Built from the pinned engine's own parser (``server_main.cpp``), not its README: the model is
argv[1], options are space-separated (``--max-ctx=N`` is refused), ``--host`` takes an IPv4
literal and defaults to 0.0.0.0 with no authentication (so 127.0.0.1 is always passed),
``--max-tokens`` must stay below ``--max-ctx`` or a request without ``max_tokens`` gets HTTP
400, and ``--spark`` is never passed (it reads coding agents' private histories).

``--chat-template-file`` (the GGUF's own template through the engine's Jinja) is not passed
either: that path hands the template only each message's role, content and tool_call_id
(``render_chat_template_jinja`` in ``chat_template.cpp``), so an agent's earlier tool calls,
which Qwen's GGUF template renders from ``tool_calls``, would vanish from the prompt. The
engine's own renderer is ChatML with the tool preamble for the families it serves, the same
turns the GGUF template makes; the thinking default is set per model by lucebox's front on
both engines (:mod:`lucebox.engine.plan.chatdefaults`).
"""

from __future__ import annotations

from dataclasses import dataclass

from lucebox.engine.plan.lucebox.diskcache import DiskCache

LOOPBACK = "127.0.0.1"
SAMPLED_VERIFY_ARCHS = ("qwen35", "laguna")
"""Where the engine offers sampled verification (``DFLASH_SAMPLED_VERIFY=1``): speculation
also for requests with a temperature, which otherwise silently decode without it."""
ENGINE_ENV_PREFIXES = ("DFLASH", "LUCE_")
"""Engine settings it reads from its environment: only the plan sets them."""
PLACEMENT_ARGV = {
    "draft-apart": ["--target-device", "cuda:0", "--draft-device", "cuda:1", "--peer-access"],
    "tensor": ["--target-devices", "cuda:0,cuda:1", "--target-split-mode", "tensor",
               "--peer-access"],
}  # fmt: skip
"""Device flags per two-card placement. The engine sees only the launch's cards
(``CUDA_VISIBLE_DEVICES``, the target's first), so it numbers them 0 and 1; peer access lets
cross-card copies go card to card instead of through host RAM (a pair without it only warns)."""


@dataclass(frozen=True)
class LuceboxFlags:
    """What the plan decided for ``dflash_server`` beyond paths and port."""

    max_ctx: int
    max_tokens: int
    cache_type: str | None
    """One type for K and V (the build has only the symmetric kernels); None: the family's
    own (Gemma 4's KV is f16 whatever the flags say)."""
    prefix_cache_slots: int
    ddtree_budget: int | None = None
    """DDTree on with this budget when a draft is used; None: no draft."""
    kvflash_pool: int | None = None
    kvflash_policy: str = "lru"
    prefill: str = "off"
    """PFlash: off, auto (long single prompts) or always."""
    prefill_drafter: str | None = None
    sampled_verify: bool = False
    placement: str = "one"
    """one (a single card), draft-apart (target on the first card the engine sees, draft on
    the second) or tensor (the target split by tensor across both)."""
    disk_cache: DiskCache | None = None
    """The disk prefix cache (plan/lucebox/diskcache.py); None or no folder: not passed."""


def dflash_server_argv(
    server_path: str,
    model_path: str,
    alias: str,
    port: int,
    flags: LuceboxFlags,
    draft_path: str | None,
) -> list[str]:
    """The exact ``dflash_server`` command line."""
    argv = [
        server_path,
        model_path,
        "--host",
        LOOPBACK,
        "--port",
        str(port),
        "--model-name",
        alias,
        "--max-ctx",
        str(flags.max_ctx),
        "--max-tokens",
        str(flags.max_tokens),
        "--fa-window",
        "0",
        "--prefix-cache-slots",
        str(flags.prefix_cache_slots),
    ]
    if flags.cache_type is not None:
        argv += ["--cache-type-k", flags.cache_type, "--cache-type-v", flags.cache_type]
    argv += PLACEMENT_ARGV.get(flags.placement, [])
    if draft_path is not None:
        argv += ["--draft", draft_path]
        if flags.ddtree_budget is not None:
            argv += ["--ddtree", "--ddtree-budget", str(flags.ddtree_budget)]
    if flags.kvflash_pool is not None:
        argv += [
            "--kvflash",
            str(flags.kvflash_pool),
            "--kvflash-policy",
            flags.kvflash_policy,
        ]
    if flags.prefill != "off" and flags.prefill_drafter is not None:
        argv += ["--prefill-compression", flags.prefill, "--prefill-drafter", flags.prefill_drafter]
    return argv + disk_cache_argv(flags.disk_cache)


def disk_cache_argv(disk: DiskCache | None) -> list[str]:
    """The engine's disk prefix cache flags: none unless the plan gave it a folder."""
    if disk is None or disk.folder is None:
        return []
    return [
        "--kv-cache-dir", disk.folder,
        "--kv-cache-budget", str(disk.budget_mib),
        "--kv-cache-min-tokens", str(disk.min_tokens),
        "--disk-prefix-cache", disk.policy,
    ]  # fmt: skip


def lucebox_env(flags: LuceboxFlags) -> dict[str, str]:
    return {"DFLASH_SAMPLED_VERIFY": "1"} if flags.sampled_verify else {}
