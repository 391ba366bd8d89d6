"""Device run: PFlash off vs ``--prefill auto`` vs ``--prefill pflash`` through `lucebox serve
--engine lucebox`, at prompts of about 8K, 32K, 64K and 128K tokens.

The generated qwen35 target of bench/lucebox_models.py; PFlash's drafter (the generated BF16
stand-in for Qwen3-0.6B) is pulled by lucebox from a local Hub serving it under the real
file's name (the GPU machine has no network). Per mode one `lucebox serve`; per prompt (fresh
random words, so no prefix cache helps) one streamed reply of 16 tokens: the client's own wait
for the first token and the engine's usage, then what `lucebox status --json` showed for that
reply, side by side. A deadline skips what would not finish in time; every server is stopped.

    python3 bench/pflash_device.py MODELS_DIR OUT.json [--deadline EPOCH_S]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx

from lucebox.engine.core.paths import resolve_paths
from lucebox.engine.plan.luceboxplan import PREFILL_DRAFTER_SOURCE
from lucebox.engine.run.runstate import engine_log, read_status
from tests.hubserver import HubFile, HubState, serve_hub

MODES = ("off", "pflash", "auto")
SIZES = (8192, 32768, 65536, 131072)
CTX = 139_264
"""Room for the 128K prompt, its chat template and the reply."""
PORT = 18_230
WORDS = ("hello", "world", "the", "model", "test")
"""About one token each for the generated vocabulary (2,842 tokens for 2,800 words)."""
TOKENS_PER_WORD = 1.015
REPLY_TOKENS = 16
START_S = 240.0
"""The longest a server may take to be ready (load, drafter pull, warm-up)."""
PROMPT_RESERVE_S = {8192: 20.0, 32768: 30.0, 65536: 45.0, 131072: 75.0}
"""Time a prompt needs left before the deadline to be sent (off at 128K is the slowest)."""


def lucebox(*args: str, timeout_s: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "lucebox.app.cli", *args],
        capture_output=True,
        text=True,
        timeout=timeout_s,
        check=False,
    )


def prompt_text(tokens: int, seed: int) -> str:
    words = random.Random(seed).choices(WORDS, k=int(tokens / TOKENS_PER_WORD) - 64)
    return " ".join(words)


def streamed(url: str, text: str) -> dict[str, Any]:
    """One streamed reply: the client's wait for the first token, the whole wait, usage."""
    body = {
        "messages": [{"role": "user", "content": text}],
        "max_tokens": REPLY_TOKENS,
        "temperature": 0,
        "stream": True,
    }
    started_s = time.monotonic()
    first_s: float | None = None
    usage: dict[str, Any] = {}
    error: str | None = None
    try:
        with httpx.stream("POST", f"{url}/v1/chat/completions", json=body, timeout=400) as reply:
            if reply.status_code != 200:
                return {"error": f"HTTP {reply.status_code}: {reply.read()[:300]!r}"}
            for line in reply.iter_lines():
                if not line.startswith("data: ") or line == "data: [DONE]":
                    continue
                chunk = json.loads(line.removeprefix("data: "))
                if "error" in chunk:
                    error = json.dumps(chunk["error"])[:300]
                delta = (chunk.get("choices") or [{}])[0].get("delta") or {}
                if first_s is None and (delta.get("content") or delta.get("reasoning_content")):
                    first_s = time.monotonic() - started_s
                usage = chunk.get("usage") or usage
    except httpx.HTTPError as exc:
        error = f"{type(exc).__name__}: {exc}"
    return {
        "client_ttft_s": round(first_s, 4) if first_s is not None else None,
        "client_total_s": round(time.monotonic() - started_s, 4),
        "usage": usage,
        "error": error,
    }


def status_after(finished_before: int) -> dict[str, Any]:
    """What `lucebox status --json` shows once the reply counts as finished (up to 5 s)."""
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:
        if finished_total() > finished_before:
            break
        time.sleep(0.05)
    shown = lucebox("status", "--json")
    try:
        sample: dict[str, Any] = json.loads(shown.stdout).get("sample") or {}
    except ValueError:
        return {"error": shown.stderr[-300:]}
    keys = (
        "ttft_s",
        "last_ttft_s",
        "prefill_tokens_per_s",
        "last_prefill_tokens_per_s",
        "decode_tokens_per_s",
        "last_decode_tokens_per_s",
        "requests_finished_total",
        "slots_busy",
    )
    return {key: sample.get(key) for key in keys}


