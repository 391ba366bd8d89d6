"""Draft guards: which files are drafts (and for which engine), and whether a draft fits its
target; each refusal with the same stable codes as the model guards."""

from __future__ import annotations

from pathlib import Path

from lucebox.engine.models.checkresult import Problem
from lucebox.engine.models.gguf import token_texts_digest
from lucebox.engine.models.headerinfo import ModelInfo

SPEC_VOCAB_MAX_SIZE_DIFFERENCE = 128
SPEC_VOCAB_CHECK_START_TOKEN_ID = 5
"""The engine's own draft-simple rules (common/speculative.cpp, contract 4.4)."""
LUCEBOX_DFLASH_ARCH = "qwen35-dflash-draft"
OTHER_ENGINE_DRAFT_ARCHS = {
    LUCEBOX_DFLASH_ARCH: "the Lucebox engine (dflash_server)",
    "dflash-draft": "the Lucebox engine (dflash_server)",
    "gemma4-dflash-draft": "the Lucebox engine (dflash_server)",
}
"""Draft architectures made for another engine: llama-server cannot load them."""
DRAFT_ONLY_ARCHS = {"dflash": "a DFlash draft", "gemma4-assistant": "a Gemma 4 MTP assistant"}
"""Architectures that are drafts by nature: they speculate for a target, never serve alone."""


def draft_only_kind(info: ModelInfo, path: Path) -> str | None:
    """What kind of draft a file is when it can only speak for a target; None for a model."""
    if info.architecture in DRAFT_ONLY_ARCHS:
        return DRAFT_ONLY_ARCHS[info.architecture]
    if info.architecture in OTHER_ENGINE_DRAFT_ARCHS:
        return f"a draft for {OTHER_ENGINE_DRAFT_ARCHS[info.architecture]}"
    if info.has_mtp_layers and Path(path).name.lower().startswith("mtp-"):
        return "an MTP head published apart from its model"
    return None


def other_engine_problem(info: ModelInfo) -> Problem | None:
    """A draft made for another engine, refused by name."""
    engine = OTHER_ENGINE_DRAFT_ARCHS.get(info.architecture)
    if engine is None:
        return None
    return Problem(
        "draft-arch-mismatch",
        "error",
        f"architecture '{info.architecture}' is a draft for {engine}, not for llama-server: "
        "serve the pair with --engine lucebox (NVIDIA GPUs), or for llama-server use an "
        "upstream DFlash draft (architecture 'dflash', made with convert_hf_to_gguf.py "
        "--target-model-dir) or let lucebox pick n-gram or MTP speculation",
    )


def draft_only_problem(info: ModelInfo, draft_kind: str) -> Problem:
    """A draft given as the served model: it needs a target."""
    engine = (
        " --engine lucebox (the Lucebox engine: llama-server cannot use it)"
        if info.architecture in OTHER_ENGINE_DRAFT_ARCHS
        else ""
    )
    return Problem(
        "draft-only",
        "error",
        f"this is {draft_kind} ('{info.architecture}'): a draft, it needs a target "
        f"model; serve the target with --model and give this file as --draft{engine}",
    )


def pair_problems(
    draft: ModelInfo, target: ModelInfo, draft_path: Path, target_path: Path
) -> tuple[str | None, list[Problem]]:
    """The speculative type the pair would use, and what keeps the draft from its target."""
    if draft.architecture in OTHER_ENGINE_DRAFT_ARCHS:
        return None, []  # check_model already refused it by name
    if draft.draft_kind in ("draft-dflash", "draft-dspark"):
        problems = []
        layers = target.block_count or 0
        too_deep = [layer for layer in draft.target_layers or () if layer >= layers]
        if too_deep:
            problems.append(
                Problem(
                    "draft-arch-mismatch",
                    "error",
                    f"the draft reads target layers {list(too_deep)}, but the target has only "
                    f"{layers} layers: this draft was made for another target model",
                )
            )
        if (
            draft.embedding_length
            and target.embedding_length
            and (draft.embedding_length != target.embedding_length)
        ):
            problems.append(
                Problem(
                    "draft-arch-mismatch",
                    "error",
                    f"the draft's hidden size {draft.embedding_length} differs from the target's "
                    f"{target.embedding_length}: this draft was made for another target model",
                )
            )
        return draft.draft_kind, problems
    if draft.draft_kind == "draft-mtp":
        if draft.embedding_length != target.embedding_length:
            return "draft-mtp", [
                Problem(
                    "draft-arch-mismatch",
                    "error",
                    f"the MTP layers' width {draft.embedding_length} differs from the target's "
                    f"{target.embedding_length}: the engine would abort",
                )
            ]
        return "draft-mtp", []
    return "draft-simple", _vocab_problems(draft, target, draft_path, target_path)


def _vocab_problems(
    draft: ModelInfo, target: ModelInfo, draft_path: Path, target_path: Path
) -> list[Problem]:
    reasons = []
    if draft.tokenizer_model != target.tokenizer_model:
        reasons.append(f"tokenizer '{draft.tokenizer_model}' vs '{target.tokenizer_model}'")
    if (draft.add_bos_token, draft.bos_token_id) != (target.add_bos_token, target.bos_token_id):
        reasons.append(f"BOS token {draft.bos_token_id} vs {target.bos_token_id}")
    if (draft.add_eos_token, draft.eos_token_id) != (target.add_eos_token, target.eos_token_id):
        reasons.append(f"EOS token {draft.eos_token_id} vs {target.eos_token_id}")
    draft_vocab, target_vocab = draft.vocab_size or 0, target.vocab_size or 0
    if abs(draft_vocab - target_vocab) > SPEC_VOCAB_MAX_SIZE_DIFFERENCE:
        reasons.append(f"vocab size {draft_vocab} vs {target_vocab}")
    elif draft.tokenizer_fingerprint != target.tokenizer_fingerprint:
        stop = min(draft_vocab, target_vocab)
        start = SPEC_VOCAB_CHECK_START_TOKEN_ID
        if token_texts_digest(draft_path, start, stop) != token_texts_digest(
            target_path, start, stop
        ):
            reasons.append(f"different token texts among ids {start}..{stop - 1}")
    if not reasons:
        return []
    return [
        Problem(
            "draft-vocab-mismatch",
            "error",
            "the draft's vocabulary does not match the target's (" + "; ".join(reasons) + "), so "
            "the engine would refuse to speculate: use a draft of the same model family",
        )
    ]
