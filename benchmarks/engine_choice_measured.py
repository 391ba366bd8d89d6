"""Both engines on one card, measured as the engine calibration measures them (issue 39).

A generated qwen35 target (benchmarks/lucebox_models.py) with a Lucebox draft that agrees with it,
and the same target with a draft of its own random weights that never agrees. For each pair,
``lucebox serve --engine E`` with each engine (calibration off, so each serves as planned), the
calibration's probe set plus two served shapes (an agent turn: a long prompt and a short reply;
a decode-heavy reply after a short prompt), each reply's timings read as the calibration reads
them; then the engines' verdict (plan/engineverdict.py) under an agent-like mix and under a
decode-heavy mix, with both engines' decode and time to first token.

Usage: python3 -m benchmarks.engine_choice_measured OUT.json
(needs both engines built in LUCEBOX_HOME)

The 64K-prompt comparison of the exact cache against KVFlash (the issue's second part) is not
here: it needs the ``--kv-mode`` pin, which is not built yet.
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx

from benchmarks.lucebox_models import DRAFT, TARGET
from lucebox.engine.core.paths import resolve_paths
from lucebox.engine.engines.registry import KindName
from lucebox.engine.plan.engineverdict import EngineMeasurement, verdict
from lucebox.engine.plan.speculation.measurements import ProbeRate, TrialRate
from lucebox.engine.plan.speculation.workload import ServedRequest
from lucebox.engine.run.calibrate.calibration import probe_rate
from lucebox.engine.run.calibrate.probes import PROBES
from lucebox.engine.run.calibrate.probing import WARM_UP, reply_timings
from support.ggufgen import write_lucebox_dflash, write_qwen35

PORT = 18093
WORK = Path("/tmp/lucebox-engine-choice")
AGENT_PROMPT_WORDS = 6000
"""About 8K tokens of tool output: a coding agent's turn reads far more than it writes."""
AGENT_REPLY = 16
DECODE_REPLY = 512
AGENT_MIX = [ServedRequest(8000, AGENT_REPLY, 0.0)] * 16
DECODE_MIX = [ServedRequest(60, DECODE_REPLY, 0.0)] * 16


HOME = WORK / "home"


def cli(*args: str, timeout_s: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "lucebox.app.cli", *args],
        capture_output=True, text=True, timeout=timeout_s, check=False,
        env={**os.environ, "LUCEBOX_HOME": str(HOME)},
    )  # fmt: skip


def private_home() -> None:
    """A home of its own that knows the engines built in LUCEBOX_HOME (their manifests point at
    the binaries), with the calibration off: each engine serves as planned."""
    source = resolve_paths().engines_dir
    target = resolve_paths({"LUCEBOX_HOME": str(HOME)}).engines_dir
    kinds_built = {m.parent.name.split("-")[0] for m in source.glob("*/manifest.json")}
    if not {"llama.cpp", "lucebox"} <= kinds_built:
        # `serve` would build the missing one in this home, past any call's time.
        raise SystemExit(f"both engines must be built in {source} first; found: {kinds_built}")
    for manifest in source.glob("*/manifest.json"):
        (target / manifest.parent.name).mkdir(parents=True, exist_ok=True)
        shutil.copy(manifest, target / manifest.parent.name / manifest.name)
    cli("config", "set", "spec.calibrate_idle_s", "0")


def ask(body: dict[str, Any]) -> dict[str, Any]:
    reply = httpx.post(f"http://127.0.0.1:{PORT}/v1/chat/completions", json=body, timeout=120)
    reply.raise_for_status()
    document: dict[str, Any] = reply.json()
    return document


def measure(label: str) -> TrialRate:
    """The probe set and the two served shapes, greedy, each reply's rate."""
    ask(WARM_UP)
    bodies = [(p.name, list(p.messages), p.max_tokens) for p in PROBES]
    tool_output = " ".join(f"line{i} ok" for i in range(AGENT_PROMPT_WORDS))
    agent = [{"role": "user", "content": f"Tool output:\n{tool_output}\nSay what failed."}]
    bodies.append(("agent-long", agent, AGENT_REPLY))
    bodies.append(
        ("decode-long", [{"role": "user", "content": "Write a long story."}], DECODE_REPLY)
    )
    probes: list[ProbeRate] = []
    for name, messages, max_tokens in bodies:
        body = {"messages": messages, "max_tokens": max_tokens, "temperature": 0, "seed": 1}
        timings = reply_timings(ask(body))
        found = probe_rate(name, timings, max_tokens) if timings else None
        if found is not None:
            probes.append(found)
    return TrialRate(label, None, None, None, tuple(probes), time.time())


