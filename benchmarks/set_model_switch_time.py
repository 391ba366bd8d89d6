"""Benchmark: the time to switch models in a served set (llama-server's router under lucebox).

`lucebox serve --model smollm2 --model smoke --model tiny-llama` on the built CPU engine (the
test cache's), in a LUCEBOX_HOME of its own. Each request is a one-token chat naming a model;
its wall time is what a client waits for the switch.

1. cold: the first request to a model (the router starts its process, the model loads).
2. loaded: requests alternating between the loaded models.
3. sleeping: a model idle past models.idle_s is unloaded by lucebox's proxy (its slot saved,
   its process gone); the next request loads it and restores the slot. Resident memory
   loaded vs unloaded is read from its process.
4. evicting: with models.ram_mib for one model at a time (models_max 1), each request for the
   other model unloads the first and loads it.
5. prompt cache: how much of a repeated ~700-token prompt a model takes from its cache after
   switching away and back, after sleeping, and after being evicted.
6. memory admission: under that budget (where the router's count limit would be 1), which
   models lucebox's proxy keeps loaded together, by the plans' bytes.
7. proxy cost: a loaded model's request through the proxy and straight to the router.

    .venv/bin/python -m benchmarks.set_model_switch_time [--rounds 3]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from support.servedset import THIRD_NAME, ServedSet, home_with_engine, served_set, third_model

IDLE_S = 3
RAM_MIB_ONE_AT_A_TIME = 1000


def _median(values: list[float]) -> float:
    return round(statistics.median(values), 3)


def _asked(served: ServedSet, alias: str) -> float:
    took, answer = served.ask(alias)
    if "choices" not in answer:
        raise SystemExit(f"{alias} did not answer: {answer}")
    return took


def _memory(served: ServedSet, alias: str) -> int:
    """The model's resident memory as status shows it, once the run has sampled it."""
    for _ in range(20):
        held = int(served.models()[alias]["memory_bytes"])
        if held:
            return held
        time.sleep(0.5)
    return 0


def cold_and_loaded(
    home: Path, sources: list[str], aliases: list[str], rounds: int
) -> dict[str, Any]:
    with served_set(home, sources, {"models.idle_s": "3600", "models.ram_mib": "0"}) as served:
        cold = {alias: round(_asked(served, alias), 3) for alias in aliases}
        loaded = [_asked(served, alias) for _ in range(rounds) for alias in aliases]
        models = served.models()
        memory = {
            a: {"resident_bytes": m["memory_bytes"], "planned_bytes": m["planned_bytes"]}
            for a, m in models.items()
        }
    return {"cold_s": cold, "loaded_switch_s": _median(loaded), "memory": memory}


def sleeping(home: Path, sources: list[str], aliases: list[str], rounds: int) -> dict[str, Any]:
    settings = {"models.idle_s": str(IDLE_S), "models.ram_mib": "0"}
    woken: dict[str, list[float]] = {alias: [] for alias in aliases}
    held: dict[str, dict[str, int]] = {}
    with served_set(home, sources, settings) as served:
        for alias in aliases:
            _asked(served, alias)
            loaded_bytes = _memory(served, alias)
            for _ in range(rounds):
                served.wait_states({alias: "unloaded"}, timeout_s=60)
                time.sleep(1.5)  # the state file catches up with the router
                held[alias] = {
                    "loaded_bytes": loaded_bytes,
                    "sleeping_bytes": int(served.models()[alias]["memory_bytes"]),
                }
                woken[alias].append(_asked(served, alias))
    return {
        "idle_s": IDLE_S,
        "wake_s": {alias: _median(times) for alias, times in woken.items()},
        "memory": held,
    }


def evicting(home: Path, sources: list[str], rounds: int) -> dict[str, Any]:
    settings = {"models.idle_s": "3600", "models.ram_mib": str(RAM_MIB_ONE_AT_A_TIME)}
    pair = sources[:2]
    times: list[float] = []
    with served_set(home, pair, settings) as served:
        _asked(served, pair[0])
        for alias in [pair[1], pair[0]] * rounds:
            times.append(_asked(served, alias))
            states = served.router_states()
            if sorted(states.values()) != ["loaded", "unloaded"]:
                raise SystemExit(f"expected one model loaded, the router says {states}")
    return {"ram_mib": RAM_MIB_ONE_AT_A_TIME, "evict_and_load_s": _median(times)}


