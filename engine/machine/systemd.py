"""Install, remove and query lucebox's systemd service (and, for --user, its desktop launcher).

``--user`` writes the unit under the user's systemd folder and the launcher under
XDG_DATA_HOME. ``--system`` creates the user ``lucebox``, pulls the models and builds the engine
in its state folder as that user (so no first start waits on a build), then writes the unit
under /etc/systemd/system. ``systemctl enable`` works without a running manager; starting
needs one, so where none runs (a container, a login without systemd) the service starts at
the next boot or login.
"""

from __future__ import annotations

import grp
import os
import pwd
import shutil
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from lucebox.engine.core.atomic import write_bytes_atomic
from lucebox.engine.core.command import CLI_MODULE, cli_argv
from lucebox.engine.core.errors import RunError, UsageError
from lucebox.engine.core.paths import resolve_paths
from lucebox.engine.machine import desktop
from lucebox.engine.machine.unit import (
    SCOPES,
    SERVICE_NAME,
    SYSTEM_HOME,
    SYSTEM_USER,
    Scope,
    render_unit,
    unit_spec,
)

SYSTEM_UNIT_DIR = Path("/etc/systemd/system")
LINGER_DIR = Path("/var/lib/systemd/linger")
"""logind keeps one file per user whose services run without a login."""
SYSTEMCTL_TIMEOUT_S = 60.0


class ServiceError(RunError):
    """systemd refused a step, or the service user cannot run lucebox."""


@dataclass(frozen=True)
class ServiceFiles:
    """Where one scope's files go."""

    scope: Scope
    unit_file: Path
    wants_link: Path
    """The link ``systemctl enable`` makes; it exists exactly when the unit is enabled."""
    desktop_file: Path | None = None
    icon_file: Path | None = None

    def written(self) -> tuple[Path, ...]:
        """The files install writes (the wants link is systemctl's)."""
        return tuple(p for p in (self.unit_file, self.desktop_file, self.icon_file) if p)


@dataclass(frozen=True)
class ServiceStatus:
    installed: bool
    enabled: bool
    scope: Scope | None

    def to_json(self) -> dict[str, Any]:
        return {"installed": self.installed, "enabled": self.enabled, "scope": self.scope}


@dataclass(frozen=True)
class InstallPlan:
    """What ``service install`` writes, shown as it is by ``--dry-run``."""

    files: ServiceFiles
    unit_text: str
    desktop_text: str | None


@dataclass(frozen=True)
class InstallResult:
    files: ServiceFiles
    started: bool
    notes: tuple[str, ...]


def _env(environ: Mapping[str, str] | None) -> Mapping[str, str]:
    return os.environ if environ is None else environ


def _xdg(environ: Mapping[str, str], name: str, fallback: str) -> Path:
    value = environ.get(name, "").strip()
    if value and Path(value).is_absolute():
        return Path(value)
    home = environ.get("HOME", "").strip() or str(Path.home())
    return Path(home) / fallback


def service_files(scope: Scope, environ: Mapping[str, str] | None = None) -> ServiceFiles:
    env = _env(environ)
    if scope == "system":
        return ServiceFiles(
            "system",
            SYSTEM_UNIT_DIR / SERVICE_NAME,
            SYSTEM_UNIT_DIR / "multi-user.target.wants" / SERVICE_NAME,
        )
    unit_dir = _xdg(env, "XDG_CONFIG_HOME", ".config") / "systemd" / "user"
    data = _xdg(env, "XDG_DATA_HOME", ".local/share")
    return ServiceFiles(
        "user",
        unit_dir / SERVICE_NAME,
        unit_dir / "default.target.wants" / SERVICE_NAME,
        data / "applications" / desktop.DESKTOP_NAME,
        data / "icons" / "hicolor" / "scalable" / "apps" / desktop.ICON_NAME,
    )