def served(kind: KindName, target: Path, draft: Path, log: Path) -> dict[str, Any]:
    """Serve with ``kind``, measure, stop; the trial and what status said."""
    # llama-server cannot load a Lucebox draft: it serves the target with its own speculation.
    argv = ["serve", "--model", str(target), "--engine", kind]
    argv += ["--draft", str(draft)] if kind == "lucebox" else []
    with log.open("w") as handle:
        proc = subprocess.Popen(
            [sys.executable, "-m", "lucebox.app.cli", *argv, "--port", str(PORT)],
            stdout=handle, stderr=subprocess.STDOUT,
            env={**os.environ, "LUCEBOX_HOME": str(HOME)},
        )  # fmt: skip
    try:
        deadline = time.monotonic() + 90
        status: dict[str, Any] = {}
        while status.get("state") != "ready":
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"{kind} did not get ready: {log.read_text()[-2000:]}")
            time.sleep(0.5)
            status = json.loads(cli("status", "--json").stdout or "{}")
        spec = status.get("spec") or {}
        trial = measure(f"{kind} {spec.get('type') or 'off'}")
        return {"trial": trial, "spec": spec.get("type"), "spec_reason": spec.get("reason")}
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def case(name: str, target: Path, draft: Path) -> dict[str, Any]:
    kinds: tuple[KindName, ...] = ("llama-server", "lucebox")
    runs = {k: served(k, target, draft, WORK / f"{name}-{k}.log") for k in kinds}
    both = EngineMeasurement(name)
    for kind, run in runs.items():
        both = both.with_trial(kind, run["trial"])
    result: dict[str, Any] = {"engines": {}}
    for kind, run in runs.items():
        trial = run["trial"]
        result["engines"][kind] = {
            "spec": run["spec"],
            "spec_reason": run["spec_reason"],
            "probes": [dataclasses.asdict(p) for p in trial.probes],
            "decode_tok_s": round(trial.tok_s, 1),
        }
    for mix_name, mix in (("agent", AGENT_MIX), ("decode", DECODE_MIX)):
        chosen, why, costs = verdict(both, mix)
        result[mix_name] = {
            "chosen": chosen,
            "why": why,
            "costs": [dataclasses.asdict(c) for c in costs],
        }
    return result


def main(out: Path) -> None:
    WORK.mkdir(parents=True, exist_ok=True)
    target = WORK / "qwen35-tiny.gguf"
    agree, never = WORK / "dflash-agree.gguf", WORK / "dflash-never.gguf"
    if not target.exists():
        write_qwen35(target, TARGET)
        write_lucebox_dflash(agree, DRAFT)
        write_lucebox_dflash(never, dataclasses.replace(DRAFT, agree_token=None, seed=7))
    private_home()
    document: dict[str, Any] = {"target": TARGET.name}
    for name, draft in (("agreeing-draft", agree), ("never-agreeing-draft", never)):
        try:
            document[name] = case(name, target, draft)
        except (RuntimeError, httpx.HTTPError, subprocess.TimeoutExpired) as exc:
            document[name] = {"error": str(exc)[-2000:]}
        out.write_text(json.dumps(document, indent=1))
    for name in ("agreeing-draft", "never-agreeing-draft"):
        found = document[name]
        if "error" in found:
            print(f"{name}: {found['error'][-300:]}")
            continue
        for mix in ("agent", "decode"):
            costs = {c["kind"]: c for c in found[mix]["costs"]}
            said = ", ".join(
                f"{k} decode {c['decode_tok_s']:.0f} tok/s TTFT {c['ttft_s']:.3f} s "
                f"{c['request_s']:.3f} s/request"
                for k, c in costs.items()
            )
            print(f"{name} {mix} mix -> {found[mix]['chosen']}: {said}")


if __name__ == "__main__":
    main(Path(sys.argv[1]))
