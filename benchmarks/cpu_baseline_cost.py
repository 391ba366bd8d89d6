"""What the shipped CPU baseline costs against a native build (issue 37), helper of
``bash benchmarks/device/drive.sh cpu_baseline_cost``.

``configure VARIANT SRC BUILD`` prints lucebox's own cmake configure line for a CPU-only build
(:func:`lucebox.engine.engines.build.configure_argv`), one argument a line, with the CPU target
flags of the variant:

- ``baseline``: exactly :data:`cputarget.X86_64_V3`'s flags, what every engine build ships;
- ``native``: ``-DGGML_NATIVE=ON`` (``-march=native``: AMX too on a CPU that has it);
- ``native-noamx``: native without AMX, i.e. the baseline plus every AVX-512 / AVX-VNNI
  extension ggml knows that this CPU has, AMX off. Exit 3 when the CPU has no AVX-512 (then it
  would be the baseline).

``model PATH`` writes the F16 TinyLlama-1.1B-shaped model the bench quantizes.

``summarize OUT RUNS...`` reads ``VARIANT=RC:LLAMA_BENCH_JSON`` runs and writes one JSON document
(the machine, every llama-bench row, each variant's tokens/s and its ratio to native), printing
a table.
"""

from __future__ import annotations

import json
import os
import platform
import sys
from pathlib import Path
from typing import Any

from lucebox.engine.engines import build, cputarget
from lucebox.engine.engines.source import SourceInfo, load_pin
from lucebox.engine.machine.cpu import probe_cpu
from support.ggufgen import ModelSpec, write_llama

TINYLLAMA = ModelSpec(
    name="Random TinyLlama 1.1B",
    size_label="1.1B",
    n_layer=22,
    n_embd=2048,
    n_head=32,
    n_head_kv=4,
    n_ff=5632,
    vocab_size=32000,
    n_ctx=2048,
    constant_weights=True,
)
"""TinyLlama 1.1B's shape: big enough that its matmuls, not per-token overhead, set the pace."""

AVX512_FLAGS = {
    "avx512f": "-DGGML_AVX512=ON",
    "avx512vbmi": "-DGGML_AVX512_VBMI=ON",
    "avx512_vnni": "-DGGML_AVX512_VNNI=ON",
    "avx512_bf16": "-DGGML_AVX512_BF16=ON",
    "avx_vnni": "-DGGML_AVX_VNNI=ON",
}
"""/proc/cpuinfo flag -> the ggml option that uses it (AMX left out on purpose)."""


def target_flags(variant: str, features: frozenset[str]) -> list[str] | None:
    """The CPU target flags of one variant; None when this CPU makes it pointless."""
    baseline = list(cputarget.X86_64_V3.cmake_flags)
    if variant == "baseline":
        return baseline
    if variant == "native":
        return ["-DGGML_NATIVE=ON"]
    if variant == "native-noamx":
        if "avx512f" not in features:
            return None
        turned_on = {flag.replace("=ON", "=OFF"): flag for f, flag in AVX512_FLAGS.items()
                     if f in features}  # fmt: skip
        return [turned_on.get(flag, flag) for flag in baseline]
    raise SystemExit(f"unknown variant {variant}")


def configure(variant: str, src: Path, build_dir: Path) -> int:
    features = probe_cpu().features or frozenset()
    flags = target_flags(variant, features)
    if flags is None:
        print(f"{variant}: this CPU has no AVX-512, so it would be the baseline", file=sys.stderr)
        return 3
    pin = load_pin()
    source = SourceInfo(src, "pin", f"sha256:{pin.sha256}", pin.build_number)
    options = build.BuildOptions("cpu", webui=False, cpu_target=cputarget.X86_64_V3.name)
    argv = build.configure_argv(source, build_dir, options, use_ccache=False)
    ship = list(cputarget.X86_64_V3.cmake_flags)
    start = argv.index(ship[0])
    assert argv[start : start + len(ship)] == ship
    print("\n".join([*argv[:start], *flags, *argv[start + len(ship) :]]))
    return 0


