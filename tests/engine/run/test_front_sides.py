"""The front's side routes: the real MiniLM in a llama-server of its own (the suite's CPU
build) beside the real SmolLM2, behind one front with a key."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from lucebox.engine.run.front.frontsetup import FrontSetup
from lucebox.engine.run.front.sideroute import EMBED_PATHS, SideRoute
from support.bertgguf import minilm_model
from support.engineserver import RunningServer, running_server
from support.frontserver import loopback_policy, running_front
from support.ports import free_port
from tests.conftest import run_lucebox

pytestmark = pytest.mark.slow

KEY = "side-test-key"
AUTH = {"Authorization": f"Bearer {KEY}"}


@pytest.fixture(scope="module")
def servers(built_engine_home: Path) -> Iterator[tuple[RunningServer, RunningServer]]:
    from support.realmodels import smol_model

    found = run_lucebox("engine", "path", env={"LUCEBOX_HOME": str(built_engine_home)})
    assert found.returncode == 0, found.stderr
    server_path = Path(found.stdout.strip())
    embed_args = ["--embeddings", "--pooling", "mean", "--alias", "minilm", "-ub", "512"]
    with (
        running_server(server_path, smol_model(), ["--jinja", "--alias", "smol"]) as chat,
        running_server(server_path, minilm_model(), embed_args, ctx=512) as embed,
    ):
        yield chat, embed


def test_embeddings_are_keyed_relayed_to_their_process_and_listed(servers):
    chat, embed = servers
    route = SideRoute("embeddings", "minilm", embed.url, EMBED_PATHS)
    spec = FrontSetup(loopback_policy(KEY), "smol", 2048, sides=(route,))
    with running_front(spec, chat.url) as front:
        body = {"input": ["a guitar", "a violin"]}
        assert httpx.post(f"{front.url}/v1/embeddings", json=body).status_code == 401
        for path in EMBED_PATHS:  # the OpenAI shape at /v1/embeddings, llama-server's elsewhere
            answer = httpx.post(f"{front.url}{path}", json=body, headers=AUTH, timeout=30)
            assert answer.status_code == 200, (path, answer.text)
        answer = httpx.post(f"{front.url}/v1/embeddings", json=body, headers=AUTH, timeout=30)
        assert len(answer.json()["data"][0]["embedding"]) == 384
        listed = httpx.get(f"{front.url}/v1/models", headers=AUTH).json()["data"]
        assert {"id": "minilm", "type": "embeddings"}.items() <= next(
            m for m in listed if m["id"] == "minilm"
        ).items()
        assert front.front.queue.status().served == 0  # nothing went through the chat queue


def test_a_side_model_that_is_down_is_answered_503_with_its_name(servers):
    chat, _ = servers
    route = SideRoute("embeddings", "minilm", f"http://127.0.0.1:{free_port()}", EMBED_PATHS)
    spec = FrontSetup(loopback_policy(), "smol", 2048, sides=(route,))
    with running_front(spec, chat.url) as front:
        answer = httpx.post(f"{front.url}/v1/embeddings", json={"input": "x"}, timeout=30)
        assert answer.status_code == 503
        assert "the embeddings model minilm is not answering" in answer.json()["error"]["message"]
