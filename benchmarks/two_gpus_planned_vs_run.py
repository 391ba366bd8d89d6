"""Device benchmark for issue 43: lucebox on two GPUs, as planned vs as run, both engines.

A filler process holds all but ``--leave-mib`` of each card (a small card, as NVML reports it
to the planner), then, each through `lucebox serve --spec off` with the CUDA llama-server:

1. split: a generated model at ``--ctx`` that only both cards hold (``--gpus 0,1``): each
   device's planned bytes (`plan --json` ``devices``) vs nvidia-smi's memory of the engine
   process on that GPU after a warm-up, decode tok/s, `status --json` ``gpus``;
2. one card: the same model with ``--gpus 0`` at the context one card holds (the plan's
   largest), the same figures;
3. a served set of that model and a smaller one (``--model A --model B --gpus 0,1``): the card
   each was planned on and the one its process runs on, planned vs used memory, `status --json`
   ``gpus`` and ``models``.

Then, the filler gone, the Lucebox engine (the 4cf58a04 build where installed: it has tensor
parallel) with the generated qwen35 target and its Lucebox draft (benchmarks/lucebox_models.py) at
``--lucebox-ctx``, through `lucebox serve --placement P` for each placement the plan offers
(one card, the draft on the second card, tensor parallel): each card's planned bytes vs
nvidia-smi's for the engine process after lucebox's warm-up and a long prompt, decode tok/s,
`status --json` ``gpus``. Each measured decode goes into the measurement store, and a last
`plan --json` without --placement shows the choice it makes from them. Before, each installed
Lucebox build's features are read again from its ``--help`` (a build installed by code older
than the placement features would offer one card only).

On one GPU the parts that need two are listed under ``unrun``. Parts not started before
``--budget-s`` are skipped as such. Prints one JSON document. Needs both engines built and
torch (for the filler).

    python -m benchmarks.two_gpus_planned_vs_run --work .devrun/work [--leave-mib 3584]
        [--ctx 131072] [--parts split,one,set,lucebox] [--budget-s 400]
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import itertools
import json
import os
import signal
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx

from benchmarks.lucebox_models import DRAFT as LUCEBOX_DRAFT
from benchmarks.lucebox_models import TARGET as LUCEBOX_TARGET
from support.ggufgen import ModelSpec, write_llama, write_lucebox_dflash, write_qwen35

PORT = 18190
SPLIT_MODEL = ModelSpec(
    name="Random Llama 2B",
    size_label="2B",
    n_layer=16,
    n_embd=2048,
    n_head=16,
    n_head_kv=4,
    head_dim=128,
    n_ff=8192,
    vocab_size=32000,
    n_ctx=131072,
    constant_weights=True,
)
"""2.06 GiB of F16 weights, 32 KiB of f16 KV a token: with 3.5 GiB free a card holds ~40K
tokens of q8_0 KV, two cards hold the native 131072."""
SECOND_MODEL = ModelSpec(
    name="Random Llama 1B",
    size_label="1B",
    n_layer=8,
    n_embd=2048,
    n_head=16,
    n_head_kv=4,
    head_dim=128,
    n_ff=8192,
    vocab_size=32000,
    n_ctx=32768,
    constant_weights=True,
)
DECODE_TOKENS = 512
DECODE_RUNS = 2
LUCEBOX_DECODE_TOKENS = 256
WARM_UP_WORDS = 1500

FILLER = """
import json, sys, time, torch
leave = int(sys.argv[1]) << 20
held = []
for index in range(torch.cuda.device_count()):
    for _ in range(4):  # top up: the first allocation also maps the context
        free, _ = torch.cuda.mem_get_info(index)
        if free - leave < 64 << 20:
            break
        held.append(torch.empty(free - leave, dtype=torch.uint8, device=index))
print(json.dumps([torch.cuda.mem_get_info(i)[0] >> 20 for i in range(torch.cuda.device_count())]),
      flush=True)
