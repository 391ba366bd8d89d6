"""Model guards: every file is checked before the engine sees it, and each refusal says why.

Problem codes are stable strings (docs/contracts.md): scripts and the TUI key on them. A guard that
would need an unknown fact (the engine's architecture list before any engine or source is
present) does not guess; it leaves the check out and says so in the result.

``check_model`` stays one function: it runs the checks in the order a user reads the problems.
"""

from __future__ import annotations

import re
from pathlib import Path

from lucebox.engine.core.units import gib_text
from lucebox.engine.models.checkresult import CheckResult, Problem, Severity, verdict_of
from lucebox.engine.models.draftguard import (
    LUCEBOX_DFLASH_ARCH,
    draft_only_kind,
    draft_only_problem,
    other_engine_problem,
    pair_problems,
)
from lucebox.engine.models.gguf import GgufFormatError
from lucebox.engine.models.headerinfo import ModelInfo, inspect_model

INCOMPLETE_SUFFIXES = (".part", ".incomplete", ".download", ".crdownload", ".aria2", ".tmp")
"""Markers downloaders leave beside (or instead of) a file that is still being written."""


_SHARD = re.compile(r"^(?P<stem>.+)-(?P<no>\d{5})-of-(?P<count>\d{5})\.gguf$")


def shard_names(filename: str) -> list[str]:
    """Every shard of a split model named like NAME-00001-of-0000N.gguf (any folder prefix
    kept); a file that is not a shard is its own only member."""
    name = filename.rsplit("/", 1)[-1]
    match = _SHARD.match(name)
    if match is None:
        return [filename]
    count = int(match["count"])
    folder = filename[: -len(name)]
    return [f"{folder}{match['stem']}-{n:05d}-of-{count:05d}.gguf" for n in range(1, count + 1)]


def model_name(filename: str) -> str:
    """A model's name: the file's stem without the split suffix."""
    name = filename.rsplit("/", 1)[-1]
    match = _SHARD.match(name)
    return match["stem"] if match else name.removesuffix(".gguf")


_INSTRUCT_WORDS = re.compile(
    r"(^|[-_ .])(it|instruct|chat|sft|dpo|rlhf|assistant|thinking|reasoning)([-_ .]|$)", re.I
)
_BASE_WORDS = re.compile(r"(^|[-_ .])(base|pretrain|pretrained|pt)([-_ .]|$)", re.I)
_QUANT_SUFFIX = re.compile(r"[-_.](i?q\d\w*|f16|f32|bf16|fp16)$", re.I)
# Official base releases whose instruct twin carries a suffix (-it, -Instruct, -Chat):
# a file named exactly like the base release is the base model.
_KNOWN_BASE_NAMES = (
    re.compile(r"^gemma-?\d+n?(-[\d.]+[bm])(-e\d+b)?$"),
    re.compile(r"^(meta-)?llama-?\d(\.\d)?-[\d.]+b$"),
    re.compile(r"^qwen\d(\.\d)?-[\d.]+b$"),
    re.compile(r"^mistral-[\d.]+b(-v\d(\.\d)?)?$"),
    re.compile(r"^phi-?\d(\.\d)?(-mini|-medium|-small)?$"),
)


def incomplete_marker(path: Path) -> Path | None:
    """A partial-download marker for ``path`` (also for a Hugging Face cache blob)."""
    if path.name.endswith(INCOMPLETE_SUFFIXES):
        return path
    candidates = [path]
    if path.is_symlink():
        candidates.append(path.resolve())
    for candidate in candidates:
        for suffix in INCOMPLETE_SUFFIXES:
            marker = candidate.with_name(candidate.name + suffix)
            if marker.exists():
                return marker
    return None


def _normalised_names(info: ModelInfo, path: Path) -> list[str]:
    names = []
    if info.name:
        names.append(info.name)
    if info.basename and info.size_label:
        names.append(f"{info.basename}-{info.size_label}")
    stem = model_name(path.name)
    while _QUANT_SUFFIX.search(stem):
        stem = _QUANT_SUFFIX.sub("", stem)
    names.append(stem)
    return [re.sub(r"[\s_]+", "-", n.strip().lower()) for n in names]


