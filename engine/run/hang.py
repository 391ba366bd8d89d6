"""When a busy engine that makes no progress counts as hung (pure).

The run looks at the engine about once a second (the sampler's samples) and keeps a
:class:`Watch`: when it last saw the engine progress while a request ran. A stopped or
deadlocked engine answers nothing, or answers the same counts again; past the bound of the
phase it is in, the run kills it and the supervisor names the death ``hang`` and restarts it.
Loading has its own bound already: the supervisor's ready timeout.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Literal

PREFILL_FLOOR_S = 60.0
"""No prompt is judged hung sooner: a short prompt behind a cold page cache or a busy CPU can
take tens of seconds before its first batch counts."""
PREFILL_FACTOR = 3.0
"""A prompt may take this many times its expected time (prompt tokens at the measured prefill
rate): the measured rate is a mean over other prompts, on a machine doing other things."""
PREFILL_TOKENS_PER_S_UNKNOWN = 20.0
"""The rate assumed before any prefill was measured: a slow CPU's, so the bound errs long."""
DECODE_SILENCE_S = 60.0
"""No token for this long while decoding is a hang: the slowest engine lucebox serves makes
a token in seconds, and a client's watchdog gives up in minutes."""

Phase = Literal["prefill", "decode", "silent"]
"""``silent``: a request runs (its sender says so) but the engine has answered no look yet."""
SILENT_FACTOR = 3.0
"""A request whose engine answered no look at all may go this many times the prefill floor:
its prompt length is unknown, and llama-server answers a look only between prompt batches."""


@dataclass(frozen=True)
class HangBounds:
    """The bounds by phase; tests inject short ones."""

    prefill_floor_s: float = PREFILL_FLOOR_S
    prefill_factor: float = PREFILL_FACTOR
    decode_s: float = DECODE_SILENCE_S
    silent_factor: float = SILENT_FACTOR
    """Times the prefill floor a request may go while its engine answers no look; an engine
    that answers looks whatever it computes gets 1."""


DEFAULT_BOUNDS = HangBounds()


@dataclass(frozen=True)
class Look:
    """One look at the engine: whether a request runs, its phase and what has been done."""

    at_s: float
    busy: bool
    phase: Phase = "prefill"
    prompt_tokens: int = 0
    """The running prompt's length (the longest when several run)."""
    progress: tuple[int, ...] = ()
    """Counts that grow while the engine works (tokens processed, generated, finished)."""


@dataclass(frozen=True)
class Watch:
    """Since when a busy engine has shown no progress; idle: ``since_s`` is None."""

    since_s: float | None = None
    phase: Phase = "prefill"
    prompt_tokens: int = 0
    progress: tuple[int, ...] = ()


def bounds_for(hang_s: float) -> HangBounds | None:
    """The bounds the ``server.hang_s`` setting sets (the prefill floor and the decode silence);
    None for 0: no request is ever judged hung."""
    if hang_s <= 0:
        return None
    return HangBounds(prefill_floor_s=hang_s, decode_s=hang_s)


def observe(watch: Watch, look: Look | None, now_s: float) -> Watch:
    """The watch after a look; ``look`` None: the engine did not answer (no progress)."""
    if look is None:
        return watch
    if not look.busy:
        return Watch()
    if watch.since_s is None or look.progress != watch.progress or look.phase != watch.phase:
        return Watch(look.at_s, look.phase, look.prompt_tokens, look.progress)
    return replace(watch, prompt_tokens=max(watch.prompt_tokens, look.prompt_tokens))


def chosen_look(watch: Watch, engine_look: Look | None, front_look: Look | None) -> Look | None:
    """The engine's own look, or where it answered none, the front's view of its requests:
    an engine stopped as a request reached it (a GPU decodes a short reply between two looks)
    was never seen busy, and a stream's chunks are decode progress. A request the front only
    knows was sent never replaces a watch the engine's looks set (llama-server answers none
    during a prompt batch, whose bound scales with the prompt)."""
    if engine_look is not None or front_look is None:
        return engine_look
    if watch.since_s is None or front_look.phase == "decode":
        return front_look
    return None


def silent_watch(now_s: float) -> Watch:
    """The watch of a request known to run whose engine answered no look yet."""
    return Watch(now_s, "silent")


def bound_s(watch: Watch, prefill_tokens_per_s: float | None, bounds: HangBounds) -> float:
    """How long the watched phase may go without progress."""
    if watch.phase == "decode":
        return bounds.decode_s
    if watch.phase == "silent":
        return bounds.silent_factor * bounds.prefill_floor_s
    rate = prefill_tokens_per_s or PREFILL_TOKENS_PER_S_UNKNOWN
    return max(bounds.prefill_floor_s, bounds.prefill_factor * watch.prompt_tokens / rate)


def hung(
    watch: Watch, now_s: float, prefill_tokens_per_s: float | None, bounds: HangBounds
) -> str | None:
    """Why the engine counts as hung now, in words; None while it does not."""
    if watch.since_s is None:
        return None
    silent_s = now_s - watch.since_s
    limit_s = bound_s(watch, prefill_tokens_per_s, bounds)
    if silent_s < limit_s:
        return None
    if watch.phase == "decode":
        return f"a request got no token for {silent_s:.0f} s while decoding (bound {limit_s:.0f} s)"
    if watch.phase == "silent":
        return f"a request's engine answered nothing for {silent_s:.0f} s (bound {limit_s:.0f} s)"
    return (
        f"a request's prompt ({watch.prompt_tokens} tokens) made no progress for "
        f"{silent_s:.0f} s (bound {limit_s:.0f} s)"
    )
