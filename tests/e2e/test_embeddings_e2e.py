"""Embeddings and rerank beside the chat model, end to end on the CPU: `lucebox serve` of the
real SmolLM2 with the real all-MiniLM-L6-v2 (converted from its PyPI package,
support/bertgguf.py) and a reranker-shaped MiniLM beside it, each side model a llama-server of
its own (the suite's build) behind lucebox's one port.

The reranker's head is seeded, not trained: only the rerank wire format is proven here.
"""

from __future__ import annotations

import json
import math
import os
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import openai
import pytest

from lucebox.engine.bench.compare import ServeConfig, Served, serving
from lucebox.engine.core.paths import resolve_paths
from lucebox.engine.pipeline import ServeOptions
from support.bertgguf import minilm_model, reranker_model
from support.realmodels import smol_model
from support.smolserver import private_engine_home
from tests.conftest import assert_one_line_error, run_lucebox
from tests.e2e.test_agent_clients import LUCEBOX, clean_env, run
from tests.e2e.test_agent_clients import clients_path as clients_path  # a fixture

pytestmark = pytest.mark.slow

GUITAR = "A man is playing a guitar."
PARAPHRASE = "Someone plays an acoustic guitar."
UNRELATED = "The stock market fell sharply today."


def cosine(a: list[float], b: list[float]) -> float:
    dot = sum(x * y for x, y in zip(a, b, strict=True))
    return dot / math.sqrt(sum(x * x for x in a) * sum(y * y for y in b))


def until_answers(url: str, path: str, body: dict[str, object], timeout_s: float = 60) -> None:
    """Wait for a side model to load (the chat engine says ready on its own)."""
    deadline_s = time.monotonic() + timeout_s
    while time.monotonic() < deadline_s:
        if httpx.post(f"{url}{path}", json=body, timeout=30).status_code == 200:
            return
        time.sleep(0.5)
    raise AssertionError(f"{path} never answered 200")


@pytest.fixture(scope="module")
def embed_home(built_engine_home, tmp_path_factory) -> Path:
    return private_engine_home(tmp_path_factory.mktemp("embed-home"))


@pytest.fixture(scope="module")
def beside_smol(embed_home) -> Iterator[Served]:
    home = embed_home
    paths = resolve_paths({"LUCEBOX_HOME": str(home)})
    options = ServeOptions(model=str(smol_model()), ctx=2048)
    sides = ("--embed-model", str(minilm_model()), "--rerank-model", str(reranker_model()))
    env = {**os.environ, "LUCEBOX_HOME": str(home)}
    config = ServeConfig("embed", serve_args=sides)
    with serving(paths, options, config, env=env, ready_timeout_s=600) as served:
        until_answers(served.url, "/v1/embeddings", {"input": "warm"})
        until_answers(served.url, "/v1/rerank", {"query": "q", "documents": ["d"]})
        yield served


def test_openai_sdk_embeddings_rank_a_paraphrase_above_an_unrelated_sentence(beside_smol):
    client = openai.OpenAI(base_url=f"{beside_smol.url}/v1", api_key="none")
    listed = {m.id: m for m in client.models.list().data}
    embedder = next(m for m in listed.values() if getattr(m, "type", None) == "embeddings")
    got = client.embeddings.create(model=embedder.id, input=[GUITAR, PARAPHRASE, UNRELATED])
    guitar, paraphrase, unrelated = (item.embedding for item in got.data)
    assert len(guitar) == 384  # MiniLM's width: the side model answered, not the chat model
    assert cosine(guitar, paraphrase) > cosine(guitar, unrelated) + 0.3


def test_rerank_orders_three_documents_by_score(beside_smol):
    documents = ["a recipe for bread", "guitar lessons for beginners", "tax forms"]
    for path in ("/v1/rerank", "/rerank", "/reranking"):
        answer = httpx.post(
            f"{beside_smol.url}{path}",
            json={"query": "learn to play guitar", "documents": documents},
            timeout=30,
        )
        assert answer.status_code == 200, answer.text
        results = answer.json()["results"]
        assert sorted(r["index"] for r in results) == [0, 1, 2]
        scores = [r["relevance_score"] for r in results]
        assert scores == sorted(scores, reverse=True)


def test_an_embedding_is_not_queued_behind_a_chat_reply(beside_smol):
    """The CPU chat engine serves one request at a time: an embedding that went through the
    chat queue would wait for the whole reply."""
    streaming = threading.Event()
    finished = threading.Event()

    def long_reply() -> None:
        body = {
            "messages": [{"role": "user", "content": "Count to a thousand."}],
            "max_tokens": 400,
            "ignore_eos": True,
            "stream": True,
        }
        with httpx.stream(
            "POST", f"{beside_smol.url}/v1/chat/completions", json=body, timeout=300
        ) as reply:
            for _ in reply.iter_raw():
                streaming.set()
        finished.set()

    chat = threading.Thread(target=long_reply)
    chat.start()
    try:
        assert streaming.wait(120)
        answer = httpx.post(f"{beside_smol.url}/embeddings", json={"input": GUITAR}, timeout=60)
        assert answer.status_code == 200
        assert not finished.is_set(), "the chat reply ended first: nothing was measured"
    finally:
        chat.join(300)


def test_plan_shows_the_embedding_models_memory_and_refuses_it_without_room():
    smol, minilm = str(smol_model()), str(minilm_model())
    shown = run_lucebox("plan", "--model", smol, "--ctx", "2048", "--embed-model", minilm)
    assert shown.returncode == 0, shown.stderr
    assert "embeddings model: all-MiniLM-L6-v2-F16" in shown.stdout
    refused = run_lucebox(
        "plan", "--model", smol, "--ctx", "2048", "--embed-model", minilm, "--vram-mib", "1000"
    )
    assert refused.returncode == 3, refused.stderr
    assert_one_line_error(refused)
    assert "the embeddings model" in refused.stderr
    assert "the chat model keeps its memory" in refused.stderr
    alone = run_lucebox("plan", "--model", smol, "--ctx", "2048", "--vram-mib", "1000")
    assert alone.returncode == 0, alone.stderr  # the same chat plan fits without it


def test_llm_embeds_through_lucebox_as_launch_sets_it_up(
    embed_home, beside_smol, clients_path, tmp_path
):
    """The real `llm` CLI (a RAG-capable client: `llm embed`, `llm similar`) pointed at the
    running server by `lucebox launch llm`, which `lucebox connect llm` describes."""
    home, work = tmp_path / "home", tmp_path / "work"
    home.mkdir()
    work.mkdir()
    env = clean_env(home, embed_home, clients_path)
    described = run([*LUCEBOX, "connect", "llm"], env, work)
    assert "llm -- embed -m 3-small" in described.stdout + described.stderr, described
    argv = [*LUCEBOX, "launch", "llm", "--", "embed", "-m", "3-small", "-c", GUITAR]
    done = run(argv, env, work)
    assert done.returncode == 0, done.stderr
    vector = json.loads(done.stdout)
    assert len(vector) == 384  # MiniLM's width: lucebox's embedding model answered
