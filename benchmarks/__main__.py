"""`python -m benchmarks`: the index; `python -m benchmarks NAME [ARGS...]`: run one."""

from __future__ import annotations

import runpy
import sys

from benchmarks.index import by_name, text


def main(argv: list[str]) -> int:
    if not argv or argv[0] in ("-h", "--help", "list"):
        print(text())
        return 0
    if by_name(argv[0]) is None:
        print(f"no benchmark named {argv[0]!r}; `python -m benchmarks` lists them", file=sys.stderr)
        return 2
    sys.argv = [f"benchmarks.{argv[0]}", *argv[1:]]
    runpy.run_module(f"benchmarks.{argv[0]}", run_name="__main__", alter_sys=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