def service_status(environ: Mapping[str, str] | None = None) -> ServiceStatus:
    """The user's own service if installed, else the system one; read from the unit files."""
    for scope in SCOPES:
        files = service_files(scope, environ)
        if files.unit_file.is_file():
            enabled = files.wants_link.is_symlink() or files.wants_link.exists()
            return ServiceStatus(True, enabled, scope)
    return ServiceStatus(False, False, None)


def manager_running(scope: Scope, environ: Mapping[str, str] | None = None) -> bool:
    """Whether a systemd manager for ``scope`` can be talked to (sd_booted, its private socket)."""
    if scope == "system":
        return Path("/run/systemd/system").is_dir()
    runtime = _env(environ).get("XDG_RUNTIME_DIR", "").strip()
    return bool(runtime) and (Path(runtime) / "systemd" / "private").exists()


def _run(argv: list[str], environ: Mapping[str, str], what: str) -> None:
    import subprocess  # here, not at the top: `lucebox status` imports this module

    try:
        done = subprocess.run(
            argv,
            capture_output=True,
            text=True,
            env=dict(environ),
            timeout=SYSTEMCTL_TIMEOUT_S,
            check=False,
        )
    except FileNotFoundError as exc:
        raise ServiceError(
            f"{argv[0]} is not installed, so lucebox cannot {what}",
            hint="the service needs systemd; run `lucebox serve --detach` instead",
        ) from exc
    except subprocess.TimeoutExpired as exc:
        raise ServiceError(f"`{' '.join(argv)}` did not finish in {exc.timeout:.0f} s") from exc
    if done.returncode != 0:
        detail = (done.stderr.strip().splitlines() or [f"exit {done.returncode}"])[-1]
        raise ServiceError(f"`{' '.join(argv)}` failed: {detail}")


def _systemctl(scope: Scope, environ: Mapping[str, str], *args: str) -> None:
    scope_flag = ["--user"] if scope == "user" else []
    _run(["systemctl", *scope_flag, *args], environ, f"run systemctl {args[0]}")


def _existing_groups() -> tuple[str, ...]:
    return tuple(g.gr_name for g in grp.getgrall())


def plan_install(
    scope: Scope,
    environ: Mapping[str, str] | None = None,
    *,
    python: str = sys.executable,
    install_prefix: str = sys.prefix,
) -> InstallPlan:
    """Render the unit (and the launcher for --user) for this machine; nothing is written."""
    # Imported here: `lucebox status` reads service_status from this module and must stay
    # light (under 0.1 s of CPU), while settings and the launch rules pull in the planner.
    from lucebox.engine.core.address import is_loopback
    from lucebox.engine.machine import config

    env = _env(environ)
    if scope == "system":
        settings = config.load_settings(resolve_paths({"LUCEBOX_HOME": str(SYSTEM_HOME)}))
        environment: tuple[tuple[str, str], ...] = ()
    else:
        settings = config.load_settings(resolve_paths(env))
        kept = ("LUCEBOX_HOME", "PATH")
        environment = tuple((name, env[name]) for name in kept if env.get(name))
    spec = unit_spec(
        scope,
        python=python,
        install_prefix=install_prefix,
        binds_beyond_loopback=not is_loopback(settings.host),
        environment=environment,
        existing_groups=_existing_groups(),
    )
    up_argv = tuple(cli_argv("up", python=python))
    return InstallPlan(
        service_files(scope, env),
        render_unit(spec),
        desktop.render_entry(up_argv) if scope == "user" else None,
    )


def _write(path: Path, data: bytes, mode: int) -> None:
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        write_bytes_atomic(path, data)
        path.chmod(mode)
    except OSError as exc:
        raise ServiceError(f"cannot write {path}: {exc.strerror or exc}") from exc


