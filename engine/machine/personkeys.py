"""A key per person: named API keys with a scope, kept hashed in ``keys.json`` (mode 0600).

A household shares one server; each person (or app) gets a key of their own, so one can be
taken back without changing everyone's, and what each used is counted. The key is shown once,
when it is made; the file keeps its SHA-256 only (keys are 32 random bytes, so a fast hash is
enough), compared in constant time. The front reads the file again whenever it changes, so a
key made or revoked takes effect on the next request, without a restart. ``server.api_key``
(the key file of :mod:`apikey`) keeps working beside these, with every scope.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import re
import secrets
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Literal, get_args

from lucebox.engine.core.atomic import write_text_atomic
from lucebox.engine.core.errors import ConfigError, UsageError
from lucebox.engine.core.paths import Paths

Scope = Literal["chat", "models", "admin"]
SCOPES: tuple[Scope, ...] = get_args(Scope)
"""chat: talk to the model (and list it); models: also load and unload a set's models and
read the server's properties; admin: every path, the engine's slots and metrics included."""
KEYS_FILE_NAME = "keys.json"
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,39}$")


@dataclass(frozen=True)
class PersonKey:
    name: str
    scope: Scope
    sha256: str
    created_at: str


@dataclass(frozen=True)
class KeyRing:
    """Every person's key as the file holds it now."""

    keys: tuple[PersonKey, ...] = ()

    def who(self, presented: str) -> PersonKey | None:
        """The key ``presented`` is, compared against every entry in constant time."""
        digest = _digest(presented)
        found = None
        for key in self.keys:
            if hmac.compare_digest(key.sha256, digest):
                found = key
        return found

    def named(self, name: str) -> PersonKey | None:
        return next((k for k in self.keys if k.name == name), None)


def _digest(key: str) -> str:
    return hashlib.sha256(key.encode("utf-8")).hexdigest()


def keys_path(paths: Paths) -> Path:
    return paths.config_dir / KEYS_FILE_NAME


def read_keys(path: Path) -> KeyRing:
    """The keys in ``path``; none when it does not exist."""
    try:
        entries = json.loads(path.read_text(encoding="utf-8"))["keys"]
        return KeyRing(tuple(_entry(e) for e in entries))
    except FileNotFoundError:
        return KeyRing()
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise ConfigError(
            f"cannot read the keys file {path}: {exc}",
            hint="fix it, or move it away and make the keys again with `lucebox keys add`",
        ) from exc


def _entry(raw: dict[str, str]) -> PersonKey:
    scope = next((s for s in SCOPES if s == raw["scope"]), None)
    if scope is None or not _NAME.match(raw["name"]):
        raise ValueError(f"bad entry {raw.get('name')!r}")
    return PersonKey(raw["name"], scope, raw["sha256"], raw["created_at"])


def _write(path: Path, ring: KeyRing) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    document = {"keys": [asdict(k) for k in ring.keys]}
    write_text_atomic(path, json.dumps(document, indent=2) + "\n")  # mode 0600


def add_key(paths: Paths, name: str, scope: Scope) -> tuple[PersonKey, str]:
    """A new key for ``name`` and the key itself (shown once, never stored)."""
    if not _NAME.match(name):
        raise UsageError(
            f"'{name}' is not a key name",
            hint="use letters, digits, '.', '_' or '-' (up to 40), starting with a letter or digit",
        )
    path = keys_path(paths)
    ring = read_keys(path)
    if ring.named(name) is not None:
        raise UsageError(
            f"a key named '{name}' exists",
            hint=f"`lucebox keys revoke {name}` first, or pick another name",
        )
    secret = f"{SECRET_PREFIX}{secrets.token_urlsafe(32)}"
    stamp = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    made = PersonKey(name, scope, _digest(secret), stamp)
    _write(path, KeyRing((*ring.keys, made)))
    return made, secret


def revoke_key(paths: Paths, name: str) -> PersonKey:
    path = keys_path(paths)
    ring = read_keys(path)
    gone = ring.named(name)
    if gone is None:
        known = ", ".join(k.name for k in ring.keys) or "none"
        raise UsageError(f"no key named '{name}'", hint=f"keys: {known}")
    _write(path, KeyRing(tuple(k for k in ring.keys if k.name != name)))
    return gone


SECRET_PREFIX = "lbk-"
CLIENT_KEYS_FOLDER = "client-keys"
"""Where ``connect --key`` keeps a person's key for the client configs it writes (0600)."""


@dataclass(frozen=True)
class ClientKey:
    """A person's key a client is set up with: whose, the key, the file it is read from."""

    name: str
    secret: str
    path: Path
    made: bool
    """Made now for this client (``--key NAME`` of a name with no key yet)."""


def key_for_client(paths: Paths, given: str) -> ClientKey:
    """The person's key ``given`` names: its value (as ``keys add`` printed it), or a name
    with no key yet, for which a chat key is made. A name that has a key is refused: only its
    hash is kept, so lucebox cannot write it."""
    ring = read_keys(keys_path(paths))
    person = ring.who(given)
    made = False
    if person is None and given.startswith(SECRET_PREFIX):
        raise UsageError(
            "--key is not a key of this server (revoked, or made for another)",
            hint="`lucebox keys list` shows the keys; `lucebox keys add NAME` makes one",
        )
    if person is None and ring.named(given) is not None:
        raise UsageError(
            f"the key of '{given}' is kept hashed, so lucebox cannot write it",
            hint=f"pass the key itself (`keys add` printed it), or `lucebox keys revoke {given}` "
            "and connect again with --key NAME to make a new one",
        )
    if person is None:
        person, given = add_key(paths, given, "chat")
        made = True
    path = paths.config_dir / CLIENT_KEYS_FOLDER / f"{person.name}.key"
    path.parent.mkdir(parents=True, exist_ok=True)
    write_text_atomic(path, given + "\n")  # mode 0600
    return ClientKey(person.name, given, path, made)


class KeyWatch:
    """The keys file as it is now: read again when its size or modification time changes
    (one ``stat`` per request), so a key made or revoked counts at once."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._seen: tuple[int, int] | None = None
        self._ring = KeyRing()
        self.problem: str | None = None
        """Why the file could not be read (then no person key is admitted)."""

    def ring(self) -> KeyRing:
        try:
            info = self.path.stat()
            seen = (info.st_mtime_ns, info.st_size)
        except FileNotFoundError:
            seen = None
        if seen != self._seen:
            try:
                self._ring, self.problem = (read_keys(self.path) if seen else KeyRing()), None
            except ConfigError as exc:
                self._ring, self.problem = KeyRing(), exc.message
            self._seen = seen
        return self._ring
