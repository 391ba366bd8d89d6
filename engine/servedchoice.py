"""What a launch serves: one model by its own engine, or a set behind llama-server's router.

Each front end asks once (``served_choice``) and branches on the answer: a ``OneModel`` goes to
:mod:`lucebox.engine.pipeline`, a ``ModelSet`` to :mod:`lucebox.engine.servedset`.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from lucebox.engine.machine.config import Settings
from lucebox.engine.plan.options import ServeOptions


@dataclass(frozen=True)
class OneModel:
    """One model or preset; models.served's only entry is the model when nothing is named."""

    options: ServeOptions


@dataclass(frozen=True)
class ModelSet:
    """Several models on one endpoint: several --model, or models.served when nothing is named."""

    options: ServeOptions
    sources: tuple[str, ...]


ServedChoice = OneModel | ModelSet


def served_choice(options: ServeOptions, settings: Settings) -> ServedChoice:
    """One model or a set, from the options over the models.served setting."""
    if options.models:
        return ModelSet(options, options.models)
    named = options.model or options.preset
    served = settings.models_served
    if named:
        return OneModel(options)
    if len(served) > 1:
        return ModelSet(options, served)
    if len(served) == 1:
        return OneModel(replace(options, model=served[0]))
    return OneModel(options)