def base_model_reason(info: ModelInfo, path: Path) -> str | None:
    """Why this looks like a base (pretrained, not instruction-tuned) model, or None."""
    finetune = (info.finetune or "").strip()
    names = _normalised_names(info, path)
    if any(_INSTRUCT_WORDS.search(n) for n in [finetune, *names]):
        return None
    if finetune and _BASE_WORDS.search(finetune):
        return f"its metadata says general.finetune = '{finetune}'"
    for name in names:
        if _BASE_WORDS.search(name):
            return f"its name '{name}' marks a base/pretrained model"
        if any(pattern.match(name) for pattern in _KNOWN_BASE_NAMES):
            return (
                f"'{name}' is the name of a base release; its instruct twin carries a suffix "
                "such as -it or -Instruct"
            )
    return None


def _shard_problems(path: Path, info: ModelInfo) -> list[Problem]:
    match = _SHARD.match(path.name)
    count = info.split_count or 0
    if count <= 1:
        return []
    if match is None:
        return [
            Problem(
                "missing-shard",
                "error",
                f"{path.name} is shard {info.split_no} of {count}, but its name does not "
                "follow NAME-00001-of-0000N.gguf, so the other shards cannot be found",
            )
        ]
    problems = []
    for number, name in enumerate(shard_names(path.name), start=1):
        shard = path.with_name(name)
        if not shard.exists():
            problems.append(
                Problem(
                    "missing-shard",
                    "error",
                    f"shard {number} of {count} ({shard.name}) is missing: "
                    "download it next to the others",
                )
            )
            continue
        if shard == path:
            continue
        try:
            shard_info = inspect_model(shard)
        except (GgufFormatError, OSError) as exc:
            problems.append(
                Problem(
                    "missing-shard",
                    "error",
                    f"shard {shard.name} is unreadable ({exc}): download it again",
                )
            )
            continue
        if shard_info.actual_size_bytes < shard_info.expected_size_bytes:
            present = 100 * shard_info.actual_size_bytes / shard_info.expected_size_bytes
            problems.append(
                Problem(
                    "missing-shard",
                    "error",
                    f"shard {shard.name} is incomplete ({present:.1f}% present): download it again",
                )
            )
    return problems


def check_model(
    path: Path,
    *,
    allow_base: bool = False,
    template_supplied: bool = False,
    known_archs: tuple[str, ...] | None = None,
    instruct_guard: bool = True,
) -> CheckResult:
    """Inspect one model file and run every single-file guard on it."""
    inspected = _inspect(path)
    if isinstance(inspected, CheckResult):
        return inspected
    info, problems = inspected
    draft_kind = draft_only_kind(info, path) if instruct_guard else None
    if draft_kind is not None:
        problems.append(draft_only_problem(info, draft_kind))
    elif instruct_guard:
        problems += _instruct_problems(info, path, allow_base, template_supplied)
    arch_problems, notes = _arch_problems(info, known_archs, draft_kind)
    problems += arch_problems
    return CheckResult(str(path), verdict_of(problems), tuple(problems), info, notes)


