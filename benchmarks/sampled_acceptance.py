"""Benchmark: at the acceptance real drafts give under sampling, what does each llama-server
speculation mode decode, greedy against temperature 0.7?

The target is a generated bigram table (``support/bigram.py``): greedy decoding is
deterministic, temperature 0.7 samples a genuinely random walk that n-gram lookup cannot
predict, and its qwen3 drafts keep the target's first successor on 0.95 and 0.6 of the table.
Each mode (none, the two drafts with ``draft-simple``, ``ngram-mod``, and the 0.95 draft with
``ngram-mod`` in front) serves ``--requests`` completions (a seed each) at each temperature on
the raw engine; per mode and temperature: drafted and accepted tokens, acceptance, and decode
speed (the engine's ``predicted_per_second``, median over the requests).

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
from pathlib import Path
from typing import Any

from benchmarks.spec_breakeven import server_path
from support.engineserver import running_server, spec_args
from support.ggufgen import cached_gguf, partial_pair

PROMPT = "hello world the model test hello world"
TEMPERATURES = (0.0, 0.7)


def pair_paths(models: Path | None) -> tuple[Path, Path, Path]:
    """The target and its 0.95 and 0.6 drafts."""
    if models is not None:
        names = ("qwen35-tiny-partial", "qwen35-tiny-partial-draft", "qwen35-tiny-partial-draft60")
        return tuple(models / f"{name}.gguf" for name in names)  # type: ignore[return-value]
    target, high = partial_pair()
    return cached_gguf(target), cached_gguf(high), cached_gguf(partial_pair(0.6)[1])


def modes(high: Path, low: Path) -> dict[str, list[str]]:
    """Each mode's llama-server flags (both models on the GPU where there is one)."""
    offload = ["--spec-draft-ngl", "99"]
    return {
        "none": [],
        "draft-0.95": [*spec_args("draft-simple", high), *offload],
        "draft-0.6": [*spec_args("draft-simple", low), *offload],
        "ngram-mod": spec_args("ngram-mod"),
        "ngram-mod+draft-0.95": [*spec_args("ngram-mod,draft-simple", high), *offload],
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
    target, high, low = pair_paths(args.models)
    command = shlex.join(["python", "-m", "benchmarks.sampled_acceptance", *sys.argv[1:]])
    result: dict[str, Any] = {"command": command, "target": target.name, "modes": {}}
    for name, flags in modes(high, low).items():
        rows = measure(args.server, target, flags, args.n_predict, args.requests)
        result["modes"][name] = rows
        if not args.json:
            for row in rows:
                print(name, json.dumps(row), flush=True)
    if args.json:
        print(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
