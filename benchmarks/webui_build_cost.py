"""Benchmark: what the web UI adds to an engine build, cold and cached.

Runs the engine build's UI step (the pinned source's ``scripts/ui-assets.cmake``: ``npm ci``,
``npm run build``, embedding the files) with the node lucebox would use, as the build's
``llama-ui-assets`` target does: once in a fresh folder with an empty npm cache (a first build
on a fresh machine: every package downloaded), once more in a fresh folder with npm's cache
now warm (a first build where npm has run before), then again in that same folder (the cached
case: a rebuild of an engine already built). Prints seconds for each as JSON.

    nice -n 10 .venv/bin/python -m benchmarks.webui_build_cost
"""

from __future__ import annotations

import json
import subprocess
import tempfile
import time
from pathlib import Path

from lucebox.engine.core.paths import resolve_paths
from lucebox.engine.engines import nodejs, webui
from lucebox.engine.engines.source import ensure_source
from support.uibuild import ui_assets_argv


def _timed(argv: list[str], env: dict[str, str]) -> tuple[float, str]:
    started = time.monotonic()
    done = subprocess.run(argv, env=env, capture_output=True, text=True, check=True)
    return time.monotonic() - started, done.stdout + done.stderr


def main() -> None:
    paths = resolve_paths()
    node = nodejs.ensure_node(paths)
    if not node.usable:
        raise SystemExit(f"no node for the UI build: {node.reason}")
    source = ensure_source(paths).path
    results: dict[str, object] = {"node": node.reason}
    with tempfile.TemporaryDirectory() as folder:
        work = Path(folder)
        cold_env = node.build_env() | {"npm_config_cache": str(work / "npm-cache")}
        cold_s, cold_log = _timed(ui_assets_argv(source, work / "cold"), cold_env)
        warm_s, _ = _timed(ui_assets_argv(source, work / "warm"), cold_env)
        cached_s, cached_log = _timed(ui_assets_argv(source, work / "warm"), cold_env)
        embedded = [line for line in cold_log.splitlines() if "UI: embedded" in line]
        results |= {
            "cold_empty_npm_cache_s": round(cold_s, 1),
            "cold_warm_npm_cache_s": round(warm_s, 1),
            "cached_s": round(cached_s, 1),
            "cold_embedded": embedded[-1].strip() if embedded else webui.why_no_webui(cold_log),
            "cached_skipped_npm": "npm output up-to-date, skipping build" in cached_log,
        }
    print(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
