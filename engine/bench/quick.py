"""``bench quick``: a fixed prompt set that shows what a configuration does to speed.

Four prompts, each measuring something a user feels: a short chat (time to first token), code
writing (decode), an edit that repeats most of its input (where n-gram speculation pays off),
and a question over a long document (prefill). Greedy decoding so two runs are comparable.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from lucebox.engine.bench.compare import Served
from lucebox.engine.bench.measure import CallSample, streamed_call

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

_CITIES = ["Oslo", "Lima", "Pune", "Graz", "Kobe", "Turin", "Perth", "Quito", "Accra", "Hanoi"]
_ITEMS = ["valves", "cables", "pumps", "filters", "sensors", "gaskets", "motors", "relays"]


def _long_document() -> str:
    """A deterministic shipping log of about 2,500 tokens with one fact asked about."""
    lines = []
    for day in range(1, 91):
        city = _CITIES[(day * 7) % len(_CITIES)]
        item = _ITEMS[(day * 3) % len(_ITEMS)]
        crates = (day * 37) % 90 + 10
        lines.append(f"Day {day}: {crates} crates of {item} shipped from the {city} depot.")
    lines[57] = "Day 58: the Kobe depot shipped 412 crates of titanium bolts, the record."
    return "\n".join(lines)


@dataclass(frozen=True)
class QuickPrompt:
    name: str
    messages: tuple[dict[str, str], ...]
    max_tokens: int


PROMPTS: tuple[QuickPrompt, ...] = (
    QuickPrompt(
        "chat",
        ({"role": "user", "content": "Give me three tips for sleeping better."},),
        96,
    ),
    QuickPrompt(
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
    QuickPrompt(
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
    QuickPrompt(
        "long",
        (
            {
                "role": "user",
                "content": f"{_long_document()}\n\nIn the log above, which depot shipped the "
                "record number of crates, and of what?",
            },
        ),
        48,
    ),
)

WARM_UP = ({"role": "user", "content": "Reply with one word."},)


def run_quick(
    served: Served,
    *,
    max_tokens: int | None = None,
    on_sample: Callable[[str, CallSample], None] = lambda name, sample: None,
) -> dict[str, CallSample]:
    """One warm-up call (not counted), then each prompt once, in order.

    ``max_tokens`` caps every prompt's reply (a smoke run); by default each has its own.
    """
    headers = served.headers()
    base: dict[str, Any] = {"temperature": 0, "seed": 1, **dict(served.config.request_fields)}
    streamed_call(served.url, {**base, "messages": list(WARM_UP), "max_tokens": 1}, headers)
    samples = {}
    for prompt in PROMPTS:
        limit = prompt.max_tokens if max_tokens is None else min(max_tokens, prompt.max_tokens)
        body = {**base, "messages": list(prompt.messages), "max_tokens": limit}
        sample = streamed_call(served.url, body, headers)
        samples[prompt.name] = sample
        on_sample(prompt.name, sample)
    return samples


def sample_json(sample: CallSample) -> dict[str, Any]:
    def rounded(value: float | None, digits: int) -> float | None:
        return None if value is None else round(value, digits)

    return {
        "ttft_s": rounded(sample.ttft_s, 3),
        "decode_tok_s": rounded(sample.decode_tok_s, 1),
        "prefill_tok_s": rounded(sample.prefill_tok_s, 1),
        "prompt_tokens": sample.prompt_tokens,
        "completion_tokens": sample.completion_tokens,
        "draft_tokens": sample.draft_tokens,
        "accepted_tokens": sample.accepted_tokens,
        "acceptance": rounded(sample.acceptance, 3),
        "empty": sample.empty,
    }
