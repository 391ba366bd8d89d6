"""Write the generated models the Lucebox engine (dflash_server) is measured with on the GPU.

A ``qwen35`` target whose shapes the engine's kernels take (head size 256, delta-net value
heads of 128, block count a multiple of the full-attention interval) with the real Qwen3.5/3.6
vocabulary size: the engine takes the DFlash mask token (id 248070) from the target, so a
smaller vocabulary fails at the first draft. Beside it a Lucebox-format draft
(``qwen35-dflash-draft``) for it, the same target with an MTP block, which the engine's loader
is expected to refuse (its block count is no longer a multiple of the interval), and a qwen3
model standing in for PFlash's prefill drafter.
Random weights, but the target and its draft agree (``agree_token``): the target always decodes
"hello" and the draft predicts it, so DFlash and DDTree accept their drafts as a well-matched
real pair would, and the measured speed-up is the engine's best case on this card.
The ``partial`` set is the same target as a bigram table (``support/bigram.py``) with qwen3
draft models for llama-server's ``draft-simple`` that keep its first successor on 0.95 and
0.6 of the table (greedy acceptance about 0.9 and 0.4, at temperature 0.7 about 0.45 and
0.25), and the target with an MTP head of share 0.95. No Lucebox-format draft: a DFlash
draft predicts a block from mask tokens and the target's features at every context position,
and only attention weights built for it could pick out the last token that a bigram needs.

Usage: python3 benchmarks/lucebox_models.py OUT_DIR [all|pair|pflash|partial]  (prints the paths)
"""

from __future__ import annotations

import dataclasses
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from support.bigram import DRAFT_SHARE
from support.ggufgen import (
    HybridSpec,
    LuceboxDFlashSpec,
    ModelSpec,
    draft_model_for,
    write_llama,
    write_lucebox_dflash,
    write_qwen35,
)

QWEN35_VOCAB = 248_320
TARGET = HybridSpec(
    name="Qwen3.5 Tiny Instruct",
    basename="qwen3.5-tiny",
    n_layer=8,
    n_embd=1024,
    n_head=8,
    n_head_kv=2,
    head_dim=256,
    n_ff=2048,
    n_ctx=262_144,
    rope_dims=64,
    rope_sections=(11, 11, 10, 0),
    full_attention_interval=4,
    ssm_conv_kernel=4,
    ssm_state_size=128,
    ssm_group_count=4,
    ssm_time_step_rank=8,
    nextn_layers=0,
    vocab_size=QWEN35_VOCAB,
    agree_token="hello",
)
DRAFT = LuceboxDFlashSpec(
    name="Qwen3.5-Tiny-DFlash",
    n_layer=2,
    n_embd=TARGET.n_embd,
    n_head=8,
    n_head_kv=2,
    head_dim=128,
    n_ff=2048,
    n_target_layers=5,
    block_size=16,
    mask_token_id=248_070,
    vocab_size=QWEN35_VOCAB,
    seed=1,
    agree_token="hello",
)
"""The engine's qwen35 target captures 5 layers for the draft whatever the draft says (evenly
spaced, ``1 + k * (n_layer - 2) / 4``): a draft reading 2 failed its first feature copy with
"ring copy failed ... fc_in=2048" and a CUDA abort (measured on the H100)."""

PARTIAL_TARGET = dataclasses.replace(
    TARGET,
    name="Qwen3.5 Tiny Bigram Instruct",
    basename="qwen3.5-tiny-bigram",
    agree_token=None,
    successors=4,
    active_tokens=512,
)
"""The target as a bigram table over 512 tokens: a greedy reply repeats only after 512 tokens."""
PARTIAL_DRAFTS = {
    "qwen35-tiny-partial-draft.gguf": draft_model_for(PARTIAL_TARGET, agree_share=DRAFT_SHARE),
    "qwen35-tiny-partial-draft60.gguf": draft_model_for(PARTIAL_TARGET, agree_share=0.6),
}
"""One-layer qwen3 drafts 512 wide (head size 128) with the target's vocabulary."""
PARTIAL_MTP_TARGET = dataclasses.replace(
    PARTIAL_TARGET, nextn_layers=1, agree_share=DRAFT_SHARE, name="Qwen3.5 Tiny Bigram MTP"
)
"""The bigram target with an MTP head that keeps its first successor on 0.95 of the table
(``draft-mtp`` on llama-server; the Lucebox engine refuses its block count)."""

PREFILL_DRAFTER = ModelSpec(
    arch="qwen3",
    name="Qwen3 Tiny Drafter",
    basename="qwen3-tiny",
    n_layer=2,
    n_embd=1024,
    n_head=8,
    n_head_kv=2,
    head_dim=128,
    n_ff=2048,
    n_ctx=40_960,
    vocab_size=QWEN35_VOCAB,
    seed=2,
    quant="BF16",
)
"""PFlash's prefill drafter stands in for Qwen3-0.6B (arch qwen3, BF16 as the real file: on a
BF16-capable card the engine's qwen3 loader converts only from BF16, so an F16 file failed
with "one or more Qwen3-0.6B tensors failed to load" on the H100)."""


def written(path: Path, write: Callable[[Path, Any], Path], spec: Any) -> Path:
    """Writes ``path`` once: through a part file renamed at the end, so a write that a call's
    end cut off is never taken for a whole model by the next call on the same warm machine."""
    if not path.is_file():
        part = path.with_name(path.name + ".part")
        write(part, spec)
        part.rename(path)
    return path


def main(out_dir: Path, which: str) -> None:
    """``pair``: the target and its draft; ``pflash``: the target and PFlash's prefill drafter;
    ``all``: the target, its draft, the MTP target and the drafter; ``partial``: the bigram
    target and its drafts."""
    out_dir.mkdir(parents=True, exist_ok=True)
    wanted: list[tuple[str, Callable[[Path, Any], Path], Any]] = []
    if which == "partial":
        wanted.append(("qwen35-tiny-partial.gguf", write_qwen35, PARTIAL_TARGET))
        wanted += [(name, write_llama, spec) for name, spec in PARTIAL_DRAFTS.items()]
        wanted.append(("qwen35-tiny-partial-mtp.gguf", write_qwen35, PARTIAL_MTP_TARGET))
    else:
        wanted.append(("qwen35-tiny.gguf", write_qwen35, TARGET))
    if which in ("pair", "all"):
        wanted.append(("qwen35-tiny-dflash.gguf", write_lucebox_dflash, DRAFT))
    if which == "all":
        wanted.append(
            ("qwen35-tiny-mtp.gguf", write_qwen35, dataclasses.replace(TARGET, nextn_layers=1))
        )
    if which in ("pflash", "all"):
        wanted.append(("qwen3-tiny-drafter.gguf", write_llama, PREFILL_DRAFTER))
    for name, write, spec in wanted:
        print(written(out_dir / name, write, spec))


if __name__ == "__main__":
    chosen = sys.argv[2] if len(sys.argv) > 2 else "all"
    if len(sys.argv) < 2 or chosen not in ("all", "pair", "pflash", "partial"):
        sys.exit("usage: python3 benchmarks/lucebox_models.py OUT_DIR [all|pair|pflash|partial]")
    main(Path(sys.argv[1]), chosen)
