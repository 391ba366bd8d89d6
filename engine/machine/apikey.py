"""The server's API key: generated once and kept in its own file (mode 0600) in the config folder.

llama-server reads the key with ``--api-key-file``, so it never appears on a command line
(``/proc/<pid>/cmdline`` is readable by every user) nor in the engine's environment.
"""

from __future__ import annotations

import os
import secrets
import stat
from pathlib import Path

from lucebox.engine.core.atomic import write_text_atomic
from lucebox.engine.core.errors import ConfigError, PathsError
from lucebox.engine.core.paths import Paths

KEY_FILE_NAME = "api_key"
PRIVATE_MODE = 0o600


def new_api_key() -> str:
    return f"lb-{secrets.token_urlsafe(24)}"


def api_key_path(paths: Paths) -> Path:
    return paths.config_dir / KEY_FILE_NAME


def read_api_key(path: Path) -> str | None:
    """The first key in ``path`` (llama-server's format: one per line, ``#`` comments)."""
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return None
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(
            f"cannot read the API key file {path}: {exc}",
            hint="fix its permissions, or delete it to have lucebox generate a new key",
        ) from exc
    for line in text.splitlines():
        key = line.strip()
        if key and not key.startswith("#"):
            return key
    return None


def ensure_api_key_file(paths: Paths, wanted_key: str = "") -> tuple[Path, str, bool]:
    """The key file, the key in it, and whether the key was generated now (to show it once).

    ``wanted_key`` (``server.api_key`` set by the user) replaces a different key in the file;
    without it an existing key is kept and a missing one is generated. The file is always left
    readable by its owner only.
    """
    path = api_key_path(paths)
    current = read_api_key(path)
    key = wanted_key or current or new_api_key()
    created = not wanted_key and current is None
    try:
        if key != current:
            paths.ensure(paths.config_dir)
            write_text_atomic(path, f"{key}\n")  # a fresh file is created with mode 0600
        if stat.S_IMODE(path.stat().st_mode) != PRIVATE_MODE:
            os.chmod(path, PRIVATE_MODE)
    except PathsError as exc:
        raise ConfigError(exc.message, hint=exc.hint) from exc
    except OSError as exc:
        raise ConfigError(
            f"cannot write the API key file {path}: {exc.strerror or exc}",
            hint="check the config folder's permissions or point LUCEBOX_HOME elsewhere",
        ) from exc
    return path, key, created


def client_api_key(paths: Paths, settings_key: str) -> str | None:
    """The key a client of this server sends: ``server.api_key`` if set, else the key file's."""
    return settings_key or read_api_key(api_key_path(paths))