def finished_total() -> int:
    current = read_status(resolve_paths())
    return current.sample.requests_finished_total if current and current.sample else 0


def wait_ready(process: subprocess.Popen[bytes], timeout_s: float) -> str:
    paths = resolve_paths()
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if process.poll() is not None:
            return f"exited {process.returncode}"
        current = read_status(paths)
        if current is not None and current.state in ("ready", "failed"):
            return current.state
        time.sleep(0.5)
    return "not ready in time"


def stop(process: subprocess.Popen[bytes]) -> None:
    lucebox("down", timeout_s=90)
    try:
        process.wait(timeout=60)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        process.wait()


def engine_lines(since_bytes: int) -> list[str]:
    """The engine's reply and PFlash lines written since ``since_bytes`` of its log."""
    log = engine_log(resolve_paths())
    try:
        with log.open("rb") as handle:
            handle.seek(since_bytes)
            text = handle.read().decode("utf-8", "replace")
    except OSError:
        return []
    keep = ("chat DONE", "[compress]", "[pflash", "[park]", "[unpark]", "decode] tokens", "BSA")
    return [line for line in text.splitlines() if any(k in line for k in keep)]


def log_size() -> int:
    try:
        return engine_log(resolve_paths()).stat().st_size
    except OSError:
        return 0


