"""``python -m lucebox.app.cli``: the whole command line."""

from __future__ import annotations

import sys

from lucebox.app.cli.parser import main

if __name__ == "__main__":
    sys.exit(main())
