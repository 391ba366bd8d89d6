"""Device run: long prompts through `lucebox serve --engine lucebox`, one serve per mode of a set.

``--set pflash`` (issue 40): PFlash off vs ``--prefill auto`` vs ``--prefill pflash`` at prompts
of about 8K, 32K, 64K and 128K tokens. ``--set kv`` (issue 39): the exact cache vs KVFlash at a
64K prompt on a card whose free memory a filler process holds so that only q4_0 fits exactly
(found by bisecting ``plan --vram-mib``): the exact q4_0 cache, a KVFlash pool pinned at the
better KV type (q8_0), and a KVFlash pool at the same KV type (q4_0: a context no exact cache
gives), each with a 128-token reply so decode is measured too.

The generated qwen35 target of benchmarks/lucebox_models.py; PFlash's drafter (the generated BF16
stand-in for Qwen3-0.6B) is pulled by lucebox from a local Hub serving it under the real
file's name (the GPU machine has no network). Per mode one `lucebox serve`; per prompt (fresh
random words, so no prefix cache helps) one streamed reply: the client's own wait for the first
token, its decode rate and the engine's usage, then what `lucebox status --json` showed for that
reply, side by side. A deadline skips what would not finish in time; every server is stopped.

    python3 benchmarks/long_prompt_modes_gpu.py MODELS_DIR OUT.json [--set pflash|kv]
        [--sizes 65536,...] [--deadline EPOCH_S]
"""

from __future__ import annotations

import argparse
import dataclasses
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

from benchmarks.engine_faults import FILLER
from lucebox.engine.core.paths import resolve_paths
from lucebox.engine.plan.lucebox.luceboxplan import PREFILL_DRAFTER_SOURCE
from lucebox.engine.run.runstate import engine_log, read_status
from support.hubserver import HubFile, HubState, serve_hub


@dataclasses.dataclass(frozen=True)
class ModeSet:
    modes: tuple[tuple[str, tuple[str, ...]], ...]
    """Each mode's name and its arguments to plan and serve."""
    sizes: tuple[int, ...]
    ctx: int
    reply_tokens: int
    hold_for_q4: bool = False
    """Hold the card's memory so that only a q4_0 cache gives ``ctx`` exactly."""


MODE_SETS = {
    "pflash": ModeSet(
        modes=(("off", ()), ("pflash", ("--prefill", "pflash")), ("auto", ("--prefill", "auto"))),
        sizes=(8192, 32768, 65536, 131072),
        ctx=139_264,  # room for the 128K prompt, its chat template and the reply
        reply_tokens=16,
    ),
    "kv": ModeSet(
        modes=(
            ("exact", ("--kv-mode", "exact")),
            ("kvflash", ("--kv-mode", "kvflash")),
            ("kvflash-same-kv", ("--ctx", "147456")),
        ),
        sizes=(8192, 65536),
        ctx=73_728,
        reply_tokens=128,
        hold_for_q4=True,
    ),
}
WORDS = ("hello", "world", "the", "model", "test")
"""About one token each for the generated vocabulary (2,842 tokens for 2,800 words)."""
TOKENS_PER_WORD = 1.015
START_S = 240.0
"""The longest a server may take to be ready (load, drafter pull, warm-up)."""


def prompt_reserve_s(tokens: int) -> float:
    """Time a prompt needs left before the deadline to be sent (off at 128K took 31 s)."""
    return 15.0 + tokens / 2200


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