def _rows(path: Path) -> list[dict[str, Any]]:
    """llama-bench's JSON rows; those finished before it died when the array was cut short."""
    try:
        text = path.read_text(errors="replace").strip()
    except OSError:
        return []
    for attempt in (text, text.rstrip(",") + "\n]", text + "}\n]"):
        try:
            rows = json.loads(attempt or "[]")
        except json.JSONDecodeError:
            continue
        if not isinstance(rows, list):
            return []
        return [r for r in rows if isinstance(r, dict) and "avg_ts" in r and "n_gen" in r]
    return []


def _test_name(row: dict[str, Any]) -> str:
    return f"pp{row['n_prompt']}" if row.get("n_prompt") else f"tg{row['n_gen']}"


def summarize(out: Path, runs: list[str]) -> dict[str, Any]:
    cpu = probe_cpu()
    features = cpu.features or frozenset()
    variants: dict[str, Any] = {}
    speeds: dict[tuple[str, str, str], float] = {}
    for run in runs:
        variant, _, rest = run.partition("=")
        rc_text, _, path = rest.partition(":")
        rows = _rows(Path(path))
        rc = int(rc_text)
        entry = variants.setdefault(
            variant, {"exit_codes": [], "signal": None, "tests": [], "raw": []}
        )
        entry["exit_codes"].append(rc)
        if rc > 128:
            entry["signal"] = rc - 128
        entry["raw"] += rows
        for row in rows:
            samples = [float(s) for s in row.get("samples_ts") or []]
            key = (variant, str(row.get("model_type")), _test_name(row))
            speeds[key] = float(row["avg_ts"])
            entry["tests"].append(
                {
                    "model": row.get("model_type"),
                    "test": key[2],
                    "threads": row.get("n_threads"),
                    "tokens_per_s": round(float(row["avg_ts"]), 2),
                    "stddev": round(float(row.get("stddev_ts") or 0.0), 2),
                    "samples": [round(s, 2) for s in samples],
                }
            )
    ratios = []
    for (variant, model, test), speed in sorted(speeds.items()):
        if variant == "baseline":
            continue
        base = speeds.get(("baseline", model, test))
        if base:
            ratios.append(
                {
                    "model": model,
                    "test": test,
                    "vs": variant,
                    "baseline_tokens_per_s": round(base, 2),
                    "other_tokens_per_s": round(speed, 2),
                    "baseline_over_other": round(base / speed, 3),
                }
            )
    doc = {
        "cpu": {
            "model": cpu.model_name,
            "arch": platform.machine(),
            "cores_online": os.cpu_count(),
            "amx_tile": "amx_tile" in features,
            "avx512": sorted(f for f in features if f.startswith(("avx512", "amx", "avx_vnni"))),
        },
        "baseline_flags": list(cputarget.X86_64_V3.cmake_flags),
        "native_noamx_flags": target_flags("native-noamx", features),
        "variants": variants,
        "baseline_vs": ratios,
    }
    out.write_text(json.dumps(doc, indent=1) + "\n")
    return doc


def table(doc: dict[str, Any]) -> str:
    lines = ["variant | exit | model | test | tok/s (mean +- sd, 3 reps)"]
    for name, variant in doc["variants"].items():
        codes = ",".join(str(c) for c in variant["exit_codes"])
        if not variant["tests"]:
            lines.append(f"{name} | {codes} | - | - | no result")
        for t in variant["tests"]:
            lines.append(
                f"{name} | {codes} | {t['model']} | {t['test']} | "
                f"{t['tokens_per_s']} +- {t['stddev']}"
            )
    lines.append("model | test | vs | baseline tok/s | other tok/s | baseline/other")
    for r in doc["baseline_vs"]:
        lines.append(
            f"{r['model']} | {r['test']} | {r['vs']} | {r['baseline_tokens_per_s']} | "
            f"{r['other_tokens_per_s']} | {r['baseline_over_other']}"
        )
    return "\n".join(lines)


def main(argv: list[str]) -> int:
    if argv[:1] == ["configure"] and len(argv) == 4:
        return configure(argv[1], Path(argv[2]), Path(argv[3]))
    if argv[:1] == ["model"] and len(argv) == 2:
        write_llama(Path(argv[1]), TINYLLAMA)
        return 0
    if argv[:1] == ["summarize"] and len(argv) >= 3:
        print(table(summarize(Path(argv[1]), argv[2:])))
        return 0
    print(__doc__, file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
