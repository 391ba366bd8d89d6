"""Benchmark: `lucebox models check` reads only the header, in well under a second.

Runs the real command line on a 20 GB sparse GGUF (real header of a 40-layer, 150k-vocab
model; sparse data) and on the real Gemma 3 270M, several times each, and reports the median
wall time of the whole process, the time of the check inside it (without Python's
start-up), and the bytes the process read (rchar from /proc/<pid>/io).

    .venv/bin/python -m benchmarks.model_check_reads_header [--runs 7]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import gguf
import numpy as np

from support.realmodels import gemma_model

_PROBE = """
import json, sys, time
from lucebox.app.cli.parser import main
started = time.perf_counter()
code = main(["models", "check", "--allow-base", "--json", sys.argv[1]])
check_s = time.perf_counter() - started
io = dict(line.split(": ") for line in open("/proc/self/io").read().splitlines())
print(json.dumps({"exit": code, "rchar": int(io["rchar"]), "check_s": check_s}), file=sys.stderr)
"""


def write_sparse_20gb(path: Path) -> Path:
    """A Q4_K 40-layer llama-shaped header whose tensors add up to about 20 GB, data sparse."""
    writer = gguf.GGUFWriter(str(path), "llama")
    n_embd, n_ff, n_layer, n_vocab = 8192, 28672, 40, 152064
    writer.add_name("Sparse Llama 20G Instruct")
    writer.add_context_length(131072)
    writer.add_embedding_length(n_embd)
    writer.add_block_count(n_layer)
    writer.add_feed_forward_length(n_ff)
    writer.add_head_count(64)
    writer.add_head_count_kv(8)
    writer.add_tokenizer_model("gpt2")
    writer.add_token_list([f"tok{i}" for i in range(n_vocab)])
    writer.add_token_types([1] * n_vocab)
    writer.add_chat_template("{{ messages }}")
    q4k = gguf.GGMLQuantizationType.Q4_K
    block, type_size = gguf.GGML_QUANT_SIZES[q4k]

    def info(name: str, rows: int, cols: int) -> None:
        # With raw_dtype the writer takes the shape in bytes per row.
        writer.add_tensor_info(
            name,
            (rows, cols // block * type_size),
            np.dtype(np.uint8),
            rows * cols // block * type_size,
            raw_dtype=q4k,
        )

    info("token_embd.weight", n_vocab, n_embd)
    info("output.weight", n_vocab, n_embd)
    for i in range(n_layer):
        for name, rows, cols in [
            ("attn_q", n_embd, n_embd),
            ("attn_k", 1024, n_embd),
            ("attn_v", 1024, n_embd),
            ("attn_output", n_embd, n_embd),
            ("ffn_gate", n_ff, n_embd),
            ("ffn_up", n_ff, n_embd),
            ("ffn_down", n_embd, n_ff),
        ]:
            info(f"blk.{i}.{name}.weight", rows, cols)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_ti_data_to_file()
    writer.close()
    from lucebox.engine.models.headerinfo import inspect_model

    os.truncate(path, inspect_model(path).expected_size_bytes)
    return path


def measure(path: Path, runs: int) -> dict[str, object]:
    walls, rchars, checks = [], [], []
    for _ in range(runs):
        started = time.perf_counter()
        done = subprocess.run(
            [sys.executable, "-c", _PROBE, str(path)], capture_output=True, text=True, check=False
        )
        walls.append(time.perf_counter() - started)
        stats = json.loads(done.stderr.strip().splitlines()[-1])
        assert stats["exit"] == 0, done.stdout
        rchars.append(stats["rchar"])
        checks.append(stats["check_s"])
        result = json.loads(done.stdout)[0]
    return {
        "file": path.name,
        "file_bytes": path.stat().st_size,
        "disk_bytes": path.stat().st_blocks * 512,
        "median_wall_s": round(statistics.median(walls), 3),
        "min_wall_s": round(min(walls), 3),
        "median_check_s": round(statistics.median(checks), 3),
        "process_rchar_bytes": int(statistics.median(rchars)),
        "header_bytes_read": result["info"]["header_bytes_read"],
        "verdict": result["verdict"],
    }


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=7)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as folder:
        sparse = write_sparse_20gb(Path(folder) / "sparse-llama-20g-instruct-q4_k.gguf")
        rows = [measure(sparse, args.runs), measure(gemma_model(), args.runs)]
    for row in rows:
        print(json.dumps(row))


if __name__ == "__main__":
    main()
