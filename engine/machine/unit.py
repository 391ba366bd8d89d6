"""The systemd unit that runs ``lucebox serve``, from a template in ``packaging/systemd/`` (pure).

The user unit runs as the installing user with its own folders; the system unit runs as the
dedicated user ``lucebox`` whose LUCEBOX_HOME is its ``StateDirectory``, with the hardening that
still lets it reach the GPU. Values are quoted for systemd: a path with spaces, ``%`` or ``$``
reaches the process as it is.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from lucebox.engine.core.command import cli_argv
from lucebox.engine.core.errors import UsageError

Scope = Literal["user", "system"]
SCOPES: tuple[Scope, ...] = ("user", "system")
SERVICE_NAME = "lucebox.service"
SYSTEM_USER = "lucebox"
SYSTEM_HOME = Path("/var/lib/lucebox")
"""``%S/lucebox``: the system unit's StateDirectory and its LUCEBOX_HOME."""
GPU_GROUPS = ("video", "render")
"""Groups that own /dev/nvidia* or /dev/dri on some distributions."""
UNSAFE_IN_EXECUTABLE = "'\"\\"
"""systemd refuses an executable path with these ("contains special characters")."""
HOME_ROOTS = (Path("/home"), Path("/root"), Path("/run/user"))
"""What ProtectHome= hides."""


@dataclass(frozen=True)
class UnitSetup:
    """What differs between installs: everything else is in the template."""

    scope: Scope
    exec_argv: tuple[str, ...]
    environment: tuple[tuple[str, str], ...] = ()
    """Variables for the user unit (the system unit's are fixed in its template)."""
    wait_for_network: bool = False
    """Order after network-online.target: only when the server binds beyond loopback."""
    supplementary_groups: tuple[str, ...] = ()
    protect_home: str = "yes"
    """``read-only`` when lucebox itself is installed under a home folder."""


def serve_argv(python: str) -> tuple[str, ...]:
    """``lucebox serve`` through the interpreter that has lucebox installed (venv, pipx)."""
    return tuple(cli_argv("serve", python=python))


def unit_spec(
    scope: Scope,
    *,
    python: str,
    install_prefix: str,
    binds_beyond_loopback: bool,
    environment: tuple[tuple[str, str], ...] = (),
    existing_groups: tuple[str, ...] = (),
) -> UnitSetup:
    """Decide the unit for this machine: where lucebox lives and what the server binds."""
    if any(char in python for char in UNSAFE_IN_EXECUTABLE) or not python.isprintable():
        raise UsageError(
            f"systemd cannot run {python!r}: its path holds a quote or a backslash",
            hint="install lucebox in a folder whose path has none (e.g. a venv under /opt)",
        )
    under_home = any(
        Path(place).is_relative_to(root)
        for place in (python, install_prefix)
        for root in HOME_ROOTS
    )
    return UnitSetup(
        scope=scope,
        exec_argv=serve_argv(python),
        environment=environment if scope == "user" else (),
        wait_for_network=binds_beyond_loopback and scope == "system",
        supplementary_groups=tuple(g for g in GPU_GROUPS if g in existing_groups),
        protect_home="read-only" if under_home else "yes",
    )


def quote_word(word: str, *, exec_arg: bool) -> str:
    """One double-quoted word for a unit file: C escapes, ``%%`` and (in a command's
    arguments, where systemd expands variables) ``$$``."""
    escaped = word.replace("\\", "\\\\").replace('"', '\\"').replace("%", "%%")
    if exec_arg:
        escaped = escaped.replace("$", "$$")
    return f'"{escaped}"'


def _template(scope: Scope) -> str:
    from importlib import resources  # on use: `lucebox status` imports this module

    return (resources.files("lucebox.systemd_units") / f"lucebox-{scope}.service.in").read_text(
        encoding="utf-8"
    )


def render_unit(spec: UnitSetup) -> str:
    """The unit file's text; a placeholder line with nothing to say is left out."""
    values = {
        "@EXEC_START@": " ".join(
            quote_word(word, exec_arg=index > 0) for index, word in enumerate(spec.exec_argv)
        ),
        "@ENVIRONMENT@": "\n".join(
            "Environment=" + quote_word(f"{name}={value}", exec_arg=False)
            for name, value in spec.environment
        ),
        "@NETWORK@": (
            "After=network-online.target\nWants=network-online.target"
            if spec.wait_for_network
            else ""
        ),
        "@GROUPS@": (
            f"SupplementaryGroups={' '.join(spec.supplementary_groups)}"
            if spec.supplementary_groups
            else ""
        ),
        "@PROTECT_HOME@": spec.protect_home,
    }
    lines = []
    for line in _template(spec.scope).splitlines():
        if line.strip() in values and not values[line.strip()]:
            continue
        for name, value in values.items():
            line = line.replace(name, value)
        lines.append(line)
    return "\n".join(lines) + "\n"
