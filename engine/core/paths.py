"""Where lucebox keeps its files: config, data, cache, state (logs) and runtime (pid/lock).

The folders follow the platform's conventions through platformdirs. ``LUCEBOX_HOME`` puts
all of them into one folder, which tests and appliance images use.
"""

from __future__ import annotations

import os
import warnings
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import platformdirs

from lucebox.engine.core.errors import PathsError

APP_NAME = "lucebox"
HOME_ENV = "LUCEBOX_HOME"


@dataclass(frozen=True)
class Paths:
    """The folders lucebox uses; nothing here is created until ``ensure`` is called."""

    config_dir: Path
    """Holds config.toml."""
    data_dir: Path
    """Models and installed engines: large, precious, not re-creatable offline."""
    cache_dir: Path
    """Engine builds and downloads in progress: large, re-creatable."""
    state_dir: Path
    """Logs and crash reports."""
    runtime_dir: Path
    """Pid and lock files of a running server."""

    @property
    def config_file(self) -> Path:
        return self.config_dir / "config.toml"

    @property
    def models_dir(self) -> Path:
        return self.data_dir / "models"

    @property
    def engines_dir(self) -> Path:
        return self.data_dir / "engines"

    @property
    def builds_dir(self) -> Path:
        return self.cache_dir / "builds"

    @property
    def downloads_dir(self) -> Path:
        return self.cache_dir / "downloads"

    @property
    def slots_dir(self) -> Path:
        """Where the engine saves a slot's prompt cache on stop, to restore it on the next start."""
        return self.data_dir / "slots"

    @property
    def prefix_cache_dir(self) -> Path:
        """The Lucebox engine's disk prefix cache: one folder per model file, build, KV type and
        context (:mod:`lucebox.engine.core.prefixstore`)."""
        return self.cache_dir / "prefix"

    @property
    def logs_dir(self) -> Path:
        return self.state_dir / "logs"

    def ensure(self, folder: Path) -> Path:
        """Create ``folder`` (one of ours) if needed, with a clear error when that fails."""
        try:
            folder.mkdir(parents=True, exist_ok=True)
        except FileExistsError as exc:
            raise PathsError(
                f"{folder} exists but is not a folder",
                hint="move that file away or point LUCEBOX_HOME elsewhere",
            ) from exc
        except OSError as exc:
            raise PathsError(
                f"cannot create {folder}: {exc.strerror or exc}",
                hint="check its permissions or point LUCEBOX_HOME to a writable folder",
            ) from exc
        return folder


def resolve_paths(environ: Mapping[str, str] | None = None) -> Paths:
    """Return lucebox's folders for this user, honouring ``LUCEBOX_HOME``."""
    env = os.environ if environ is None else environ
    home = env.get(HOME_ENV, "").strip()
    if home:
        root = Path(home).expanduser()
        if root.exists() and not root.is_dir():
            raise PathsError(
                f"{HOME_ENV}={home} is a file, not a folder",
                hint=f"set {HOME_ENV} to a folder (it is created if missing) or unset it",
            )
        root = root.absolute()
        return Paths(
            config_dir=root / "config",
            data_dir=root / "data",
            cache_dir=root / "cache",
            state_dir=root / "state",
            runtime_dir=root / "run",
        )
    dirs = platformdirs.PlatformDirs(APP_NAME, appauthor=False)
    with warnings.catch_warnings():
        # Without XDG_RUNTIME_DIR platformdirs warns and falls back to /tmp/runtime-<uid>,
        # which is what we want for pid and lock files anyway.
        warnings.simplefilter("ignore")
        runtime = Path(dirs.user_runtime_dir)
    return Paths(
        config_dir=Path(dirs.user_config_dir),
        data_dir=Path(dirs.user_data_dir),
        cache_dir=Path(dirs.user_cache_dir),
        state_dir=Path(dirs.user_state_dir),
        runtime_dir=runtime,
    )
