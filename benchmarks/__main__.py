"""`python -m benchmarks`: the index; `python -m benchmarks NAME [ARGS...]`: run one here (a
benchmark that is only a step of the GPU machine's driver says how to run it there)."""

from __future__ import annotations

import importlib.util
import runpy
import sys

from benchmarks.index import DRIVER, by_name, text


def main(argv: list[str]) -> int:
    if not argv or argv[0] in ("-h", "--help", "list"):
        print(text())
        return 0
    bench = by_name(argv[0])
    if bench is None:
        print(f"no benchmark named {argv[0]!r}; `python -m benchmarks` lists them", file=sys.stderr)
        return 2
    if importlib.util.find_spec(f"benchmarks.{bench.name}") is None:
        print(
            f"{bench.name} runs on a GPU machine only: {DRIVER} {bench.device_step}",
            file=sys.stderr,
        )
        return 2
    sys.argv = [f"benchmarks.{argv[0]}", *argv[1:]]
    runpy.run_module(f"benchmarks.{argv[0]}", run_name="__main__", alter_sys=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