LONG_PROMPT = " ".join(f"Line {i}: the lighthouse keeper logs the weather." for i in range(60))


def _cached_tokens(served: ServedSet, alias: str) -> dict[str, int]:
    """The prompt tokens the engine took from its cache for the long prompt, and read anew."""
    _, answer = served.ask(alias, content=LONG_PROMPT)
    timings = answer.get("timings", {})
    return {"cached": int(timings.get("cache_n", 0)), "read": int(timings.get("prompt_n", 0))}


def cache_survival(home: Path, sources: list[str]) -> dict[str, Any]:
    """What a model's prompt cache keeps across a switch, a sleep and an eviction."""
    report: dict[str, Any] = {}
    with served_set(home, sources[:2], {"models.idle_s": "3600", "models.ram_mib": "0"}) as s:
        _cached_tokens(s, "smollm2")
        _cached_tokens(s, "smoke")
        report["after_switching_back"] = _cached_tokens(s, "smollm2")
    with served_set(home, sources[:2], {"models.idle_s": str(IDLE_S), "models.ram_mib": "0"}) as s:
        _cached_tokens(s, "smollm2")
        s.wait_states({"smollm2": "unloaded"}, timeout_s=60)
        report["after_sleeping"] = _cached_tokens(s, "smollm2")
    limit = str(RAM_MIB_ONE_AT_A_TIME)
    with served_set(home, sources[:2], {"models.idle_s": "3600", "models.ram_mib": limit}) as s:
        _cached_tokens(s, "smollm2")
        _cached_tokens(s, "smoke")  # evicts smollm2
        report["after_eviction"] = _cached_tokens(s, "smollm2")
    return report


def memory_admission(home: Path, sources: list[str]) -> dict[str, Any]:
    """Under the one-at-a-time RAM budget (a router count limit of 1): which models lucebox's
    proxy keeps loaded together, by the plans' bytes."""
    settings = {"models.idle_s": "3600", "models.ram_mib": str(RAM_MIB_ONE_AT_A_TIME)}
    report: dict[str, Any] = {"ram_mib": RAM_MIB_ONE_AT_A_TIME}
    with served_set(home, sources, settings) as served:
        report["planned_bytes"] = {a: m["planned_bytes"] for a, m in served.models().items()}
        for alias in (THIRD_NAME, "smollm2", "smoke"):
            _asked(served, alias)
            loaded = sorted(a for a, s in served.router_states().items() if s == "loaded")
            report[f"loaded_after_{alias}"] = loaded
    return report


def proxy_cost(home: Path, sources: list[str], rounds: int) -> dict[str, Any]:
    """A loaded model's one-token request through lucebox's proxy and straight to the router."""
    pair = [sources[0], sources[2]]  # a set: one --model would be served without the router
    with served_set(home, pair, {"models.ram_mib": "0"}) as served:
        _asked(served, "smollm2")
        log = (home / "state" / "logs" / "engine.log").read_text()
        port = re.findall(r"# lucebox: starting \S+ --host \S+ --port (\d+)", log)[-1]
        direct = ServedSet(f"http://127.0.0.1:{port}", served.env, served.proc)
        through: list[float] = []
        straight: list[float] = []
        for _ in range(rounds * 4):  # interleaved: the machine's load changes under both alike
            through.append(_asked(served, "smollm2"))
            straight.append(_asked(direct, "smollm2"))
    return {"proxy_s": _median(through), "router_s": _median(straight)}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    folder = Path(tempfile.mkdtemp(prefix="lucebox-switch-"))
    home = home_with_engine(folder / "home")
    sources = ["smollm2", "smoke", str(third_model(folder))]
    aliases = ["smollm2", "smoke", THIRD_NAME]
    report = {
        "machine": f"{os.cpu_count()} cores, the CPU engine",
        "cold_and_loaded": cold_and_loaded(home, sources, aliases, args.rounds),
        "sleeping": sleeping(home, sources, aliases[:2], args.rounds),
        "evicting": evicting(home, sources, args.rounds),
        "prompt_cache": cache_survival(home, sources),
        "memory_admission": memory_admission(home, sources),
        "proxy_cost": proxy_cost(home, sources, args.rounds),
    }
    print(json.dumps(report, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
