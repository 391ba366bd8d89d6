"""The systemd units and the desktop entry lucebox installs, checked by systemd's and freedesktop's
own validators."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from lucebox.engine.core.errors import UsageError
from lucebox.engine.machine import desktop
from lucebox.engine.machine.unit import quote_word, render_unit, unit_spec

ROOT = Path(__file__).resolve().parents[3]
needs_systemd_analyze = pytest.mark.skipif(
    shutil.which("systemd-analyze") is None,
    reason="systemd-analyze is missing (Debian package systemd; scripts/test installs it as root)",
)
needs_desktop_validate = pytest.mark.skipif(
    shutil.which("desktop-file-validate") is None,
    reason="desktop-file-validate is missing (Debian package desktop-file-utils)",
)


@pytest.fixture
def odd_python(tmp_path) -> str:
    """The interpreter under a path with a space, % and $: all must reach systemd as they are."""
    folder = tmp_path / "my venv %h $HOME"
    folder.mkdir()
    link = folder / "python"
    link.symlink_to(sys.executable)
    return str(link)


def verify(unit_text: str, folder: Path, *, user: bool) -> subprocess.CompletedProcess[str]:
    unit_file = folder / "lucebox.service"
    unit_file.write_text(unit_text)
    runtime = folder / "runtime"
    runtime.mkdir(exist_ok=True)
    return subprocess.run(
        ["systemd-analyze", "verify", *(["--user"] if user else []), str(unit_file)],
        capture_output=True,
        text=True,
        env={"PATH": "/usr/bin:/bin", "HOME": str(folder), "XDG_RUNTIME_DIR": str(runtime)},
        timeout=60,
        check=False,
    )


@needs_systemd_analyze
@pytest.mark.parametrize("scope", ["user", "system"])
@pytest.mark.parametrize("beyond_loopback", [False, True])
def test_units_pass_systemd_analyze_verify(tmp_path, odd_python, scope, beyond_loopback):
    spec = unit_spec(
        scope,
        python=odd_python,
        install_prefix="/opt/lucebox",
        binds_beyond_loopback=beyond_loopback,
        environment=(("LUCEBOX_HOME", "/srv/llm 100%"), ("PATH", "/usr/bin:/bin")),
        existing_groups=("video", "users"),
    )
    text = render_unit(spec)
    done = verify(text, tmp_path, user=scope == "user")
    assert done.returncode == 0 and not done.stderr.strip(), done.stderr
    assert not re.search(r"@[A-Z_]+@", text)  # every placeholder was filled
    assert "Restart=on-failure" in text and "StartLimitBurst=" in text
    waits = "After=network-online.target" in text.splitlines()
    assert waits == (beyond_loopback and scope == "system")
    if scope == "system":
        for line in ("User=lucebox", "StateDirectory=lucebox", "ProtectSystem=strict"):
            assert line in text.splitlines()
        assert "SupplementaryGroups=video" in text.splitlines()
        # The engine must reach /dev/nvidia*.
        assert not [
            line for line in text.splitlines() if line.startswith(("PrivateDevices", "Device"))
        ]
        assert "Environment=LUCEBOX_HOME=%S/lucebox" in text.splitlines()
    else:
        assert 'Environment="LUCEBOX_HOME=/srv/llm 100%%"' in text.splitlines()


@needs_systemd_analyze
def test_verify_catches_a_broken_unit(tmp_path):
    """The check above can fail: a unit whose command is missing is refused."""
    spec = unit_spec(
        "user", python="/nonexistent/python", install_prefix="/x", binds_beyond_loopback=False
    )
    assert verify(render_unit(spec), tmp_path, user=True).returncode != 0


def test_exec_words_are_quoted_for_systemd():
    assert quote_word('a "b" %h $X \\', exec_arg=True) == '"a \\"b\\" %%h $$X \\\\"'
    assert quote_word("A=$X %h", exec_arg=False) == '"A=$X %%h"'


def test_an_executable_path_systemd_refuses_is_a_clear_error():
    with pytest.raises(UsageError, match="systemd cannot run"):
        unit_spec(
            "user", python="/o'brien/python", install_prefix="/x", binds_beyond_loopback=False
        )


def test_lucebox_under_a_home_folder_keeps_home_readable():
    spec = unit_spec(
        "system",
        python="/home/me/.venv/bin/python",
        install_prefix="/home/me/.venv",
        binds_beyond_loopback=False,
    )
    assert "ProtectHome=read-only" in render_unit(spec).splitlines()
    elsewhere = unit_spec(
        "system", python="/opt/lb/bin/python", install_prefix="/opt/lb", binds_beyond_loopback=False
    )
    assert "ProtectHome=yes" in render_unit(elsewhere).splitlines()


@needs_desktop_validate
def test_desktop_entries_validate(tmp_path, odd_python):
    shipped = ROOT / "assets" / "lucebox.desktop"
    rendered = tmp_path / "lucebox.desktop"
    rendered.write_text(desktop.render_entry((odd_python, "-m", "lucebox.app.cli", "up")))
    for entry in (shipped, rendered):
        done = subprocess.run(
            ["desktop-file-validate", str(entry)], capture_output=True, text=True, check=False
        )
        assert done.returncode == 0 and not done.stdout.strip(), done.stdout
    lines = rendered.read_text().splitlines()
    assert "Terminal=true" in lines and "Icon=lucebox" in lines
    (exec_line,) = [line for line in lines if line.startswith("Exec=")]
    assert exec_line.endswith(" -m lucebox.app.cli up") and "%%h" in exec_line


def test_desktop_exec_quoting_follows_the_spec():
    assert desktop.quote_exec_arg("/usr/bin/python3") == "/usr/bin/python3"
    # "a b$" -> quoted, $ escaped with a backslash, which the string level doubles.
    assert desktop.quote_exec_arg("a b$") == '"a b\\\\$"'
    assert desktop.quote_exec_arg("50%") == '"50%%"'
