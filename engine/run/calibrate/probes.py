"""The probe set that speculation is measured with: four requests a coding assistant serves.

A short chat, code writing, an edit that repeats most of its input (where n-gram speculation
pays off) and an agent turn that quotes tool output back. The calibration and
`bench quick` both send them, greedy, so two configurations see the same work.
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