def _inspect(path: Path) -> CheckResult | tuple[ModelInfo, list[Problem]]:
    """The file's header and what is wrong with the file itself (missing, cut off, damaged,
    a shard missing); a refusal when there is no header to read."""
    problems: list[Problem] = []
    if not path.exists():
        problem = Problem("not-found", "error", f"{path} does not exist: check the path")
        return CheckResult(str(path), "refuse", (problem,), None)
    if path.is_dir():
        problem = Problem("not-found", "error", f"{path} is a folder: give the .gguf file in it")
        return CheckResult(str(path), "refuse", (problem,), None)
    marker = incomplete_marker(path)
    if marker is not None:
        problems.append(
            Problem(
                "incomplete-download",
                "error",
                f"{marker.name} shows a download still in progress or cut off: "
                "finish or restart the download before using it",
            )
        )
    try:
        info = inspect_model(path)
    except GgufFormatError as exc:
        hint = {
            "not-gguf": "this is not a GGUF model; lucebox serves .gguf files",
            "truncated": "the file is cut off: download it again",
            "corrupt-header": "the file is damaged: download it again",
        }[exc.code]
        problems.append(Problem(exc.code, "error", f"{exc.message}: {hint}"))
        return CheckResult(str(path), "refuse", tuple(problems), None)
    except OSError as exc:
        problems.append(Problem("not-found", "error", f"cannot read {path}: {exc.strerror}"))
        return CheckResult(str(path), "refuse", tuple(problems), None)

    if info.actual_size_bytes < info.expected_size_bytes:
        present = 100 * info.actual_size_bytes / info.expected_size_bytes
        problems.append(
            Problem(
                "truncated",
                "error",
                f"the file has {info.actual_size_bytes:,} of {info.expected_size_bytes:,} bytes "
                f"({present:.1f}% present; {gib_text(info.actual_size_bytes, 2)} of "
                f"{gib_text(info.expected_size_bytes, 2)}): download it again",
            )
        )
    problems += _shard_problems(path, info)
    return info, problems


def _instruct_problems(
    info: ModelInfo, path: Path, allow_base: bool, template_supplied: bool
) -> list[Problem]:
    """No chat template, or a base model: refused unless --allow-base makes them warnings."""
    problems: list[Problem] = []
    severity: Severity = "warning" if allow_base else "error"
    escape = "" if allow_base else "; pass --allow-base to serve it anyway"
    if not info.has_chat_template and not template_supplied:
        problems.append(
            Problem(
                "no-chat-template",
                severity,
                "the file has no chat template, so the engine would silently fall back to "
                f"ChatML and the replies turn to gibberish: use the instruct release{escape}",
            )
        )
    reason = base_model_reason(info, path)
    if reason is not None:
        problems.append(
            Problem(
                "base-model",
                severity,
                f"this looks like a base model ({reason}); base models continue text instead "
                f"of answering: use the instruct release{escape}",
            )
        )
    return problems


def _arch_problems(
    info: ModelInfo, known_archs: tuple[str, ...] | None, draft_kind: str | None
) -> tuple[list[Problem], tuple[str, ...]]:
    """An architecture the engine does not know, or one another engine serves; the note when
    no engine's architectures are known."""
    problems: list[Problem] = []
    notes: list[str] = []
    foreign = other_engine_problem(info)
    if known_archs is None:
        notes.append("architecture not checked: no engine built and no engine source unpacked")
    elif info.architecture not in known_archs and foreign is None:
        problem_text = f"the engine does not know architecture '{info.architecture}'"
        if info.architecture == LUCEBOX_DFLASH_ARCH:
            problem_text += " (a draft for the Lucebox dflash_server, not for llama-server)"
        problems.append(
            Problem(
                "unsupported-arch",
                "error",
                f"{problem_text}: pick a model of a supported architecture or a newer engine",
            )
        )
    if foreign is not None and draft_kind is None:
        problems.append(foreign)
    return problems, tuple(notes)


def check_pair(
    draft_path: Path,
    target_path: Path,
    *,
    known_archs: tuple[str, ...] | None = None,
    spec_types: tuple[str, ...] | None = None,
    allow_base: bool = False,
) -> tuple[CheckResult, CheckResult]:
    """Check a draft against its target; the draft's result carries the speculative type."""
    target = check_model(target_path, allow_base=allow_base, known_archs=known_archs)
    draft = check_model(draft_path, known_archs=known_archs, instruct_guard=False)
    if draft.info is None or target.info is None:
        return draft, target
    problems = list(draft.problems)
    spec_type, mismatches = pair_problems(draft.info, target.info, draft_path, target_path)
    problems += mismatches
    if spec_type is not None and spec_types is not None and spec_type not in spec_types:
        problems.append(
            Problem(
                "draft-arch-mismatch",
                "error",
                f"the engine cannot run {spec_type}: build a newer engine",
            )
        )
    return (
        CheckResult(
            draft.path, verdict_of(problems), tuple(problems), draft.info, draft.notes, spec_type
        ),
        target,
    )
