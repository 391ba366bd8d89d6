"""The probe set that speculation is measured with: five requests a coding assistant serves.

A short chat, code writing, an edit that repeats most of a short text (where n-gram speculation
pays off), a rewrite that returns a whole source file of a few hundred lines with one change
(an agent editing a file: the reply copies a long prompt, where n-gram lookup in front of a
model's draft can pay off) and an agent turn that quotes tool output back. The calibration and
`bench quick` both send them, greedy, so two configurations see the same work.

Each probe weighs what it asks for (its ``max_tokens``) in the probes' own mix, and the served
mix takes over once requests came: each served request counts for the probe nearest it in
prompt and reply length (plan/speculation/workload.py). The rewrite is the one probe with both a
long prompt and a long reply, so an agent's file rewrites count for it, not for the short edit
(a short prompt) or an agent turn (a short reply). It asks for 256 tokens: copying runs at a
steady rate after the first lines, and more would give it most of the probes' own mix. Its
prompt is about 2,000 tokens with a real tokenizer: where the served context cannot hold it,
the engine refuses it at once and it counts for no configuration, as any failed probe.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

# PEP 20 (public domain). Small models copy this text reliably, so the edit prompt measures what
# speculation does to a reply that repeats its input, not how well the model edits code.
_EDIT_SOURCE = "\n".join(
    [
        "The Zen of Python, by Tim Peters",
        "",
        "Beautiful is better than ugly.",
        "Explicit is better than implicit.",
        "Simple is better than complex.",
        "Complex is better than complicated.",
        "Flat is better than nested.",
        "Sparse is better than dense.",
        "Readability counts.",
        "Special cases aren't special enough to break the rules.",
        "Although practicality beats purity.",
        "Errors should never pass silently.",
        "Unless explicitly silenced.",
        "In the face of ambiguity, refuse the temptation to guess.",
        "There should be one-- and preferably only one --obvious way to do it.",
        "Although that way may not be obvious at first unless you're Dutch.",
        "Now is better than never.",
        "Although never is often better than *right* now.",
        "If the implementation is hard to explain, it's a bad idea.",
        "If the implementation is easy to explain, it may be a good idea.",
        "Namespaces are one honking great idea -- let's do more of those!",
    ]
)

_REWRITE_KINDS = ("total", "count", "largest", "clamp")
_REWRITE_NOUNS = ("price", "weight", "score", "delay", "width", "depth", "speed", "level", "size")


def _rewrite_function(index: int) -> list[str]:
    """One small function of the rewrite probe's file, ``index`` choosing its shape and names."""
    kind = _REWRITE_KINDS[index % len(_REWRITE_KINDS)]
    noun = _REWRITE_NOUNS[index % len(_REWRITE_NOUNS)]
    limit = 10 + (index * 7) % 90
    start, step = {
        "total": (f"{index % 5}", f"result += item.{noun}"),
        "count": ("0", f"result += item.{noun} > {limit}"),
        "largest": ("None", f"result = max(result or item.{noun}, item.{noun})"),
        "clamp": ("[]", f"result.append(min(item.{noun}, {limit}))"),
    }[kind]
    return [
        f"def {kind}_{noun}_{index}(items):",
        f'    """The {kind} of the {noun} of each item, limit {limit}."""',
        f"    result = {start}",
        "    for item in items:",
        f"        {step}",
        "    return result",
        "",
    ]


def rewrite_source(functions: int = 40) -> str:
    """A Python module of ``functions`` small functions (eight lines each, 323 lines for the
    probe's 40), the same every time: every configuration reads the same prompt."""
    lines = ['"""Helpers over a list of items, generated for a probe."""', "", "LIMIT = 3", ""]
    for index in range(functions):
        lines += ["", *_rewrite_function(index)]
    return "\n".join(lines)


_TOOL_OUTPUT = "\n".join(
    [
        "$ pytest -q tests/test_intervals.py",
        "..F.",
        "=================================== FAILURES ===================================",
        "_____________________________ test_merge_touching ______________________________",
        "",
        "    def test_merge_touching():",
        ">       assert merge([(1, 2), (2, 3)]) == [(1, 3)]",
        "E       assert [(1, 2), (2, 3)] == [(1, 3)]",
        "E         At index 0 diff: (1, 2) != (1, 3)",
        "",
        "tests/test_intervals.py:14: AssertionError",
        "=========================== short test summary info ============================",
        "FAILED tests/test_intervals.py::test_merge_touching - assert [(1, 2), (2, 3)] == [(1, 3)]",
        "1 failed, 3 passed in 0.04s",
    ]
)


@dataclass(frozen=True)
class Probe:
    name: str
    messages: tuple[dict[str, str], ...]
    max_tokens: int


PROBES: tuple[Probe, ...] = (
    Probe(
        "chat",
        ({"role": "user", "content": "Give me three tips for sleeping better."},),
        96,
    ),
    Probe(
        "code",
        (
            {
                "role": "user",
                "content": "Write a Python function that merges overlapping intervals, "
                "with a docstring and two examples.",
            },
        ),
        192,
    ),
    Probe(
        "edit",
        (
            {
                "role": "user",
                "content": "Change 'Beautiful' to 'Pretty' in the third line of this text "
                f"and return the whole text, unchanged otherwise:\n\n{_EDIT_SOURCE}",
            },
        ),
        320,
    ),
    Probe(
        "rewrite",
        (
            {
                "role": "user",
                "content": "Change LIMIT = 3 to LIMIT = 5 in this file and return the whole "
                f"file, unchanged otherwise:\n\n```python\n{rewrite_source()}\n```",
            },
        ),
        256,
    ),
    # An agent's turn after a tool call, as plain messages so every chat template takes it.
    Probe(
        "agent",
        (
            {"role": "user", "content": "Run the interval tests and fix what fails."},
            {"role": "assistant", "content": "Running `pytest -q tests/test_intervals.py`."},
            {
                "role": "user",
                "content": f"Tool output:\n{_TOOL_OUTPUT}\n\nQuote the failure exactly as "
                "the tool printed it, then say in one sentence what to change.",
            },
        ),
        160,
    ),
)


_LONG_WORDS = ("the", "model", "a", "test", "hello", "world")
"""One token each in the real tokenizers served and in the tests' generated vocabulary, so the
long probe's prompt is about as many tokens as it has words (and fits the context)."""


def long_probe(name: str, prompt_words: int, max_tokens: int) -> Probe:
    """A long document of common words and a request to go on: the decode rate after a prompt
    of about ``prompt_words`` tokens, where long-context modes differ. Seeded, so every mode
    reads the same prompt."""
    pick = random.Random(prompt_words).choice
    document = " ".join(pick(_LONG_WORDS) for _ in range(prompt_words))
    return Probe(
        name,
        ({"role": "user", "content": f"{document}\n\nContinue these notes."},),
        max_tokens,
    )
