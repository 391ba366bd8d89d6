"""An embedding model beside a served set, end to end on the CPU: `lucebox serve` of SmolLM2
and a generated tiny llama under the real router, with the real all-MiniLM-L6-v2 in a
llama-server of its own behind the set's one port (past its model gate)."""

from __future__ import annotations

import openai
import pytest

from support.bertgguf import minilm_model
from support.servedset import THIRD_NAME, served_set, third_model
from tests.e2e.test_embeddings_e2e import GUITAR, PARAPHRASE, UNRELATED, cosine, until_answers

pytestmark = pytest.mark.slow


def test_openai_sdk_embeddings_through_a_set_rank_a_paraphrase_first(
    built_engine_home, lucebox_home, tmp_path
):
    sources = ["smollm2", str(third_model(tmp_path))]
    settings = {"embeddings.model": str(minilm_model())}
    with served_set(lucebox_home, sources, settings) as served:
        until_answers(served.url, "/v1/embeddings", {"input": "warm"})
        client = openai.OpenAI(base_url=f"{served.url}/v1", api_key="none")
        listed = {m.id: m for m in client.models.list().data}
        assert {"smollm2", THIRD_NAME} <= set(listed)
        embedder = next(m for m in listed.values() if getattr(m, "type", None) == "embeddings")
        got = client.embeddings.create(model=embedder.id, input=[GUITAR, PARAPHRASE, UNRELATED])
        guitar, paraphrase, unrelated = (item.embedding for item in got.data)
        assert len(guitar) == 384  # MiniLM's width: the side model answered
        assert cosine(guitar, paraphrase) > cosine(guitar, unrelated) + 0.3
        # Past the gate: no chat model was loaded for it.
        assert set(served.router_states().values()) == {"unloaded"}
        (side,) = served.status()["side_models"]
        assert side["role"] == "embeddings" and side["ready"] is True
