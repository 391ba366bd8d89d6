"""The image recipe's entry point, run here without a container runtime: environment variables
become `lucebox serve` flags, and the real server comes up with them."""

from __future__ import annotations

import json
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from support.health import wait_healthy
from support.ports import free_port

ROOT = Path(__file__).resolve().parent.parent
IMAGE = ROOT / "packaging" / "image"
ENTRYPOINT = IMAGE / "entrypoint.sh"


def entrypoint_env(home: Path, **settings: str) -> dict[str, str]:
    """What the image sets, with this checkout's lucebox on PATH instead of /opt/lucebox."""
    venv_bin = str(Path(sys.executable).parent)
    return {"PATH": f"{venv_bin}:/usr/bin:/bin", "HOME": str(home), **settings}


def run_entrypoint(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(ENTRYPOINT), *args], capture_output=True, text=True, env=env, timeout=120, check=False
    )


def test_settings_from_the_environment_reach_serve(tmp_path):
    env = entrypoint_env(
        tmp_path, LUCEBOX_HOME=str(tmp_path / "data"), LUCEBOX_PORT="99999", LUCEBOX_CTX="2048"
    )
    done = run_entrypoint(env)
    # The real `lucebox serve` got the port and refused it, as it would any flag.
    assert done.returncode == 2
    assert "lucebox serve --host 0.0.0.0 --port 99999 --ctx 2048" in done.stderr
    assert "a TCP port is 1..65535, got 99999" in done.stderr


@pytest.mark.parametrize(
    ("settings", "message"),
    [
        ({"LUCEBOX_ALLOW_BASE": "maybe"}, "LUCEBOX_ALLOW_BASE=maybe is not true or false"),
        (
            {"LUCEBOX_PRESET": "smoke", "LUCEBOX_MODEL": "x.gguf"},
            "set LUCEBOX_PRESET or LUCEBOX_MODEL, not both",
        ),
    ],
)
def test_bad_settings_are_one_clear_line(tmp_path, settings, message):
    done = run_entrypoint(entrypoint_env(tmp_path, **settings))
    assert done.returncode == 2
    assert done.stderr.strip().splitlines() == [f"lucebox-entrypoint: {message}"]


def test_a_command_runs_instead_of_serve(tmp_path):
    done = run_entrypoint(
        entrypoint_env(tmp_path, LUCEBOX_HOME=str(tmp_path / "data")),
        "lucebox",
        "presets",
        "--json",
    )
    assert done.returncode == 0, done.stderr
    assert "smollm2" in {p["id"] for p in json.loads(done.stdout)["presets"]}


@pytest.mark.skipif(shutil.which("shellcheck") is None, reason="shellcheck is not installed")
def test_entrypoint_passes_shellcheck():
    done = subprocess.run(["shellcheck", str(ENTRYPOINT)], capture_output=True, text=True)
    assert done.returncode == 0, done.stdout


def test_recipe_builds_with_lucebox_and_publishes_on_loopback_only():
    dockerfile = (IMAGE / "Dockerfile").read_text()
    stages = [line for line in dockerfile.splitlines() if line.startswith("FROM ")]
    assert "-devel-" in stages[0] and "-runtime-" in stages[-1]
    assert 'lucebox engine build --cuda --arch "${CUDA_ARCHS}" --cpu-target x86-64-v3' in dockerfile
    assert "COPY packaging/image/entrypoint.sh" in dockerfile
    compose = (IMAGE / "compose.yaml").read_text()
    assert '"127.0.0.1:${LUCEBOX_PUBLISH_PORT:-8080}:8080"' in compose
    assert "driver: nvidia" in compose and "capabilities: [gpu]" in compose


@pytest.mark.slow
def test_entrypoint_serves_the_cpu_default_with_the_image_engine(built_engine_home, tmp_path):
    """First start of a fresh volume: the baked engine is registered, the preset and context
    come from the environment, and the model answers."""
    from lucebox.engine.core.paths import resolve_paths
    from lucebox.engine.engines.registry import select_engine
    from lucebox.engine.machine.gpu import probe_gpus
    from support.realmodels import smol_model

    smol_model()  # warms pip's cache for the store's own pull
    engine = select_engine(resolve_paths({"LUCEBOX_HOME": str(built_engine_home)}), probe_gpus())
    assert engine.engine is not None
    port = free_port()
    env = entrypoint_env(
        tmp_path,
        LUCEBOX_HOME=str(tmp_path / "data"),
        LUCEBOX_HOST="127.0.0.1",
        LUCEBOX_PORT=str(port),
        LUCEBOX_PRESET="smollm2",
        LUCEBOX_CTX="4096",
        LUCEBOX_ENGINE=engine.engine.server_path,
    )
    log = (tmp_path / "entrypoint.log").open("w")
    proc = subprocess.Popen([str(ENTRYPOINT)], env=env, stdout=log, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_healthy(url, 600, proc, interval_s=0.5)
        assert proc.poll() is None, (tmp_path / "entrypoint.log").read_text()
        models = httpx.get(f"{url}/v1/models", timeout=10).json()
        assert [m["id"] for m in models["data"]] == ["smollm2"]
        assert (
            httpx.get(f"{url}/props", timeout=10).json()["default_generation_settings"]["n_ctx"]
            == 4096
        )
        reply = httpx.post(
            f"{url}/v1/chat/completions",
            json={
                "messages": [{"role": "user", "content": "What is the capital of France?"}],
                "max_tokens": 24,
            },
            timeout=120,
        ).json()
        assert any(ch.isalpha() for ch in reply["choices"][0]["message"]["content"])
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=60)
        log.close()
    engines = json.loads(
        subprocess.run(
            [sys.executable, "-m", "lucebox.app.cli", "engine", "status", "--json"],
            capture_output=True,
            text=True,
            env=env,
            check=True,
        ).stdout
    )["engines"]
    assert [e["server_path"] for e in engines] == [engine.engine.server_path]
