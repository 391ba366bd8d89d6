"""The TUI's messages: facts from the workers, and requests the screens make of the App.

Workers post the first kind from their threads; screens post the second kind and the App, which
owns the pipeline, the server and the lock, handles them. High-rate messages override
``can_replace`` so the queue keeps only the newest.
"""

from __future__ import annotations

from dataclasses import dataclass

from textual.message import Message

from lucebox.engine.pipeline import Prepared, StepEvent
from lucebox.engine.plan.lucebox.kvmodeview import ModesStatus
from lucebox.engine.run.kinds.metrics import Sample
from lucebox.engine.run.sample import EngineStatus, QueueStatus, SpecStatus
from lucebox.engine.run.servedsetmodels import ModelsSample
from lucebox.engine.run.supervision.serverevent import ServerEvent
from lucebox.engine.servedset import PreparedSet

# --- from the workers ---------------------------------------------------------------------------


@dataclass
class StepChanged(Message):
    event: StepEvent

    def can_replace(self, message: Message) -> bool:
        # Download and build progress come many times a second: keep the newest.
        return (
            isinstance(message, StepChanged)
            and message.event.step == self.event.step
            and message.event.fraction is not None
            and self.event.fraction is not None
        )


@dataclass
class PipelinePrepared(Message):
    prepared: Prepared | PreparedSet
    """One model's launch, or a served set's plans."""


@dataclass
class ServerChanged(Message):
    event: ServerEvent


@dataclass
class MetricsSampled(Message):
    """One second of the server's numbers; each one is a point of the sparklines, so none merge."""

    sample: Sample
    spec: SpecStatus | None = None
    """Speculation as the run sees it then (None: none planned)."""
    queue: QueueStatus | None = None
    """The front's queue then (None: no front, a served set)."""
    kv_modes: ModesStatus | None = None
    """A long context's modes as measured so far (None: not a long-context Lucebox launch)."""
    engine: EngineStatus | None = None
    """The engine kind serving then and what chose it."""


@dataclass
class ModelsSampled(Message):
    """A served set's models now (states, memory, load progress). None merge: each change of
    state is a fact to show, and the router sends a load's progress at most 5 times a second."""

    sample: ModelsSample


# --- from the screens ---------------------------------------------------------------------------


@dataclass
class RetryRequested(Message):
    """Run the pipeline again with the same options."""


@dataclass
class AllowBaseRequested(Message):
    """Run the pipeline again, serving a base model on purpose."""


@dataclass
class CpuEngineRequested(Message):
    """Build the CPU engine, as the user chose when the CUDA build was refused, then go on."""


@dataclass
class PresetPickRequested(Message):
    """Show the preset table; a choice restarts the pipeline with that preset."""


@dataclass
class UsersPickRequested(Message):
    """Ask how many people to serve at once; a new count restarts the pipeline with it."""


@dataclass
class SleepPickRequested(Message):
    """Ask how long idle before the engine sleeps; a new time restarts the pipeline with it."""


@dataclass
class RestartRequested(Message):
    """Restart the engine with the same plan."""


@dataclass
class KeysRequested(Message):
    """Show each person's key: make one, revoke one."""


@dataclass
class StopRequested(Message):
    """Stop the engine and keep the dashboard open."""


@dataclass
class ModelLoadRequested(Message):
    """Load this model of the served set, making room as a request for it would."""

    alias: str


@dataclass
class ModelUnloadRequested(Message):
    """Unload this model of the served set."""

    alias: str


@dataclass
class QuitRequested(Message):
    """Close the dashboard, either stopping the engine or handing it to a background service."""

    keep_serving: bool
