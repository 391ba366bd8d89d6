"""Benchmark: at the acceptance real drafts give under sampling, what does each llama-server
speculation mode decode, greedy against temperature 0.7?

The target is a generated bigram table (``support/bigram.py``): greedy decoding is
deterministic, temperature 0.7 samples a genuinely random walk that n-gram lookup cannot
predict, and its qwen3 drafts keep the target's first successor on 0.95 and 0.6 of the table.
Each mode (none, the two drafts with ``draft-simple``, the target's 0.95 MTP head with
``draft-mtp``, ``ngram-mod``, and the 0.95 draft with ``ngram-mod`` in front) serves
``--requests`` completions (a seed each) at each temperature on the raw engine; per mode and
temperature: drafted and accepted tokens, acceptance, and decode speed (the engine's
``predicted_per_second``, median over the requests).

    python -m benchmarks.sampled_acceptance [--server PATH] [--models DIR] [--n-predict 128]
        [--requests 3] [--json]

Without --models it writes the tiny CPU pair (support.ggufgen.partial_pair) into the test
cache; with it, the ``partial`` set of benchmarks/lucebox_models.py (the GPU sizes) in DIR.
Uses the CPU engine built in the test cache unless --server names one; on a GPU every layer
of both models is offloaded.
"""

from __future__ import annotations

import argparse
import json
import shlex
import statistics
import sys
from dataclasses import replace
from pathlib import Path
from typing import Any

from benchmarks.spec_breakeven import server_path
from support.bigram import DRAFT_SHARE
from support.engineserver import running_server, spec_args
from support.ggufgen import cached_gguf, partial_pair, qwen35_target

PROMPT = "hello world the model test hello world"
TEMPERATURES = (0.0, 0.7)
FILES = (("target", ""), ("high", "-draft"), ("low", "-draft60"), ("mtp", "-mtp"))
"""The ``partial`` set of benchmarks/lucebox_models.py: each role's file name suffix."""


def model_paths(models: Path | None) -> dict[str, Path]:
    """The target, its 0.95 and 0.6 drafts, and the target with a 0.95 MTP head."""
    if models is not None:
        return {role: models / f"qwen35-tiny-partial{suffix}.gguf" for role, suffix in FILES}
    target, high = partial_pair()
    mtp = qwen35_target(successors=target.successors, vocab_size=target.vocab_size)
    return {
        "target": cached_gguf(target),
        "high": cached_gguf(high),
        "low": cached_gguf(partial_pair(0.6)[1]),
        "mtp": cached_gguf(replace(mtp, agree_share=DRAFT_SHARE)),
    }


def modes(paths: dict[str, Path]) -> dict[str, tuple[Path, list[str]]]:
    """Each mode's target and llama-server flags (both models on the GPU where there is one)."""
    offload = ["--spec-draft-ngl", "99"]
    target, high = paths["target"], paths["high"]
    return {
        "none": (target, []),
        "draft-0.95": (target, [*spec_args("draft-simple", high), *offload]),
        "draft-0.6": (target, [*spec_args("draft-simple", paths["low"]), *offload]),
        "mtp-0.95": (paths["mtp"], spec_args("draft-mtp", draft_max=3)),
        "ngram-mod": (target, spec_args("ngram-mod")),
        "ngram-mod+draft-0.95": (target, [*spec_args("ngram-mod,draft-simple", high), *offload]),
    }


def measure(server: Path, model: Path, args: list[str], n_predict: int, requests: int) -> list:
    """One row a temperature: drafted, accepted, acceptance and decode speed."""
    rows = []
    with running_server(server, model, [*args, "-ngl", "99"], ctx=4096, ready_timeout_s=600) as s:
        for temperature in TEMPERATURES:
            timings = [
                s.complete(PROMPT, n_predict, temperature=temperature, seed=seed)["timings"]
                for seed in range(1, requests + 1)
            ]
            drafted = sum(t.get("draft_n", 0) for t in timings)
            accepted = sum(t.get("draft_n_accepted", 0) for t in timings)
            generated = sum(t["predicted_n"] for t in timings)
            speeds = [t["predicted_per_second"] for t in timings]
            rows.append({
                "temperature": temperature,
                "drafted": drafted,
                "accepted": accepted,
                "acceptance": round(accepted / drafted, 3) if drafted else None,
                "accepted_per_token": round(accepted / generated, 3),
                "decode_tok_s": round(statistics.median(speeds), 1),
            })  # fmt: skip
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--server", type=Path, default=None)
    parser.add_argument("--models", type=Path, default=None)
    parser.add_argument("--n-predict", type=int, default=128)
    parser.add_argument("--requests", type=int, default=3)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    args.server = server_path(args.server)
    command = shlex.join(["python", "-m", "benchmarks.sampled_acceptance", *sys.argv[1:]])
    result: dict[str, Any] = {"command": command, "modes": {}}
    for name, (target, flags) in modes(model_paths(args.models)).items():
        rows = measure(args.server, target, flags, args.n_predict, args.requests)
        result["modes"][name] = rows
        if not args.json:
            for row in rows:
                print(name, json.dumps(row), flush=True)
    if args.json:
        print(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
