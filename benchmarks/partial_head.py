"""A generated qwen35 target whose MTP head agrees with it part of the time (for the device
calibration run): a copy of an ``agree_token`` model with three tensors edited in place.

The target then alternates two words: every token embedding carries +100 in dimension 0 but
``world``'s carries -100, and the output head maps a positive dimension 0 to ``world`` and a
negative one to ``hello``, so it decodes "world hello world hello ...". The MTP head reads
dimension 0 of the sampled token's embedding as before, plus twice dimension 1, which only
``world`` carries (+100): after ``hello`` it predicts ``world`` (right), after ``world`` it
predicts ``world`` again (wrong). Every layer still computes on random weights.

    python -m benchmarks.partial_head AGREE_MODEL.gguf OUT.gguf --vocab 32000 --scale 32 --layers 16
"""

from __future__ import annotations

import argparse
import shutil
from pathlib import Path

import gguf
import numpy as np

from support.ggufgen import AGREE_EMBEDDING, qwen35_target, token_id, widen


def patch(path: Path, hello: int, world: int) -> None:
    reader = gguf.GGUFReader(path, "r+")
    tensors = {t.name: t for t in reader.tensors}
    embd = tensors["token_embd.weight"].data
    embd[world, 0] = -AGREE_EMBEDDING
    embd[world, 1] = AGREE_EMBEDDING
    output = tensors["output.weight"].data
    output[hello, 0] = -1.0
    output[world, 0] = 1.0
    (eh_proj,) = [t.data for name, t in tensors.items() if name.endswith("nextn.eh_proj.weight")]
    eh_proj[0, 1] = 2.0
    for array in (embd, output, eh_proj):
        if isinstance(array, np.memmap):
            array.flush()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("source", type=Path, help="a qwen35 target written with agree_token hello")
    parser.add_argument("out", type=Path)
    parser.add_argument("--vocab", type=int, default=None)
    parser.add_argument("--scale", type=int, default=1)
    parser.add_argument("--layers", type=int, default=4)
    args = parser.parse_args()
    shape = widen(qwen35_target(n_layer=args.layers, vocab_size=args.vocab), args.scale)
    shutil.copyfile(args.source, args.out)
    patch(args.out, token_id(shape, "hello"), token_id(shape, "world"))


if __name__ == "__main__":
    main()
