"""Record what the pinned engine really writes, for the sampler's tests to replay.

Serves SmolLM2-135M-Instruct with the built CPU engine (support/realmodels.py), sends chat
requests and writes, per scenario, the engine's log (`NAME.log`) and what the HTTP side saw
(`NAME.json.gz`: each reply's `timings`, /metrics bodies between requests, and /metrics with
/slots once a second while requests ran). Scenarios: `spec` (self-speculation: the same file
as draft, `--spec-type draft-simple`, requests one after another, then a long one),
`two_slots` (two requests at once on two slots) and `reprocess` (Gemma 3 270M, whose
sliding-window cache cannot keep a prefix without checkpoints, at `-lv 4` where the engine
says so: a long prompt, then one that shares only its start) and `spec_refused` (a draft
whose vocabulary does not match: the engine logs why and serves without speculation).

    .venv/bin/python -m tests.engine.enginelog.capture [SCENARIO...]
"""

from __future__ import annotations

import gzip
import json
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx

from support.health import wait_healthy
from support.ports import free_port
from support.realmodels import engine_home, gemma_model, smol_model
from tests.engine.enginelog import FOLDER

QUESTIONS = ("Say hello.", "Count from one to ten.", "Say hello.")


def server_path() -> Path:
    (path,) = (engine_home() / "data" / "engines").glob("*/bin/llama-server")
    return path


def chat(url: str, question: str, max_tokens: int) -> dict:
    reply = httpx.post(
        f"{url}/v1/chat/completions",
        json={
            "messages": [{"role": "user", "content": question}],
            "max_tokens": max_tokens,
            "temperature": 0,
        },
        timeout=600,
    )
    return reply.json()["timings"]


def record(name: str, extra_args: list[str], script, model: Path | None = None) -> None:
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    model = model or smol_model()
    log_path = FOLDER / f"{name}.log"
    with log_path.open("w") as log:
        engine = subprocess.Popen(
            [
                *(str(server_path()), "-m", str(model), "--port", str(port), "--metrics"),
                *("-c", "4096", "-np", "2", *extra_args),
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
        )
    try:
        assert wait_healthy(url, 600, engine), "llama-server did not become healthy"
        seen: dict[str, list] = {"timings": [], "metrics": [], "live": []}
        seen["metrics"].append(httpx.get(f"{url}/metrics").text)
        seen["slots_idle"] = httpx.get(f"{url}/slots").json()
        script(url, seen)
        seen["metrics"].append(httpx.get(f"{url}/metrics").text)
    finally:
        engine.terminate()
        engine.wait(timeout=60)
    # The models' folder is this machine's; the file names are what the tests need.
    text = log_path.read_text().replace(f"{model.parent}/", "")
    log_path.write_text(text)
    with gzip.open(FOLDER / f"{name}.json.gz", "wt", compresslevel=9) as handle:
        json.dump(seen, handle, separators=(",", ":"))


def watch_slots(url: str, seen: dict, done: threading.Event) -> None:
    while not done.wait(1.0):
        seen["live"].append(
            {
                "at_s": time.monotonic(),
                "metrics": httpx.get(f"{url}/metrics").text,
                "slots": httpx.get(f"{url}/slots").json(),
            }
        )


def with_slots_watched(url: str, seen: dict, work) -> None:
    done = threading.Event()
    watcher = threading.Thread(target=watch_slots, args=(url, seen, done))
    watcher.start()
    try:
        work()
    finally:
        done.set()
        watcher.join()


def spec_script(url: str, seen: dict) -> None:
    for question in QUESTIONS:
        seen["timings"].append(chat(url, question, 32))
        seen["metrics"].append(httpx.get(f"{url}/metrics").text)
    with_slots_watched(
        url,
        seen,
        lambda: seen["timings"].append(chat(url, "Tell a long story about a cat.", 120)),
    )


def two_slots_script(url: str, seen: dict) -> None:
    def one(question: str) -> None:
        seen["timings"].append(chat(url, question, 64))

    def both() -> None:
        threads = [threading.Thread(target=one, args=(q,)) for q in QUESTIONS[:2]]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()

    with_slots_watched(url, seen, both)


def reprocess_script(url: str, seen: dict) -> None:
    story = " ".join(f"Line {n} of the log says the lamp is lit." for n in range(80))
    for question in (f"Summarise: {story}", "Summarise: nothing at all."):
        seen["timings"].append(chat(url, question, 8))
        seen["metrics"].append(httpx.get(f"{url}/metrics").text)


def refused_script(url: str, seen: dict) -> None:
    seen["timings"].append(chat(url, QUESTIONS[0], 8))


SCENARIOS = {
    "spec": lambda: record(
        "spec", ["-md", str(smol_model()), "--spec-type", "draft-simple"], spec_script
    ),
    "two_slots": lambda: record("two_slots", [], two_slots_script),
    "reprocess": lambda: record(
        "reprocess",
        ["-lv", "4", "--ctx-checkpoints", "0", "--chat-template", "gemma"],
        reprocess_script,
        gemma_model(),
    ),
    # Gemma's vocabulary is not SmolLM2's: the engine refuses the draft and serves without it.
    "spec_refused": lambda: record(
        "spec_refused", ["-md", str(gemma_model()), "--spec-type", "draft-simple"], refused_script
    ),
}


def main() -> None:
    for name in sys.argv[1:] or SCENARIOS:
        SCENARIOS[name]()


if __name__ == "__main__":
    main()
