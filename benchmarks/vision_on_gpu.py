"""Device benchmark: a generated text model served with its generated projector on the GPU.

The plan's projector terms (weights and one image's compute buffer) and its total against
what ``nvidia-smi`` says the engine holds after warm-up, with the projector (``--vision on``)
and without (``--vision off``): the difference of the two engines is what the projector
really costs. An image request is sent through the OpenAI API and its TTFT read from
``lucebox status --json``. One JSON document on stdout and in ``--out``.

    python -m benchmarks.vision_on_gpu --work .devrun/work --out $OUT/vision.json
"""

from __future__ import annotations

import argparse
import base64
import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx

from benchmarks.launch_matches_plan_gpu import engine_mib, wait_ready
from support.ggufgen import ModelSpec, ProjectorSpec, write_gguf
from support.pngimage import png

PORT = 18390
CTX = 8192
MIB = 2**20
TEXT = ModelSpec(
    name="Random Llama 0.5B Instruct", basename="vision-text", n_layer=8, n_embd=2048,
    n_head=16, n_head_kv=8, n_ff=8192, n_ctx=32768, constant_weights=True,
)  # fmt: skip
SIGLIP = ProjectorSpec(
    n_layer=27, n_embd=1152, n_head=16, n_ff=4288, image_size=896, patch_size=14,
    target_n_embd=TEXT.n_embd, constant_weights=True,
)  # fmt: skip
"""Gemma 3's SigLIP encoder shape at 896 px (4,096 patches), projecting to the text width."""


def lucebox(*args: str, timeout_s: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "lucebox.app.cli", *args],
        capture_output=True,
        text=True,
        timeout=timeout_s,
    )


def chat(url: str, content: Any) -> dict:
    body = {"messages": [{"role": "user", "content": content}], "max_tokens": 16}
    reply = httpx.post(f"{url}/v1/chat/completions", json=body, timeout=120)
    reply.raise_for_status()
    return reply.json()


def projector_lines(log: Path) -> list[str]:
    """What the engine's last start logged about the projector and its buffers."""
    marks = ("clip", "mtmd", "multimodal", "compute buffer", "model size", "prompt eval")
    text = log.read_text(errors="replace") if log.exists() else ""
    text = text.rsplit("# lucebox: starting", 1)[-1]
    return [line[-240:] for line in text.splitlines() if any(m in line for m in marks)][-40:]


def run(vision: str, model: Path, projector: Path, work: Path) -> dict[str, Any]:
    options = ["--model", str(model), "--mmproj", str(projector), "--vision", vision]
    options += ["--ctx", str(CTX), "--spec", "off"]
    result: dict[str, Any] = {"vision": vision}
    planned = lucebox("plan", *options, "--json")
    plan = json.loads(planned.stdout) if planned.stdout.strip() else {}
    memory = plan.get("memory_bytes", {})
    result |= {
        "plan_rc": planned.returncode,
        "plan_error": planned.stderr.strip()[-400:] if planned.returncode else None,
        "plan_total_mib": round(memory.get("total", 0) / MIB, 1),
        "plan_projector_mib": round(memory.get("projector", 0) / MIB, 1),
        "plan_memory_mib": {k: round(v / MIB, 1) for k, v in memory.items()},
        "plan_vision": plan.get("vision"),
        "plan_ctx": plan.get("ctx"),
        "argv": plan.get("argv"),
    }
    if planned.returncode != 0:
        return result
    log = (work / f"serve-{vision}.log").open("w")
    serve = subprocess.Popen(
        [sys.executable, "-m", "lucebox.app.cli", "serve", *options, "--port", str(PORT)],
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    try:
        status = wait_ready(time.monotonic() + 60)
        result["state"] = status.get("state")
        if status.get("state") != "ready":
            return result
        url, engine_pid = status["url"], int(status["engine_pid"])
        result["engine_mib_after_load"] = engine_mib(engine_pid)
        text = chat(url, "Say hello.")
        result["text_prompt_tokens"] = text["usage"]["prompt_tokens"]
        if vision == "on":
            uri = "data:image/png;base64," + base64.b64encode(png(64, 64)).decode()
            parts = [
                {"type": "text", "text": "Say hello."},
                {"type": "image_url", "image_url": {"url": uri}},
            ]
            started = time.monotonic()
            seen = chat(url, parts)
            result["image_request_s"] = round(time.monotonic() - started, 3)
            result["image_prompt_tokens"] = seen["usage"]["prompt_tokens"]
            result["image_timings"] = seen.get("timings")
        time.sleep(2.5)  # the sampler has seen the last request finish
        after = json.loads(lucebox("status", "--json").stdout)
        result["engine_mib"] = engine_mib(engine_pid)
        result["status_vision"] = after.get("vision")
        result["status_last_ttft_s"] = (after.get("sample") or {}).get("last_ttft_s")
        result["restarts"] = after.get("restarts")
        used, total = result["engine_mib"], result["plan_total_mib"]
        if used:
            result["total_difference_percent"] = round(100 * (used - total) / used, 2)
        engine_log = Path(after.get("log") or "")
        result["engine_log_projector"] = projector_lines(engine_log)
        return result
    finally:
        lucebox("down", timeout_s=60)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(serve.pid, signal.SIGTERM)
        serve.wait(timeout=60)
        log.close()


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--work", type=Path, required=True)
    parser.add_argument("--out", type=Path, action="append", required=True)
    args = parser.parse_args()
    args.work.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()
    model = args.work / "vision-text-F16.gguf"
    projector = args.work / "mmproj-vision-text-F16.gguf"
    for path, spec in ((model, TEXT), (projector, SIGLIP)):
        if not path.exists():
            write_gguf(path, spec)
    gpu = subprocess.run(
        ["nvidia-smi", "--query-gpu=name,memory.total,memory.free", "--format=csv,noheader"],
        capture_output=True,
        text=True,
    ).stdout.strip()
    document: dict[str, Any] = {"gpu": gpu, "generated_s": round(time.monotonic() - started, 1)}
    document["runs"] = [run(v, model, projector, args.work) for v in ("on", "off")]
    on, off = document["runs"]
    if on.get("engine_mib") and off.get("engine_mib"):
        measured = on["engine_mib"] - off["engine_mib"]
        planned = on["plan_total_mib"] - off["plan_total_mib"]
        document["projector"] = {
            "engine_on_minus_off_mib": measured,
            "plan_on_minus_off_mib": round(planned, 1),
            "plan_projector_mib": on["plan_projector_mib"],
            "difference_percent": round(100 * (measured - planned) / measured, 2)
            if measured
            else None,
        }
    document["wall_s"] = round(time.monotonic() - started, 1)
    text = json.dumps(document, indent=2)
    for out in args.out:
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(text + "\n")
    print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
