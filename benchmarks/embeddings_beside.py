"""Embeddings beside the chat model through lucebox's port: each request's latency, idle and
while a chat reply streams, and whether the vectors rank a paraphrase above an unrelated
sentence (all-MiniLM-L6-v2 from support/bertgguf.py). One JSON document on stdout and in
``--out``. On the GPU machine `drive.sh embeddings_beside` serves the real Lucebox engine with
MiniLM beside it; here it measures any running server:

    python -m benchmarks embeddings_beside --url http://127.0.0.1:8080 --out /tmp/embed.json
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import threading
import time
from pathlib import Path
from typing import Any

import httpx

SENTENCES = (
    "A man is playing a guitar.",
    "Someone plays an acoustic guitar.",
    "The stock market fell sharply today.",
)


def cosine(a: list[float], b: list[float]) -> float:
    dot = sum(x * y for x, y in zip(a, b, strict=True))
    return dot / math.sqrt(sum(x * x for x in a) * sum(y * y for y in b))


def latencies_s(client: httpx.Client, url: str, count: int) -> list[float]:
    took = []
    for index in range(count):
        started = time.perf_counter()
        answer = client.post(f"{url}/v1/embeddings", json={"input": f"note {index}: hello"})
        answer.raise_for_status()
        took.append(time.perf_counter() - started)
    return took


def summary(took: list[float]) -> dict[str, float]:
    ordered = sorted(took)
    return {
        "median_ms": round(1000 * statistics.median(ordered), 2),
        "p90_ms": round(1000 * ordered[int(0.9 * (len(ordered) - 1))], 2),
        "count": len(ordered),
    }


def during_chat(
    client: httpx.Client, url: str, model: str, count: int, chat_tokens: int
) -> dict[str, Any]:
    """Embedding latencies while one streamed chat reply of ``chat_tokens`` runs."""
    streaming, finished = threading.Event(), threading.Event()

    def reply() -> None:
        body = {
            "model": model,
            "messages": [{"role": "user", "content": "Count to a thousand."}],
            **{"max_tokens": chat_tokens, "ignore_eos": True, "stream": True},
        }
        with httpx.stream("POST", f"{url}/v1/chat/completions", json=body, timeout=600) as r:
            for _ in r.iter_raw():
                streaming.set()
        finished.set()

    chat = threading.Thread(target=reply, daemon=True)
    chat.start()
    streaming.wait(120)
    took = latencies_s(client, url, count)
    still_streaming = not finished.is_set()
    chat.join(600)
    return {**summary(took), "chat_still_streaming_after": still_streaming}


def measure(url: str, count: int, chat_tokens: int) -> dict[str, Any]:
    with httpx.Client(timeout=120) as client:
        listed = client.get(f"{url}/v1/models").json()["data"]
        chat_model = next(m["id"] for m in listed if m.get("type") != "embeddings")
        embed_model = next(m["id"] for m in listed if m.get("type") == "embeddings")
        answer = client.post(f"{url}/v1/embeddings", json={"input": list(SENTENCES)})
        answer.raise_for_status()
        guitar, paraphrase, unrelated = (item["embedding"] for item in answer.json()["data"])
        return {
            "embed_model": embed_model,
            "dimensions": len(guitar),
            "cosine_paraphrase": round(cosine(guitar, paraphrase), 4),
            "cosine_unrelated": round(cosine(guitar, unrelated), 4),
            "paraphrase_ranked_first": cosine(guitar, paraphrase) > cosine(guitar, unrelated),
            "idle": summary(latencies_s(client, url, count)),
            "during_chat": during_chat(client, url, chat_model, count, chat_tokens),
        }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--url", required=True)
    parser.add_argument("--count", type=int, default=30)
    parser.add_argument("--chat-tokens", type=int, default=2000)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    document = {
        "command": f"python -m benchmarks embeddings_beside --url {args.url} --count "
        f"{args.count} --chat-tokens {args.chat_tokens}",
        **measure(args.url, args.count, args.chat_tokens),
    }
    text = json.dumps(document, indent=2)
    print(text)
    if args.out:
        args.out.write_text(text + "\n")


if __name__ == "__main__":
    main()
