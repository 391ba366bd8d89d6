"""Device benchmark: the Lucebox engine's GPU memory at each stage of its life, and its peak.

Starts ``dflash_server`` with the given arguments and reads the memory NVML reports for its
process on each GPU (one figure per card, in NVML's order) after the load, after lucebox's
warm-up request, after a prompt whose last prefill chunk is a full 512 tokens, after a long
prompt and after a 256-token reply, while a thread polls NVML every 20 ms for the peak in
between. What the plan must cover is the largest of these: the engine allocates its rollback
buffers and graphs lazily and grows its compute buffers to the largest chunk it has run.
Prints one JSON line per run.

    python3 benchmarks/lucebox_memory_by_stage.py NAME LONG_WORDS -- SERVER MODEL [ENGINE ARGS...]
    python3 benchmarks/lucebox_memory_by_stage.py NAME LONG_WORDS -- serve [LUCEBOX SERVE ARGS...]

The second form plans with ``lucebox plan ARGS --json``, serves with ``lucebox serve ARGS``
(which sends the warm-up itself before it reports ready) and prints the plan's total beside
the readings.
"""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time

import httpx
import psutil
import pynvml

from lucebox.engine.run.kinds.luceboxrun import WARM_UP_MESSAGES

PORT = 18170
URL = f"http://127.0.0.1:{PORT}"
FULL_LAST_CHUNK_WORDS = 1010
"""About 1,024 prompt tokens with the chat template: two prefill chunks, the last one full."""
FILLER = ["hello", "world", "the", "model", "test"]
"""About one token a word with the generated models' tokenizer."""


def process_mib(handles: list[object], pid: int) -> list[int]:
    """The process's memory on each card (0 where it holds none)."""
    found = []
    for handle in handles:
        mib = 0
        for proc in pynvml.nvmlDeviceGetComputeRunningProcesses(handle):
            if proc.pid == pid and proc.usedGpuMemory is not None:
                mib = int(proc.usedGpuMemory) // 2**20
        found.append(mib)
    return found


class PeakWatch(threading.Thread):
    """Polls the process's memory until stopped; ``peak_mib`` is each card's largest reading."""

    def __init__(self, handles: list[object], pid: int) -> None:
        super().__init__(daemon=True)
        self.handles, self.pid = handles, pid
        self.peak_mib = [0] * len(handles)
        self.stopped = threading.Event()

    def run(self) -> None:
        while not self.stopped.wait(0.02):
            now = process_mib(self.handles, self.pid)
            self.peak_mib = [max(a, b) for a, b in zip(self.peak_mib, now, strict=True)]

    def take(self) -> list[int]:
        """The peaks since the last take, then start over."""
        peak, self.peak_mib = self.peak_mib, [0] * len(self.handles)
        return peak


def ask(words: int, max_tokens: int, warm_up: bool = False) -> dict[str, object]:
    filler = " ".join(FILLER[i % 5] for i in range(words))
    body = {
        "messages": list(WARM_UP_MESSAGES) if warm_up else [{"role": "user", "content": filler}],
        "max_tokens": max_tokens,
        "temperature": 0,
    }
    reply = httpx.post(f"{URL}/v1/chat/completions", json=body, timeout=600)
    data = reply.json()
    usage = data.get("usage") or {}
    return {
        "http": reply.status_code,
        "prompt_tokens": usage.get("prompt_tokens"),
        "completion_tokens": usage.get("completion_tokens"),
        "error": data.get("error"),
    }


def lucebox(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "lucebox.app.cli", *args], capture_output=True, text=True
    )


def wait_raw(server: subprocess.Popen[bytes]) -> int:
    for _ in range(1500):
        if server.poll() is not None:
            break
        try:
            if httpx.get(f"{URL}/health", timeout=1).status_code == 200:
                break
        except httpx.HTTPError:
            time.sleep(0.2)
    return server.pid


def engine_child(server: subprocess.Popen[bytes]) -> int:
    """The pid of the engine `lucebox serve` starts, once it runs; 0 if serve ended first."""
    while server.poll() is None:
        children = psutil.Process(server.pid).children(recursive=True)
        pid = next((c.pid for c in children if "dflash" in c.name()), 0)
        if pid:
            return pid
        time.sleep(0.1)
    return 0


def wait_ready(server: subprocess.Popen[bytes]) -> bool:
    """Whether lucebox says ready (after its warm-up request) before it fails or gives up."""
    for _ in range(600):
        if server.poll() is not None:
            return False
        state = json.loads(lucebox("status", "--json").stdout or "{}").get("state")
        if state in ("ready", "failed"):
            return state == "ready"
        time.sleep(0.5)
    return False


def main(name: str, long_words: int, argv: list[str]) -> None:
    pynvml.nvmlInit()
    handles = [pynvml.nvmlDeviceGetHandleByIndex(i) for i in range(pynvml.nvmlDeviceGetCount())]
    log = open(f"{name}.log", "w")  # noqa: SIM115 - the server writes it until the end
    stages: dict[str, object] = {}
    through_serve = argv[0] == "serve"
    if through_serve:
        plan = json.loads(lucebox("plan", *argv[1:], "--json").stdout)
        memory = plan["memory_bytes"]
        stages["plan_mib"] = {k: memory[k] // 2**20 for k in ("total", "peak", "compute")}
        stages["kv"] = (plan["ctx"], plan["cache_type_k"], plan["kvflash_pool_tokens"])
        command = [sys.executable, "-m", "lucebox.app.cli", *argv, "--port", str(PORT)]
    else:
        command = [*argv, "--host", "127.0.0.1", "--port", str(PORT), "--model-name", "m"]
    server = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT)
    pid = engine_child(server) if through_serve else wait_raw(server)
    watch = PeakWatch(handles, pid)
    steps: list[tuple[str, int, int, bool]] = [
        ("full_chunk", FULL_LAST_CHUNK_WORDS, 8, False),
        ("long", long_words, 8, False),
        ("decode", 4, 256, False),
    ]
    watch.start()
    if through_serve:
        stages["ready"] = wait_ready(server)
        stages["warm"] = {"mib": process_mib(handles, pid), "peak_mib": watch.take()}
    else:
        stages["load_mib"] = process_mib(handles, pid)
        steps.insert(0, ("warm", 0, 8, True))
    try:
        for stage, words, max_tokens, warm_up in steps:
            reply = ask(words, max_tokens, warm_up)
            time.sleep(0.3)
            stages[stage] = {**reply, "mib": process_mib(handles, pid), "peak_mib": watch.take()}
    except (httpx.HTTPError, ValueError) as exc:
        stages["failed"] = str(exc)
    finally:
        watch.stopped.set()
        if through_serve:
            lucebox("down")
        server.terminate()
        server.wait(60)
        log.close()
    print(json.dumps({"name": name, "argv": argv[1:], **stages}))


if __name__ == "__main__":
    split = sys.argv.index("--")
    main(sys.argv[1], int(sys.argv[2]), sys.argv[split + 1 :])
