"""Logs, /metrics and /slots bodies recorded from the pinned engine (see capture.py)."""

from __future__ import annotations

import gzip
import json
from pathlib import Path
from typing import Any

FOLDER = Path(__file__).resolve().parent


def engine_lines(name: str) -> list[str]:
    return (FOLDER / f"{name}.log").read_text().splitlines()


def http_seen(name: str) -> dict[str, Any]:
    """What the HTTP side saw (gzipped: a second of /metrics is 3 KB, mostly its help text)."""
    with gzip.open(FOLDER / f"{name}.json.gz", "rt") as handle:
        seen: dict[str, Any] = json.load(handle)
    return seen
