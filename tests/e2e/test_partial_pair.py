"""Generated pairs with realistic acceptance (``support/bigram.py``) in the real CPU engine:
llama-server's own counters show a draft model, and a hybrid target's MTP head, accepted as
their share says under greedy decoding, much less at temperature 0.7, and n-gram lookup
accepting almost nothing of the sampled text."""

from __future__ import annotations

import functools
from pathlib import Path

import pytest

from support.bigram import DRAFT_SHARE
from support.engineserver import running_server, spec_args
from support.ggufgen import cached_gguf, partial_pair, qwen35_target
from tests.conftest import run_lucebox

pytestmark = pytest.mark.slow

PROMPT = "hello world the model test hello world"
N_PREDICT = 128
SEEDS = (1, 2, 3)


@pytest.fixture(scope="module")
def server_path(built_engine_home: Path) -> Path:
    path = run_lucebox("engine", "path", env={"LUCEBOX_HOME": str(built_engine_home)})
    assert path.returncode == 0, path.stderr
    return Path(path.stdout.strip())


def counts(
    server_path: Path, args: list[str], temperature: float, target: Path | None = None
) -> tuple[int, int, int]:
    """Drafted, accepted and generated tokens over ``SEEDS`` of ``target`` (the pair's by
    default) served with ``args``."""
    drafted = accepted = generated = 0
    target = target or cached_gguf(partial_pair()[0])
    with running_server(server_path, target, args) as server:
        for seed in SEEDS:
            reply = server.complete(PROMPT, N_PREDICT, temperature=temperature, seed=seed)
            drafted += reply["timings"].get("draft_n", 0)
            accepted += reply["timings"].get("draft_n_accepted", 0)
            generated += reply["timings"]["predicted_n"]
    return drafted, accepted, generated


@functools.cache  # the default share's greedy figures serve two tests
def acceptance(server_path: Path, mode: str, agree_share: float, temperature: float) -> float:
    """Accepted over drafted tokens: the pair's draft model of ``agree_share``
    (``draft-simple``), or the MTP head of a hybrid target of that share (``draft-mtp``)."""
    if mode == "draft-mtp":
        target = cached_gguf(qwen35_target(successors=4, vocab_size=512, agree_share=agree_share))
        args = spec_args(mode, draft_max=3)
    else:
        target = cached_gguf(partial_pair()[0])
        args = spec_args(mode, cached_gguf(partial_pair(agree_share)[1]))
    drafted, accepted, _ = counts(server_path, args, temperature, target)
    assert drafted > 0
    return accepted / drafted


@pytest.mark.parametrize("mode", ["draft-simple", "draft-mtp"])
def test_sampling_lowers_the_acceptance_of_a_partial_draft(server_path, mode):
    assert acceptance(server_path, mode, DRAFT_SHARE, 0) >= 0.8
    assert acceptance(server_path, mode, DRAFT_SHARE, 0.7) <= 0.6


@pytest.mark.parametrize("mode", ["draft-simple", "draft-mtp"])
def test_the_share_sets_the_greedy_acceptance(server_path, mode):
    lower = acceptance(server_path, mode, 0.6, 0)
    assert lower <= acceptance(server_path, mode, DRAFT_SHARE, 0) - 0.3


@pytest.mark.parametrize("mode", ["ngram-simple", "ngram-mod"])
def test_ngram_lookup_predicts_little_of_the_sampled_text(server_path, mode):
    """Accepted over generated tokens: lookup may draft nothing at all."""
    _, accepted, generated = counts(server_path, spec_args(mode), 0.7)
    assert accepted <= 0.1 * generated
    _, accepted, generated = counts(server_path, spec_args(mode), 0)
    assert accepted >= 0.5 * generated  # the greedy walk repeats: lookup does predict it
