"""What the front of one engine serves and allows: the settings a run gives its front, and
gives again when a re-plan changes them."""

from __future__ import annotations

from dataclasses import dataclass

from lucebox.engine.run.front.chatpage import ChatPage
from lucebox.engine.run.front.frontguard import FrontPolicy
from lucebox.engine.run.front.frontqueue import DEFAULT_MAX_WAITING
from lucebox.engine.run.front.frontwire import KEEPALIVE_S
from lucebox.engine.run.front.sideroute import SideRoute

QUEUE_NOTE_S = 5.0
"""How often a waiting streamed request is told its place (``: queued, position N``)."""
ENGINE_WAIT_S = 600.0
"""How long a generation request waits, from its arrival, for an engine that is starting or
restarting (a measurement's restart, a re-plan, a crash's backoff) before it is answered 503,
where the launch's ready timeout is not known: a large model loads in minutes, and a request
relayed to an engine not listening yet would fail (502)."""


@dataclass(frozen=True)
class FrontSetup:
    """What the front of one engine serves and allows."""

    policy: FrontPolicy
    model: str
    """The served alias (``/v1/models``)."""
    ctx: int
    """The context the engine serves, in tokens (``context_length``)."""
    capacity: int = 1
    """Requests the engine serves at once: 1 for the Lucebox engine, llama-server's slots."""
    engine_key: str | None = None
    """The key the engine itself wants (llama-server's key file); None: it wants none."""
    max_waiting: int = DEFAULT_MAX_WAITING
    keepalive_s: float = KEEPALIVE_S
    queue_note_s: float = QUEUE_NOTE_S
    engine_wait_s: float = ENGINE_WAIT_S
    """The longest a request waits from its arrival for the engine to be ready (the
    launch's ready timeout where the run knows it)."""
    images: bool = True
    """The engine serves a vision projector; False: an image in a request is refused (400)."""
    thinking_default: bool | None = None
    """The model's planned thinking default, which Codex's model list offers."""
    sides: tuple[SideRoute, ...] = ()
    """Embedding and reranker models other processes serve: their requests skip the queue."""
    page: ChatPage | None = None
    """The chat page the front serves itself (the engine has none); None: the engine's."""
