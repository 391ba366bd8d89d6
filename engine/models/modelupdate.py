"""Whether a model pulled from the Hub has a newer revision: its repo's newest commit and
which of the model's files differ there (by sha256), in one request to the Hub.

Only what the user asks for moves a model (``models update``); the doctor asks this with a
short timeout and says when it could not.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from lucebox.engine.core.errors import UsageError
from lucebox.engine.models import hubrepo
from lucebox.engine.models.guard import shard_names
from lucebox.engine.models.records import ModelRecord, StoreError

DOCTOR_TIMEOUT_S = 5.0
"""The doctor's wait per repo: a slow Hub makes the check say it could not tell, not hang."""


@dataclass(frozen=True)
class RevisionCheck:
    """A stored model against its repo's newest commit."""

    name: str
    repo_id: str
    current: str | None
    """The commit the stored files came from (None when the pull did not learn it)."""
    newest: str
    changed: tuple[str, ...]
    """The model's files (names in the repo) whose sha256 differs at ``newest``."""

    @property
    def newer(self) -> bool:
        return bool(self.changed)

    def to_json(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "repo": self.repo_id,
            "current_revision": self.current,
            "newest_revision": self.newest,
            "changed_files": list(self.changed),
            "newer": self.newer,
        }


def updatable(record: ModelRecord) -> bool:
    """A model whose files came from a Hub repo (a PyPI package or local file has no newer
    revision lucebox can see)."""
    return record.kind == "hf"


def check_revision(record: ModelRecord, *, timeout_s: float | None = None) -> RevisionCheck:
    """``record``'s repo at its newest commit, compared file by file with what is stored;
    :class:`hubrepo.HubUnreachableError` when the Hub does not answer."""
    if not updatable(record):
        raise UsageError(
            f"{record.name} came from {record.source}, not from a Hub repo: it has no revisions",
            hint="`lucebox models pull SRC` fetches another version",
        )
    source = record.model_source
    newest, files = hubrepo.repo_files(source.repo_id, timeout_s=timeout_s)
    names = shard_names(source.filename)
    missing = [n for n in names if n not in files]
    if missing:
        raise StoreError(
            f"{source.repo_id} at {newest[:12]} no longer holds {', '.join(missing)}",
            hint=f"{record.name} stays as it is; `lucebox models quants {source.repo_id}` "
            "lists what the repo holds now",
        )
    changed = tuple(
        name
        for name, stored in zip(names, record.files, strict=False)
        if files[name] != stored.sha256
    )
    return RevisionCheck(record.name, source.repo_id, record.revision, newest, changed)
