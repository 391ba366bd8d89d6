"""Known sources: the builds of each engine kind that lucebox ships knowledge of.

Each engine kind has a small table of them (llama.cpp's in ``pin.toml``, the Lucebox engine's
in :mod:`lucebox.engine.engines.lucebox`): where each comes from, its digest, its date, what it
adds over the one before and which flags it changes. What differs between builds is data in
that table; the code that fetches, checks and builds a source takes its ``pin`` and is the same
for every entry. One entry is the default, the source a fresh install builds.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Generic, TypeVar

P = TypeVar("P")


@dataclass(frozen=True)
class FlagChange:
    """A server flag this source changes over the one before: added (``old`` None), removed
    (``new`` None) or renamed."""

    old: str | None
    new: str | None

    def to_json(self) -> dict[str, str | None]:
        return {"old": self.old, "new": self.new}


@dataclass(frozen=True)
class KnownSource(Generic[P]):
    """One source of an engine kind, and the pin its fetch and check take."""

    version: str
    """How people name it: ``b11434`` for llama.cpp, the commit's short form for Lucebox."""
    date: str
    """When it was published (ISO date)."""
    origin: str
    """Where it comes from."""
    digest: str
    """What its bytes are checked against (``sha256:`` of an archive, ``tree-sha256:``)."""
    identity: str
    """The identity a source fetched from it carries (what installed builds record)."""
    binary: str
    """The server binary it builds."""
    pin: P
    """What ``ensure_source(..., pin=...)`` takes for it."""
    adds: tuple[str, ...] = ()
    """What it brings over the source before it in the table."""
    flag_changes: tuple[FlagChange, ...] = ()

    def to_json(self) -> dict[str, Any]:
        return {
            "version": self.version,
            "date": self.date,
            "origin": self.origin,
            "digest": self.digest,
            "binary": self.binary,
            "adds": list(self.adds),
            "flag_changes": [change.to_json() for change in self.flag_changes],
        }


@dataclass(frozen=True)
class KnownSources(Generic[P]):
    """An engine kind's known sources, oldest first, and which one a fresh install builds."""

    sources: tuple[KnownSource[P], ...]
    default_version: str

    def __post_init__(self) -> None:
        if self.by_version(self.default_version) is None:
            raise ValueError(f"the default source {self.default_version} is not in the table")

    @property
    def default(self) -> KnownSource[P]:
        found = self.by_version(self.default_version)
        assert found is not None  # checked when the table was made
        return found

    @property
    def newest(self) -> KnownSource[P]:
        return self.sources[-1]

    def by_version(self, version: str) -> KnownSource[P] | None:
        return next((s for s in self.sources if s.version == version), None)

    def by_identity(self, identity: str | None) -> KnownSource[P] | None:
        """The source an installed build was made from (its ``source_identity``), if known."""
        return next((s for s in self.sources if s.identity == identity), None)
