"""The bigram construction (``support/bigram.py``) read back from written files: the logits a
target's embedding and output head give, and where its draft disagrees."""

from __future__ import annotations

import gguf
import numpy as np
import pytest

from support.bigram import FIRST_SHARE, TEMPERATURE
from support.ggufgen import partial_pair, qwen3_pair, write_gguf


def next_logits(path) -> np.ndarray:
    """Logits over the vocabulary after each token, from its embedding alone (RMS-normed)."""
    tensors = {t.name: np.asarray(t.data, dtype=np.float64) for t in gguf.GGUFReader(path).tensors}
    embd = tensors["token_embd.weight"]
    normed = embd / np.sqrt((embd**2).mean(axis=1, keepdims=True))
    return normed @ tensors["output.weight"].T


def test_the_target_is_a_bigram_table_sampled_at_its_first_share(tmp_path):
    target, _ = partial_pair()
    logits = next_logits(write_gguf(tmp_path / "target.gguf", target))
    top = np.sort(logits, axis=1)[:, ::-1][:, : target.successors + 1]
    assert (top[:, target.successors] < 1).all()  # only the successors stand out
    shares = np.exp(top[:, : target.successors] / TEMPERATURE)
    shares /= shares.sum(axis=1, keepdims=True)
    assert shares[:, 0] == pytest.approx(FIRST_SHARE, abs=0.01)
    # Greedy decoding walks every active token before it repeats.
    seen, token = [], int(np.argmax(logits[1]))
    for _ in range(target.active_tokens):
        seen.append(token)
        token = int(np.argmax(logits[token]))
    assert len(set(seen)) == target.active_tokens


@pytest.mark.parametrize("agree_share", [1.0, 0.95, 0.6])
def test_the_draft_keeps_the_first_successor_on_its_share(tmp_path, agree_share):
    target, draft = partial_pair(agree_share)
    target_logits = next_logits(write_gguf(tmp_path / "target.gguf", target))
    draft_logits = next_logits(write_gguf(tmp_path / "draft.gguf", draft))
    active = np.unique(np.argmax(target_logits, axis=1))
    same = np.argmax(target_logits[active], axis=1) == np.argmax(draft_logits[active], axis=1)
    assert same.sum() == round(agree_share * target.active_tokens)


def test_too_few_words_for_the_table_is_refused(tmp_path):
    target, _ = qwen3_pair(successors=4)  # 6 words, 48 active tokens wanted
    with pytest.raises(ValueError, match="active tokens"):
        write_gguf(tmp_path / "t.gguf", target)