def run_mode(
    result: dict[str, Any],
    target: Path,
    deadline_s: float,
    seed: int,
    save: Callable[[], None],
    extra: list[str],
) -> None:
    """Serve in ``result["mode"]`` and fill ``result`` as it goes (``save`` after each reply,
    so a run cut off keeps what it measured)."""
    mode = result["mode"]
    args = ["--model", str(target), "--engine", "lucebox", "--ctx", str(CTX), *extra]
    if mode != "off":
        args += ["--prefill", mode]
    planned = lucebox("plan", *args, "--json")
    result.update(plan_exit=planned.returncode, rows=[])
    try:
        plan = json.loads(planned.stdout)
        result["plan_prefill"] = plan["reasons"].get("prefill")
        result["argv"] = plan["argv"]
    except (ValueError, KeyError):
        result["plan_error"] = planned.stderr[-500:]
    if time.time() + START_S / 4 > deadline_s:
        result["skipped"] = "no time left to start"
        return
    started_s = time.monotonic()
    with tempfile.TemporaryFile() as out:
        process = subprocess.Popen(
            [sys.executable, "-m", "lucebox.app.cli", "serve", *args, "--port", str(PORT)],
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        try:
            state = wait_ready(process, min(START_S, deadline_s - time.time()))
            result["ready"] = state
            result["ready_s"] = round(time.monotonic() - started_s, 1)
            if state == "ready":
                for size in SIZES:
                    if time.time() + PROMPT_RESERVE_S[size] > deadline_s:
                        result["rows"].append({"prompt_tokens_asked": size, "skipped": "deadline"})
                        continue
                    before, at = finished_total(), log_size()
                    row: dict[str, Any] = {"prompt_tokens_asked": size}
                    row.update(streamed(f"http://127.0.0.1:{PORT}", prompt_text(size, seed + size)))
                    row["status"] = status_after(before)
                    row["engine_lines"] = engine_lines(at)
                    result["rows"].append(row)
                    save()
                    print(mode, summary_line(row), flush=True)
        finally:
            stop(process)
            out.seek(0)
            result["serve_tail"] = out.read().decode("utf-8", "replace")[-3000:]
            save()


def summary_line(row: dict[str, Any]) -> str:
    if "skipped" in row:
        return f"{row['prompt_tokens_asked']:>6}: skipped ({row['skipped']})"
    usage, shown = row.get("usage") or {}, row.get("status") or {}
    timings = usage.get("timings") or {}
    return (
        f"{usage.get('prompt_tokens', '?'):>6} tokens: client TTFT {row.get('client_ttft_s')} s, "
        f"status TTFT {shown.get('last_ttft_s')} s, engine prefill "
        f"{(timings.get('prefill_ms') or 0) / 1000:.2f} s"
        + (f", error {row['error']}" if row.get("error") else "")
    )


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("models", type=Path)
    parser.add_argument("out", type=Path)
    parser.add_argument("--deadline", type=float, default=time.time() + 380)
    parser.add_argument(
        "--serve-args", default="", help="more arguments for plan and serve (a trial's --vram-mib)"
    )
    args = parser.parse_args()
    target = args.models / "qwen35-tiny.gguf"
    drafter = args.models / "qwen3-tiny-drafter.gguf"
    repo, file_name = PREFILL_DRAFTER_SOURCE.removeprefix("hf:").rsplit("/", 1)
    state = HubState()
    state.add(repo, file_name, HubFile(drafter.read_bytes()))
    try:
        smi = subprocess.run(
            ["nvidia-smi", "--query-gpu=name,compute_cap,memory.total", "--format=csv,noheader"],
            capture_output=True,
            text=True,
            check=False,
        ).stdout.strip()
    except OSError as exc:
        smi = f"no nvidia-smi: {exc}"
    engines = lucebox("engine", "status", "--json")
    document: dict[str, Any] = {"gpu": smi, "ctx": CTX, "reply_tokens": REPLY_TOKENS}
    try:
        document["engines"] = [
            {k: e.get(k) for k in ("id", "kind", "bsa", "in_use", "installed_at", "built_from")}
            for e in json.loads(engines.stdout)["engines"]
        ]
    except (ValueError, KeyError):
        document["engines_error"] = engines.stderr[-500:]
    document["modes"] = []
    extra = args.serve_args.split()
    chosen = lucebox_build(document.get("engines", []))
    if chosen is not None:
        extra += ["--engine-id", chosen]
    document["engine_id"] = chosen

    def save() -> None:
        args.out.write_text(json.dumps(document, indent=1) + "\n", encoding="utf-8")

    with serve_hub(state) as hub, tempfile.TemporaryDirectory() as hf_home:
        os.environ["HF_ENDPOINT"], os.environ["HF_HOME"] = hub.base_url, hf_home
        for index, mode in enumerate(MODES):
            document["modes"].append({"mode": mode})
            try:
                run_mode(document["modes"][-1], target, args.deadline, 1000 * index, save, extra)
            except Exception as exc:  # the other modes still run; the error is in the results
                document["modes"][-1]["error"] = f"{type(exc).__name__}: {exc}"
    save()
    print_table(document)


def lucebox_build(engines: list[dict[str, Any]]) -> str | None:
    """The Lucebox build to serve with: the newest source's newest build with
    Block-Sparse-Attention if any, else lucebox's own choice (None)."""

    def newest(engine: dict[str, Any]) -> tuple[str, str]:
        return (
            (engine.get("built_from") or {}).get("date") or "",
            engine.get("installed_at") or "",
        )

    with_bsa = [e for e in engines if e.get("kind") == "lucebox" and e.get("bsa")]
    return str(max(with_bsa, key=newest)["id"]) if with_bsa else None


def print_table(document: dict[str, Any]) -> None:
    """Client TTFT and status TTFT per prompt size, one column pair per mode."""
    bsa = [(e["id"], e["bsa"]) for e in document.get("engines", [])]
    print(f"\n{document['gpu']}; BSA per engine: {bsa}; served with {document['engine_id']}")
    by_mode = {
        m["mode"]: {r["prompt_tokens_asked"]: r for r in m.get("rows", [])}
        for m in document["modes"]
    }
    print(f"{'prompt':>8} " + " ".join(f"{m + ' client/status':>24}" for m in MODES))
    for size in SIZES:
        cells = []
        for mode in MODES:
            row = by_mode.get(mode, {}).get(size) or {}
            shown = (row.get("status") or {}).get("last_ttft_s")
            cells.append(f"{row.get('client_ttft_s')!s:>11} / {shown!s:<10}")
        print(f"{size:>8} " + " ".join(f"{c:>24}" for c in cells))


if __name__ == "__main__":
    main()