def install(plan: InstallPlan, environ: Mapping[str, str] | None = None) -> InstallResult:
    """Write the files, enable the unit and start it where a manager runs.

    For --system, call ``prepare_system_home`` first (as root).
    """
    env = _env(environ)
    files = plan.files
    if shutil.which("systemctl", path=env.get("PATH")) is None:
        raise ServiceError(
            "systemctl was not found: this system does not run systemd, so nothing was installed",
            hint="run `lucebox serve --detach` instead",
        )
    _write(files.unit_file, plan.unit_text.encode(), 0o644)
    if plan.desktop_text is not None and files.desktop_file and files.icon_file:
        _write(files.desktop_file, plan.desktop_text.encode(), 0o644)
        _write(files.icon_file, desktop.icon_bytes(), 0o644)
    running = manager_running(files.scope, env)
    if running:
        _systemctl(files.scope, env, "daemon-reload")
    _systemctl(files.scope, env, "enable", SERVICE_NAME)
    notes = []
    if running:
        _systemctl(files.scope, env, "restart", SERVICE_NAME)
    else:
        when = "at the next boot" if files.scope == "system" else "at your next login"
        notes.append(f"no systemd {files.scope} manager runs here: lucebox starts {when}")
    return InstallResult(files, running, tuple(notes))


def uninstall(scope: Scope, environ: Mapping[str, str] | None = None) -> tuple[Path, ...]:
    """Stop and disable the unit and remove what install wrote; returns the removed files."""
    env = _env(environ)
    files = service_files(scope, env)
    running = manager_running(scope, env)
    if files.unit_file.is_file():
        _systemctl(scope, env, "disable", *(["--now"] if running else []), SERVICE_NAME)
    removed = []
    for path in files.written():
        try:
            path.unlink()
        except FileNotFoundError:
            continue
        except OSError as exc:
            raise ServiceError(f"cannot remove {path}: {exc.strerror or exc}") from exc
        removed.append(path)
    if running and removed:
        _systemctl(scope, env, "daemon-reload")
    return tuple(removed)


def linger_enabled(user: str) -> bool:
    """Whether the user's services run from boot without a login."""
    return (LINGER_DIR / user).exists()


def enable_linger(user: str) -> None:
    _run(["loginctl", "enable-linger", user], os.environ, "enable lingering")


def require_root(action: str) -> None:
    if os.geteuid() != 0:
        raise UsageError(
            f"`lucebox service {action} --system` needs root",
            hint="run it with sudo, or use --user for a service of your own",
        )


def prepare_system_home(python: str = sys.executable) -> None:
    """Create the service user and its home, then, as that user, pull the models and build
    the engine (`serve --prepare-only`), its output going to this terminal."""
    require_root("install")
    try:
        pwd.getpwnam(SYSTEM_USER)
    except KeyError:
        _run(
            [
                "useradd",
                "--system",
                "--user-group",
                "--home-dir",
                str(SYSTEM_HOME),
                "--no-create-home",
                "--shell",
                "/usr/sbin/nologin",
                SYSTEM_USER,
            ],
            os.environ,
            f"create the user {SYSTEM_USER}",
        )
    account = pwd.getpwnam(SYSTEM_USER)
    SYSTEM_HOME.mkdir(parents=True, exist_ok=True)
    os.chown(SYSTEM_HOME, account.pw_uid, account.pw_gid)
    SYSTEM_HOME.chmod(0o750)
    as_user = ["runuser", "-u", SYSTEM_USER, "--", "env", f"LUCEBOX_HOME={SYSTEM_HOME}"]
    as_user += [f"HOME={SYSTEM_HOME}", f"PATH={os.environ.get('PATH', '/usr/bin:/bin')}"]
    try:
        _run([*as_user, python, "-c", f"import {CLI_MODULE}"], os.environ, "check lucebox")
    except ServiceError as exc:
        raise ServiceError(
            f"the user {SYSTEM_USER} cannot run lucebox from {python}",
            hint="install lucebox where every user can read it (e.g. a venv under /opt)",
        ) from exc
    import subprocess

    # Progress of the download and the build goes straight to this terminal.
    done = subprocess.run(
        [*as_user, *cli_argv("serve", "--prepare-only", python=python)], check=False
    )
    if done.returncode != 0:
        raise ServiceError(
            f"preparing models and engine as {SYSTEM_USER} failed (exit {done.returncode})",
            hint="see the lines above; nothing was enabled",
        )
