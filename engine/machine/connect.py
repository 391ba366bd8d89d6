"""``lucebox connect CLIENT``: the settings that point a coding agent or SDK at this server.

For each client (``agentclients`` builds them): the base URL, the model alias, a key (the
server's, or a placeholder the client needs before it sends anything), the context window and
output limit where the client has fields for them, printed as shell exports and config text, or
merged into the client's own files. The user's original of each file is kept once
(``clientoriginal``), so ``--restore`` puts back what was there before lucebox, and every write
also leaves a dated backup beside the file.
"""

from __future__ import annotations

import difflib
import json
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from lucebox.engine.core.atomic import write_text_atomic
from lucebox.engine.core.errors import ConfigError, UsageError

PROVIDER_ID = "lucebox"
KEY_ENV = "LUCEBOX_API_KEY"
PLACEHOLDER_KEY = "lucebox-no-key"
"""Sent where a client refuses to start without a key and the server checks none."""


@dataclass(frozen=True)
class Endpoint:
    url: str
    """The server root, e.g. ``http://127.0.0.1:8080`` (no ``/v1``)."""
    model: str
    ctx: int | None = None
    """The context the server serves, in tokens; None when unknown."""
    api_key: str | None = None
    """The key the server checks; None when it takes any request."""
    api_key_file: Path | None = None
    """Where lucebox keeps that key: exports read it from there rather than print it."""
    aliases: tuple[str, ...] = ()
    """Every model of a served set (``model`` is the one the client starts with)."""
    embed_model: str | None = None
    """The embedding model served beside the chat model (``/v1/embeddings``); None: none."""

    @property
    def client_key(self) -> str:
        return self.api_key or PLACEHOLDER_KEY

    @property
    def output_tokens(self) -> int | None:
        """The reply limit clients get: a sixteenth of the window, so an agent's long prompt
        and history keep the rest (a reply that runs on never takes the context); between 256
        and 16384 tokens."""
        if self.ctx is None:
            return None
        return max(256, min(self.ctx // 16, 16384))


@dataclass(frozen=True)
class EnvVar:
    name: str
    value: str
    secret: bool = False
    """Holds the API key: exports read it from the key file instead of printing it."""


@dataclass(frozen=True)
class ConfigFile:
    """One file of the client's that lucebox merges its settings into."""

    path: Path
    merge: Callable[[str | None], str]
    """Existing file text (None when absent) -> the text with our settings merged in."""
    keeps_comments: bool = True


@dataclass(frozen=True)
class ClientSetup:
    client: str
    env: tuple[EnvVar, ...]
    """Shell variables that set the client up without files (printed as ``export`` lines)."""
    files: tuple[ConfigFile, ...]
    """What ``connect --write`` merges into the client's own files."""
    program: str | None = None
    """The command ``lucebox launch`` runs; None for an SDK."""
    launch_env: tuple[EnvVar, ...] = ()
    """The variables ``launch`` gives the client's process."""
    launch_args: tuple[str, ...] = ()
    """Arguments ``launch`` puts before the user's."""
    launch_files: tuple[ConfigFile, ...] = ()
    """The client's files ``launch`` must still change (the client reads nothing else)."""
    own_files: tuple[tuple[Path, str], ...] = ()
    """Files lucebox owns and ``launch`` writes whole (a config the client is pointed at)."""
    notes: tuple[str, ...] = ()


def load_json_object(text: str | None, path: Path) -> dict[str, Any]:
    if text is None or not text.strip():
        return {}
    try:
        value = json.loads(text)
    except ValueError as exc:
        raise ConfigError(
            f"{path} is not valid JSON ({exc}); lucebox will not rewrite it",
            hint="fix it or move it away, then run `lucebox connect` again",
        ) from None
    if not isinstance(value, dict):
        raise ConfigError(f"{path} does not hold a JSON object; lucebox will not rewrite it")
    return value


def table(settings: dict[str, Any], key: str, path: Path) -> dict[str, Any]:
    """``settings[key]`` as a table to merge into (empty when absent)."""
    value = settings.get(key)
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise ConfigError(
            f"{path}: `{key}` is not a table/object; lucebox will not rewrite it",
            hint=f"fix `{key}` or move the file away, then run `lucebox connect` again",
        )
    return value


def dump_json(settings: dict[str, Any]) -> str:
    return json.dumps(settings, indent=2) + "\n"


def known_client(name: str, clients: tuple[str, ...]) -> str:
    """``name`` when it is a client lucebox sets up; a usage error with the nearest otherwise."""
    if name in clients:
        return name
    near = difflib.get_close_matches(name.lower(), clients, n=1, cutoff=0.6)
    hint = f"did you mean `{near[0]}`? " if near else ""
    raise UsageError(f"unknown client {name!r}", hint=f"{hint}one of: {', '.join(clients)}")


def backup_path(path: Path) -> Path:
    """A backup name no earlier backup holds, so no write ever replaces another's copy."""
    stem = f"{path.name}.bak-{time.strftime('%Y%m%d-%H%M%S')}"
    candidate, number = path.with_name(stem), 1
    while candidate.exists():
        candidate, number = path.with_name(f"{stem}-{number}"), number + 1
    return candidate


def read_text(path: Path) -> str | None:
    try:
        return path.read_text("utf-8") if path.exists() else None
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"cannot read {path}: {exc}") from None


@dataclass(frozen=True)
class Written:
    path: Path
    backup: Path | None
    """The dated copy of the file as it was just before; None when there was no file."""
    dropped_comments: bool
    """The merge rewrote a file that had comments (the backup keeps them)."""


def write_file(config: ConfigFile, keep_original: Callable[[Path, str | None], None]) -> Written:
    """Merge into one file atomically, after ``keep_original`` has seen the text before."""
    path = config.path
    old = read_text(path)
    new = config.merge(old)
    keep_original(path, old)
    backup = None
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        if old is not None and old != new:
            backup = backup_path(path)
            write_text_atomic(backup, old)
        write_text_atomic(path, new)
    except OSError as exc:
        raise ConfigError(f"cannot write {path}: {exc.strerror}") from None
    had_comments = old is not None and any(
        line.lstrip().startswith(("#", "//")) for line in old.splitlines()
    )
    return Written(path, backup, not config.keeps_comments and had_comments)
