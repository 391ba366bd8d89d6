"""Side models (embeddings, rerank) planned in what the chat plan leaves."""

from __future__ import annotations

import pytest

from lucebox.engine.core.units import MIB
from lucebox.engine.plan.memory.sizes import CUDA_CONTEXT_BYTES
from lucebox.engine.plan.sidemodels import SideFile, SideHost, compute_bytes, plan_sides

MINILM = SideFile(
    role="embeddings",
    source="minilm.gguf",
    path="/models/minilm.gguf",
    weights_bytes=45 * MIB,
    context_length=512,
    embedding_length=384,
    head_count=12,
    feed_forward_length=1536,
    pooling=1,
)
CPU = SideHost("/bin/llama-server", None, on_gpu=False, gpus="", engine_port=18080)
GPU = SideHost("/bin/llama-server", "/keys/api", on_gpu=True, gpus="1", engine_port=18080)


def test_an_embedding_model_that_fits_gets_its_own_port_pooling_and_batch():
    plan = plan_sides((MINILM,), headroom_bytes=1024 * MIB, host=CPU)
    assert plan.refusal is None
    (side,) = plan.models
    assert side.port == 18081 and side.ctx == 512 and side.pooling == "mean"
    assert side.memory_bytes == 45 * MIB + compute_bytes(MINILM, 512)
    argv = side.argv
    assert argv[argv.index("--pooling") + 1] == "mean" and "--embeddings" in argv
    assert argv[argv.index("-ub") + 1] == "512"  # a whole input in one batch
    assert argv[argv.index("-ngl") + 1] == "0" and "--api-key-file" not in argv


def test_on_a_gpu_it_pays_its_own_cuda_context_and_reads_the_key_file():
    (side,) = plan_sides((MINILM,), headroom_bytes=4096 * MIB, host=GPU).models
    assert side.cuda_context_bytes == CUDA_CONTEXT_BYTES
    assert side.argv[side.argv.index("--api-key-file") + 1] == "/keys/api"
    assert side.gpus == "1"


def test_a_reranker_reranks_on_the_next_port():
    rerank = SideFile(**{**MINILM.__dict__, "role": "rerank", "pooling": 4})
    (side,) = plan_sides((rerank,), headroom_bytes=1024 * MIB, host=CPU).models
    assert side.port == 18082 and "--reranking" in side.argv and "--embeddings" not in side.argv


@pytest.mark.parametrize("host", [CPU, GPU])
def test_without_room_the_side_model_is_refused_and_the_chat_model_keeps_its_memory(host):
    needed = plan_sides((MINILM,), headroom_bytes=1 << 40, host=host).models[0].memory_bytes
    plan = plan_sides((MINILM,), headroom_bytes=needed - 1, host=host)
    assert plan.refusal is not None
    assert "the embeddings model minilm.gguf needs" in plan.refusal.message
    assert "the chat model keeps its memory" in plan.refusal.message
    assert plan_sides((MINILM,), headroom_bytes=needed, host=host).refusal is None