time.sleep(3600)
"""


def lucebox(*args: str, timeout_s: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "lucebox.app.cli", *args],
        capture_output=True, text=True, check=False, timeout=timeout_s,
    )  # fmt: skip


def status() -> dict[str, Any]:
    done = lucebox("status", "--json")
    try:
        return dict(json.loads(done.stdout))
    except json.JSONDecodeError:
        return {"state": None, "error": done.stdout + done.stderr}


def smi(query: str, *, apps: bool = False) -> list[list[str]]:
    kind = "--query-compute-apps" if apps else "--query-gpu"
    out = subprocess.run(
        ["nvidia-smi", f"{kind}={query}", "--format=csv,noheader,nounits"],
        capture_output=True, text=True, check=True,
    ).stdout  # fmt: skip
    return [[cell.strip() for cell in line.split(",")] for line in out.splitlines() if line]


def gpu_processes(skip_pid: int) -> list[dict[str, Any]]:
    """Every compute process but the filler: pid, GPU index, MiB, and its model file."""
    index_of = {uuid: int(index) for index, uuid in smi("index,uuid")}
    found = []
    for pid, uuid, used in smi("pid,gpu_uuid,used_memory", apps=True):
        if int(pid) == skip_pid:
            continue
        try:
            cmd = Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace").split("\0")
        except OSError:
            cmd = []
        model = next((a for a in cmd if a.endswith(".gguf")), None)
        found.append(
            {"pid": int(pid), "gpu": index_of.get(uuid), "used_mib": int(used), "model": model}
        )
    return found


@contextlib.contextmanager
def filler(leave_mib: int) -> Iterator[tuple[int, list[int]]]:
    """Hold all but ``leave_mib`` of every card; yields (pid, free MiB per card)."""
    proc = subprocess.Popen(
        [sys.executable, "-c", FILLER, str(leave_mib)], stdout=subprocess.PIPE, text=True
    )
    assert proc.stdout is not None
    try:
        free = json.loads(proc.stdout.readline())
        time.sleep(1)
        yield proc.pid, free
    finally:
        proc.kill()
        proc.wait()


@contextlib.contextmanager
def served(
    args: list[str], log: Path, *, models: bool = False, timeout_s: float = 300
) -> Iterator[dict[str, Any]]:
    """`lucebox serve ARGS` until the block ends; yields its status once ready (and, for a
    set, once it lists the models)."""
    with log.open("w") as handle:
        proc = subprocess.Popen(
            [sys.executable, "-m", "lucebox.app.cli", "serve", "--port", str(PORT), *args],
            stdout=handle, stderr=subprocess.STDOUT,
        )  # fmt: skip
    try:
        deadline = time.monotonic() + timeout_s
        while True:
            now = status()
            if now.get("state") == "ready" and (now.get("models") or not models):
                break
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"serve did not get ready: {log.read_text()[-3000:]}")
            time.sleep(0.5)
        yield now
    finally:
        lucebox("down", timeout_s=120)
        try:
            proc.wait(timeout=90)
        except subprocess.TimeoutExpired:
            proc.send_signal(signal.SIGKILL)
            proc.wait()


def ask(
    model: str | None, content: str, max_tokens: int, *, ignore_eos: bool = True
) -> dict[str, Any]:
    """One chat request; its timings, the wall time and the tokens it decoded (the Lucebox
    engine reports its decode rate under ``usage.timings``, llama-server under ``timings``)."""
    body: dict[str, Any] = {
        "messages": [{"role": "user", "content": content}],
        "max_tokens": max_tokens,
        "temperature": 0,
    }
    if ignore_eos:
        body["ignore_eos"] = True
    if model is not None:
        body["model"] = model
    started = time.perf_counter()
    reply = httpx.post(f"http://127.0.0.1:{PORT}/v1/chat/completions", json=body, timeout=600)
    wall_s = time.perf_counter() - started
    answer = reply.json()
    usage = answer.get("usage") or {}
    timings = answer.get("timings") or {}
    rate = timings.get("predicted_per_second") or (usage.get("timings") or {}).get(
        "decode_tokens_per_sec"
    )
    decoded = usage.get("completion_tokens")
    return {
        "http": reply.status_code,
        "wall_s": round(wall_s, 3),
        "decoded": decoded,
        "decode_tok_s": round(float(rate), 1) if rate else None,
        "prompt_tokens": (answer.get("usage") or {}).get("prompt_tokens"),
        "error": None if reply.status_code == 200 else str(answer)[:500],
    }


def warm_up(model: str | None, *, ignore_eos: bool = True) -> dict[str, Any]:
    words = " ".join(("the", "model", "reads", "this", "text")[i % 5] for i in range(WARM_UP_WORDS))
    return ask(model, words, 64, ignore_eos=ignore_eos)


def decode(
    model: str | None, tokens: int = DECODE_TOKENS, *, ignore_eos: bool = True
) -> dict[str, Any]:
    runs = [
        ask(model, "Write a long story.", tokens, ignore_eos=ignore_eos) for _ in range(DECODE_RUNS)
    ]
    speeds = [r["decode_tok_s"] for r in runs if r["decode_tok_s"]]
    return {"runs": runs, "median_tok_s": statistics.median(speeds) if speeds else None}


def plan(args: list[str]) -> dict[str, Any]:
    done = lucebox("plan", *args, "--json")
    if done.returncode != 0:
        raise RuntimeError(f"plan {args} exit {done.returncode}: {done.stdout}{done.stderr}")
    return dict(json.loads(done.stdout))


def plan_summary(p: dict[str, Any]) -> dict[str, Any]:
    return {
        "ctx": p["ctx"],
        "kv": p["cache_type_k"],
        "tensor_split": p.get("tensor_split"),
        "env": p.get("env"),
        "device_mib": [round(d["memory_bytes"] / 2**20) for d in p.get("devices", [])],
        "total_mib": round(p["memory_bytes"]["total"] / 2**20),
        "reasons": {k: p["reasons"].get(k) for k in ("ctx", "cache_type", "split")},
    }


def compare(planned_mib: list[int], gpus: list[int], used: list[dict[str, Any]]) -> list[Any]:
    """Planned vs used per GPU of the launch (``gpus``: the plan's device order)."""
    rows = []
    if len(planned_mib) != len(gpus):
        return [{"error": f"the plan has {len(planned_mib)} devices for GPUs {gpus}"}]
    for planned, gpu in zip(planned_mib, gpus, strict=True):
        on_gpu = sum(p["used_mib"] for p in used if p["gpu"] == gpu)
        rows.append(
            {
                "gpu": gpu,
                "planned_mib": planned,
                "nvidia_smi_mib": on_gpu,
                "ratio": round(on_gpu / planned, 3) if planned else None,
                "within_5pct": abs(on_gpu / planned - 1) <= 0.05 if planned else None,
            }
        )
    return rows


def one_model(name: str, args: list[str], gpus: list[int], work: Path, fill_pid: int) -> Any:
    planned = plan(args)
    with served(args, work / f"serve-{name}.log") as ready:
        warm = warm_up(None)
        time.sleep(2)
        used = gpu_processes(fill_pid)
        speed = decode(None)
        after = status()
    summary = plan_summary(planned)
    return {
        "args": args,
        "plan": summary,
        "engine_pid": ready.get("engine_pid"),
        "served_ctx": ready.get("ctx"),
        "warm_up": warm,
        "processes": used,
        "memory": compare(summary["device_mib"], gpus, used),
        "decode": speed,
        "status_gpus": after.get("gpus"),
    }


def served_set(models: list[Path], work: Path, fill_pid: int) -> Any:
    args = [a for m in models for a in ("--model", str(m))] + ["--gpus", "0,1", "--spec", "off"]
    planned = plan(args)
    with served(args, work / "serve-set.log", models=True):
        answers = {}
        for m in planned["models"]:
            answers[m["alias"]] = warm_up(m["alias"])
        time.sleep(3)
        used = gpu_processes(fill_pid)
        after = status()
    rows = []
    for m in planned["models"]:
        visible = (m.get("env") or {}).get("CUDA_VISIBLE_DEVICES")
        procs = [p for p in used if p["model"] and Path(p["model"]).resolve() == Path(
            m["target"]["path"]).resolve()]  # fmt: skip
        rows.append(
            {
                "alias": m["alias"],
                "planned_gpu": int(visible) if visible is not None else None,
                "running_on_gpus": sorted({p["gpu"] for p in procs}),
                "ctx": m["ctx"],
                "kv": m["cache_type_k"],
                "planned_mib": round(m["memory_bytes"]["total"] / 2**20),
                "nvidia_smi_mib": sum(p["used_mib"] for p in procs),
                "answer": answers[m["alias"]],
            }
        )
    return {
        "args": args,
        "models_max": planned.get("models_max"),
        "reasons": planned.get("reasons"),
        "models": rows,
        "processes": used,
        "status_gpus": after.get("gpus"),
        "status_models": after.get("models"),
    }


def refresh_lucebox_features() -> list[dict[str, Any]]:
    """Each installed Lucebox build's capabilities read again from its ``--help`` by this
    code (its model architectures kept): what the planner offers follows the binary."""
    from lucebox.engine.core.paths import resolve_paths
    from lucebox.engine.engines import luceboxbuild
    from lucebox.engine.engines.install import write_manifest
    from lucebox.engine.engines.registry import list_engines

    paths = resolve_paths()
    rows = []
    for engine in list_engines(paths):
        if engine.kind != "lucebox":
            continue
        server = Path(engine.server_path)
        try:
            read = luceboxbuild.read_capabilities(paths, server, None, symmetric_only=True)
        except Exception as exc:  # one try on the GPU: record it, measure on
            rows.append({"id": engine.id, "error": repr(exc)[-1000:],
                         "after": list(engine.capabilities.features)})  # fmt: skip
            continue
        caps = dataclasses.replace(read, model_archs=engine.capabilities.model_archs)
        if caps.features != engine.capabilities.features:
            write_manifest(server.parent.parent, dataclasses.replace(engine, capabilities=caps))
        rows.append(
            {"id": engine.id, "before": list(engine.capabilities.features),
             "after": list(caps.features)}
        )  # fmt: skip
    return rows


def lucebox_build(rows: list[dict[str, Any]]) -> str | None:
    """The build measured: 4cf58a04's (tensor parallel) where installed, else any."""
    ids = [r["id"] for r in rows]
    return next((i for i in ids if "4cf58a04" in i), ids[0] if ids else None)


def lucebox_placement(placement: str | None, base: list[str], work: Path) -> dict[str, Any]:
    """One Lucebox-engine launch: planned vs used per card, decode, status gpus."""
    args = base + (["--placement", placement] if placement else [])
    planned = plan(args)
    gpus = [int(i) for i in (planned.get("env") or {})["CUDA_VISIBLE_DEVICES"].split(",")]
    with served(args, work / f"serve-lucebox-{placement}.log") as ready:
        pid = ready.get("engine_pid")
        warm = warm_up(None, ignore_eos=False)
        time.sleep(1)
        used = [p for p in gpu_processes(-1) if p["pid"] == pid]
        speed = decode(None, LUCEBOX_DECODE_TOKENS, ignore_eos=False)
        after_decode = [p for p in gpu_processes(-1) if p["pid"] == pid]
        after = status()
    summary = plan_summary(planned)
    return {
        "args": args,
        "placement": planned.get("placement"),
        "placement_reason": planned["reasons"].get("placement"),
        "devices_reason": planned["reasons"].get("devices"),
        "argv": planned.get("argv"),
        "plan": summary,
        "engine_pid": pid,
        "warm_up": warm,
        "processes": used,
        "memory": compare(summary["device_mib"], gpus, used),
        "memory_after_decode": compare(summary["device_mib"], gpus, after_decode),
        "decode": speed,
        "status_gpus": after.get("gpus"),
    }


def lucebox_parts(work: Path, n_gpus: int, ctx: int, deadline: float) -> dict[str, Any]:
    """The Lucebox engine one card vs the draft on card 1 vs tensor parallel, then the plan's
    own choice once the three are measured."""
    from lucebox.engine.core.paths import resolve_paths
    from lucebox.engine.plan.lucebox.luceboxdevices import PLACEMENTS, offered
    from lucebox.engine.plan.placementrates import placement_key, write_placement_rate

    rows = refresh_lucebox_features()
    build = lucebox_build(rows)
    doc: dict[str, Any] = {"builds": rows, "engine_id": build}
    if build is None:
        doc["error"] = "no Lucebox engine build is installed"
        return doc
    target, draft = work / "qwen35-tiny.gguf", work / "qwen35-tiny-dflash.gguf"
    if not target.exists():
        write_qwen35(target, LUCEBOX_TARGET)
    if not draft.exists():
        write_lucebox_dflash(draft, LUCEBOX_DRAFT)
    base = ["--model", str(target), "--draft", str(draft), "--engine", "lucebox",
            "--engine-id", build, "--ctx", str(ctx),
            "--gpus", "0,1" if n_gpus > 1 else "0"]  # fmt: skip
    features = next(r["after"] for r in rows if r["id"] == build)
    placements = offered(features, n_gpus, True, "qwen35", False)
    doc["unrun"] = [p for p in PLACEMENTS if p not in placements]
    names = [row[1] for row in smi("index,name")][:2]
    labels = tuple(f"GPU {i}: {name}" for i, name in enumerate(names))
    key = placement_key(target, draft, build, labels)
    for placement in placements:
        started = time.monotonic()
        if started > deadline:
            doc[placement] = {"skipped": "past the time budget"}
            continue
        try:
            doc[placement] = lucebox_placement(placement, base, work)
            rate = doc[placement]["decode"]["median_tok_s"]
            if rate and n_gpus > 1:
                write_placement_rate(resolve_paths(), key, placement, rate)
        except (RuntimeError, httpx.HTTPError, KeyError, ValueError) as exc:
            doc[placement] = {"error": repr(exc)[-3000:]}
        doc[placement]["seconds"] = round(time.monotonic() - started, 1)
        print(json.dumps({f"lucebox-{placement}": doc[placement]}), file=sys.stderr, flush=True)
    if n_gpus > 1:
        try:
            chosen = plan(base)
            doc["auto"] = {"placement": chosen.get("placement"),
                           "reason": chosen["reasons"].get("placement")}  # fmt: skip
        except (RuntimeError, KeyError, ValueError) as exc:
            doc["auto"] = {"error": repr(exc)[-2000:]}
    return doc


def llama_group(
    group: list[str],
    jobs: dict[str, Any],
    doc: dict[str, Any],
    deadline: float,
    save: Callable[[], None],
) -> None:
    """llama-server's parts of one filler session, each recorded as it ends."""
    for part in group:
        started = time.monotonic()
        if started > deadline:
            doc[part] = {"skipped": "past the time budget"}
            continue
        try:
            doc[part] = jobs[part]()
        except (RuntimeError, httpx.HTTPError, KeyError, ValueError) as exc:
            doc[part] = {"error": repr(exc)[-3000:]}
        doc[part]["seconds"] = round(time.monotonic() - started, 1)
        print(json.dumps({part: doc[part]}), file=sys.stderr, flush=True)
        save()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--work", type=Path, default=Path("/tmp"))
    parser.add_argument("--leave-mib", type=int, default=3584)
    parser.add_argument("--ctx", type=int, default=131072)
    parser.add_argument("--parts", default="split,one,lucebox,set")
    parser.add_argument("--lucebox-ctx", type=int, default=32768)
    parser.add_argument("--budget-s", type=float, default=400)
    parser.add_argument("--out", type=Path, help="also written here after each part")
    args = parser.parse_args()
    deadline = time.monotonic() + args.budget_s
    # A timeout's SIGTERM unwinds through the context managers: servers down, filler gone.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    args.work.mkdir(parents=True, exist_ok=True)
    big, small = args.work / "two-gpu-2b.gguf", args.work / "two-gpu-1b.gguf"
    parts = args.parts.split(",")
    gpus = smi("index,name,memory.total,driver_version")
    doc: dict[str, Any] = {"gpus": gpus, "leave_mib": args.leave_mib, "parts": parts}
    if len(gpus) < 2:  # what needs two cards stays unrun; one card still measures the rest
        doc["unrun"] = [p for p in parts if p in ("split", "set")]
        parts = [p for p in parts if p not in ("split", "set")]
    if any(p != "lucebox" for p in parts):
        for path, spec in ((big, SPLIT_MODEL), (small, SECOND_MODEL)):
            if not path.exists():
                write_llama(path, spec)

    def save() -> None:
        if args.out is not None:
            args.out.write_text(json.dumps(doc, indent=1))

    def llama_jobs(fill_pid: int) -> dict[str, Any]:
        return {
            "split": lambda: one_model(
                "split", ["--model", str(big), "--gpus", "0,1", "--ctx", str(args.ctx),
                          "--spec", "off"], [0, 1], args.work, fill_pid),
            "one": lambda: one_model(
                "one", ["--model", str(big), "--gpus", "0", "--spec", "off"], [0], args.work,
                fill_pid),
            "set": lambda: served_set([big, small], args.work, fill_pid),
        }  # fmt: skip

    # llama-server's parts run beside the filler; the Lucebox engine's on the whole cards.
    groups = [list(g) for _, g in itertools.groupby(parts, key=lambda p: p == "lucebox")]
    for group in groups:
        if time.monotonic() > deadline:
            doc.update({part: {"skipped": "past the time budget"} for part in group})
            continue
        if group[0] == "lucebox":
            started = time.monotonic()
            try:
                doc["lucebox"] = lucebox_parts(args.work, len(gpus), args.lucebox_ctx, deadline)
            except Exception as exc:  # one try on the GPU: the set still runs
                doc["lucebox"] = {"error": repr(exc)[-3000:]}
            doc["lucebox"]["seconds"] = round(time.monotonic() - started, 1)
            save()
            continue
        try:
            with filler(args.leave_mib) as (fill_pid, free):
                doc.setdefault("free_mib_after_filler", free)
                llama_group(group, llama_jobs(fill_pid), doc, deadline, save)
        except ValueError as exc:  # the filler printed no free memory (no torch, no GPU)
            doc.update({part: {"error": f"filler: {exc!r}"} for part in group if part not in doc})
    if "decode" in doc.get("split", {}) and "decode" in doc.get("one", {}):
        fast = [doc[p]["decode"].get("median_tok_s") for p in ("split", "one")]
        doc["decode_split_over_one"] = round(fast[0] / fast[1], 3) if all(fast) else None
    doc["env"] = {k: os.environ.get(k) for k in ("NCCL_NVLS_ENABLE", "CUDA_VISIBLE_DEVICES")}
    save()
    print(json.dumps(doc, indent=1))


if __name__ == "__main__":
    main()
