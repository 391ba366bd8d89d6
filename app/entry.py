"""The `lucebox` console script: `status`, `down` and `logs` answer before the rest loads.

A status bar may run `lucebox status --json` every second; the full command line imports the
engine's HTTP client, GGUF reader and build code, which would cost it several times more CPU
than the answer itself.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence

from lucebox.app.cli import status


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if args and args[0] in status.COMMANDS:
        return status.main(args)
    from lucebox.app.cli.parser import main as full_main

    return full_main(args)


if __name__ == "__main__":
    sys.exit(main())