def streamed(url: str, text: str, reply_tokens: int) -> dict[str, Any]:
    """One streamed reply: the client's wait for the first token, the whole wait, its decode
    rate after the first token, usage."""
    body = {
        "messages": [{"role": "user", "content": text}],
        "max_tokens": reply_tokens,
        "temperature": 0,
        "stream": True,
        "stream_options": {"include_usage": True},
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
    total_s = time.monotonic() - started_s
    decoded = int(usage.get("completion_tokens") or 0) - 1
    decode_s = total_s - first_s if first_s is not None else 0.0
    return {
        "client_ttft_s": round(first_s, 4) if first_s is not None else None,
        "client_total_s": round(total_s, 4),
        "client_decode_tokens_per_s": round(decoded / decode_s, 1) if decode_s > 0 else None,
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
    chosen: ModeSet,
    mode_args: tuple[str, ...],
    extra: list[str],
    port: int,
) -> None:
    """Serve in ``result["mode"]`` and fill ``result`` as it goes (``save`` after each reply,
    so a run cut off keeps what it measured)."""
    mode = result["mode"]
    args = ["--model", str(target), "--engine", "lucebox", "--ctx", str(chosen.ctx)]
    args += [*mode_args, *extra]
    planned = lucebox("plan", *args, "--json")
    result.update(plan_exit=planned.returncode, rows=[])
    try:
        plan = json.loads(planned.stdout)
        result["plan_prefill"] = plan["reasons"].get("prefill")
        result["plan_ctx"] = plan["reasons"].get("ctx")
        result["plan_kv"] = [plan.get("cache_type_k"), plan.get("kvflash_pool_tokens")]
        result["argv"] = plan["argv"]
    except (ValueError, KeyError):
        result["plan_error"] = planned.stderr[-500:]
    if time.time() + START_S / 4 > deadline_s:
        result["skipped"] = "no time left to start"
        return
    started_s = time.monotonic()
    with tempfile.TemporaryFile() as out:
        process = subprocess.Popen(
            [sys.executable, "-m", "lucebox.app.cli", "serve", *args, "--port", str(port)],
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        try:
            state = wait_ready(process, min(START_S, deadline_s - time.time()))
            result["ready"] = state
            result["ready_s"] = round(time.monotonic() - started_s, 1)
            if state == "ready":
                for size in chosen.sizes:
                    if time.time() + prompt_reserve_s(size) > deadline_s:
                        result["rows"].append({"prompt_tokens_asked": size, "skipped": "deadline"})
                        continue
                    before, at = finished_total(), log_size()
                    row: dict[str, Any] = {"prompt_tokens_asked": size}
                    text = prompt_text(size, seed + size)
                    row.update(streamed(f"http://127.0.0.1:{port}", text, chosen.reply_tokens))
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


def plan_kv(
    target: Path, ctx: int, vram_mib: int | None, extra: list[str]
) -> tuple[str | None, int | None]:
    """The KV type and KVFlash pool lucebox plans for ``ctx`` on a card with ``vram_mib`` free
    (None: what the card has free now)."""
    args = ["--model", str(target), "--engine", "lucebox", "--ctx", str(ctx), *extra]
    if vram_mib is not None:
        args += ["--vram-mib", str(vram_mib)]
    planned = lucebox("plan", *args, "--json")
    try:
        plan = json.loads(planned.stdout)
    except ValueError:
        return None, None
    return plan.get("cache_type_k"), plan.get("kvflash_pool_tokens")


def q4_only_free_mib(target: Path, ctx: int, extra: list[str]) -> int:
    """Free memory (MiB) at which ``ctx`` fits exactly at q4_0 but not at q8_0: the middle of
    the window between the least that gives exact q4_0 and the least that gives exact q8_0."""

    def least(wanted: str) -> int:
        low, high = 256, 143_000
        while high - low > 8:
            middle = (low + high) // 2
            kv_type, pool = plan_kv(target, ctx, middle, extra)
            good = pool is None and kv_type is not None and (wanted == "q4_0" or kv_type == wanted)
            low, high = (low, middle) if good else (middle, high)
        return high

    return (least("q4_0") + least("q8_0")) // 2


def hold_for_q4(
    target: Path, ctx: int, extra: list[str], document: dict[str, Any], leave_mib: int | None
) -> MemoryHold:
    """A hold under which the plan for ``ctx`` (read as serve will, from the card) is exact at
    q4_0: first at the window ``--vram-mib`` finds, then moved until the real plan agrees, by
    halving the step between a hold that left too little (a KVFlash pool) and one that left
    too much (exact q8_0). On the H200 the real window was under 48 MiB of held memory where
    ``--vram-mib`` put it at about 190: fixed steps of 48 and 96 MiB jumped over it. A
    ``leave_mib`` known from a run on the same card starts there instead."""
    if leave_mib is None:
        leave_mib = q4_only_free_mib(target, ctx, extra)
    tries: list[dict[str, Any]] = []
    document["hold"] = {"tries": tries}
    too_little: int | None = None
    too_much: int | None = None
    for _ in range(16):
        hold = MemoryHold(leave_mib)
        kv_type, pool = plan_kv(target, ctx, None, extra)
        tries.append({"leave_free_mib": leave_mib, "filler": hold.said, "plan": [kv_type, pool]})
        print("hold:", tries[-1], flush=True)
        if kv_type == "q4_0" and pool is None:
            break
        hold.close()
        if pool is not None:
            too_little = leave_mib
        else:
            too_much = leave_mib
        if too_little is not None and too_much is not None:
            if too_much - too_little <= 2:
                # No hold gives exact q4_0 here: the exact q8_0 one stands, said in the tries.
                hold = MemoryHold(too_much)
                tries.append(
                    {"leave_free_mib": too_much, "filler": hold.said, "no_q4_window": True}
                )
                break
            leave_mib = (too_little + too_much) // 2
        else:
            leave_mib += 48 if pool is not None else -96
    else:
        # Sixteen tries without exact q4_0: hold at the last one rather than not at all (the
        # run that returned the closed hold measured an unheld card), said in the tries.
        hold = MemoryHold(leave_mib)
        tries.append({"leave_free_mib": leave_mib, "filler": hold.said, "no_q4_window": True})
    return hold


class MemoryHold:
    """A filler process holding all but ``leave_mib`` of the card's free memory (CUDA's device
    0: with ``--gpu N`` in the serve arguments, run with CUDA_DEVICE_ORDER=PCI_BUS_ID and
    CUDA_VISIBLE_DEVICES=N so both name the same card)."""

    def __init__(self, leave_mib: int) -> None:
        self.process = subprocess.Popen(
            [sys.executable, "-c", FILLER, str(leave_mib), "3600"],
            stdout=subprocess.PIPE,
            text=True,
        )
        assert self.process.stdout is not None
        self.said = self.process.stdout.readline().strip()

    def close(self) -> None:
        self.process.kill()
        self.process.wait()


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
    parser.add_argument("--set", choices=sorted(MODE_SETS), default="pflash")
    parser.add_argument("--port", type=int, default=18_230)
    parser.add_argument("--deadline", type=float, default=time.time() + 380)
    parser.add_argument(
        "--leave-mib",
        type=int,
        help="where the hold search starts: the free MiB a run on the same card found (H200: 2269)",
    )
    parser.add_argument(
        "--sizes", help="prompt sizes in tokens, comma-separated (default: the set's own)"
    )
    parser.add_argument(
        "--serve-args", default="", help="more arguments for plan and serve (a trial's --vram-mib)"
    )
    args = parser.parse_args()
    chosen_set = MODE_SETS[args.set]
    if args.sizes:
        chosen_set = dataclasses.replace(
            chosen_set, sizes=tuple(int(size) for size in args.sizes.split(","))
        )
    target = args.models / "qwen35-tiny.gguf"
    drafter = args.models / "qwen3-tiny-drafter.gguf"
    repo, file_name = PREFILL_DRAFTER_SOURCE.removeprefix("hf:").rsplit("/", 1)
    state = HubState()
    if drafter.is_file():
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
    document: dict[str, Any] = {
        "set": args.set,
        "gpu": smi,
        "ctx": chosen_set.ctx,
        "reply_tokens": chosen_set.reply_tokens,
    }
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

    hold: MemoryHold | None = None
    if chosen_set.hold_for_q4:
        hold = hold_for_q4(target, chosen_set.ctx, extra, document, args.leave_mib)
    try:
        with serve_hub(state) as hub, tempfile.TemporaryDirectory() as hf_home:
            os.environ["HF_ENDPOINT"], os.environ["HF_HOME"] = hub.base_url, hf_home
            for index, (mode, mode_args) in enumerate(chosen_set.modes):
                document["modes"].append({"mode": mode, "mode_args": list(mode_args)})
                try:
                    run_mode(
                        document["modes"][-1],
                        target,
                        args.deadline,
                        1000 * index,
                        save,
                        chosen_set,
                        mode_args,
                        extra,
                        args.port,
                    )
                except Exception as exc:  # the other modes still run; the error is in the results
                    document["modes"][-1]["error"] = f"{type(exc).__name__}: {exc}"
    finally:
        if hold is not None:
            hold.close()
    save()
    print_table(document, chosen_set)


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


def print_table(document: dict[str, Any], chosen_set: ModeSet) -> None:
    """Client TTFT / status TTFT / client decode per prompt size, one column per mode."""
    bsa = [(e["id"], e["bsa"]) for e in document.get("engines", [])]
    print(f"\n{document['gpu']}; BSA per engine: {bsa}; served with {document['engine_id']}")
    by_mode = {
        m["mode"]: {r["prompt_tokens_asked"]: r for r in m.get("rows", [])}
        for m in document["modes"]
    }
    names = [mode for mode, _ in chosen_set.modes]
    print(f"{'prompt':>8} " + " ".join(f"{m + ' TTFT client/status, decode':>36}" for m in names))
    for size in chosen_set.sizes:
        cells = []
        for mode in names:
            row = by_mode.get(mode, {}).get(size) or {}
            shown = (row.get("status") or {}).get("last_ttft_s")
            decode = row.get("client_decode_tokens_per_s")
            cells.append(f"{row.get('client_ttft_s')!s:>9} / {shown!s:<9} {decode!s:>8} tok/s")
        print(f"{size:>8} " + " ".join(f"{c:>36}" for c in cells))


if __name__ == "__main__":
    main()
