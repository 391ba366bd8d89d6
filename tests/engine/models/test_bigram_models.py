"""The bigram construction (``support/bigram.py``) read back from written files: the logits a
target's embedding and output head give, and where its draft disagrees."""

from __future__ import annotations

from dataclasses import replace

import gguf
import numpy as np
import pytest

from support.bigram import FIRST_SHARE, TEMPERATURE
from support.ggufgen import partial_pair, qwen3_pair, qwen35_target, write_gguf


def read(path) -> dict[str, np.ndarray]:
    return {t.name: np.asarray(t.data, dtype=np.float64) for t in gguf.GGUFReader(path).tensors}


def rms_normed(rows: np.ndarray) -> np.ndarray:
    return rows / np.sqrt((rows**2).mean(axis=1, keepdims=True))


def next_logits(path) -> np.ndarray:
    """Logits over the vocabulary after each token, from its embedding alone (RMS-normed)."""
    tensors = read(path)
    return rms_normed(tensors["token_embd.weight"]) @ tensors["output.weight"].T


def mtp_logits(path) -> np.ndarray:
    """The MTP head's logits after each token: its input projection of the normed embedding
    (the hidden half left out), normed, through the shared output head."""
    tensors = read(path)
    (eh_proj,) = [v for k, v in tensors.items() if k.endswith("nextn.eh_proj.weight")]
    embd = rms_normed(tensors["token_embd.weight"])
    return rms_normed(embd @ eh_proj[:, : embd.shape[1]].T) @ tensors["output.weight"].T


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
    assert agreeing(target_logits, draft_logits) == round(agree_share * target.active_tokens)


@pytest.mark.parametrize("agree_share", [1.0, 0.6])
def test_the_mtp_head_keeps_the_first_successor_on_its_share(tmp_path, agree_share):
    target = qwen35_target(successors=4, vocab_size=512, agree_share=agree_share)
    path = write_gguf(tmp_path / "target.gguf", target)
    full = next_logits(write_gguf(tmp_path / "full.gguf", replace(target, agree_share=1.0)))
    assert np.array_equal(next_logits(path), full)  # the share is the head's alone
    assert agreeing(full, mtp_logits(path)) == round(agree_share * target.active_tokens)


def agreeing(target_logits: np.ndarray, draft_logits: np.ndarray) -> int:
    """On how many active tokens the two heads' first successors agree."""
    active = np.unique(np.argmax(target_logits, axis=1))
    same = np.argmax(target_logits[active], axis=1) == np.argmax(draft_logits[active], axis=1)
    return int(same.sum())


def test_too_few_words_for_the_table_is_refused(tmp_path):
    target, _ = qwen3_pair(successors=4)  # 6 words, 48 active tokens wanted
    with pytest.raises(ValueError, match="active tokens"):
        write_gguf(tmp_path / "t.gguf", target)
