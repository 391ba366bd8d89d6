"""``python -m lucebox.app.cli``: the whole command line."""

from __future__ import annotations

import sys

from lucebox.app.cli.parser import main

sys.exit(main())
