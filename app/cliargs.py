"""What every ``lucebox`` command shares: ``--json`` and how JSON is printed."""

from __future__ import annotations

import argparse
import json


def print_json(value: object) -> None:
    print(json.dumps(value, indent=2, sort_keys=False))


def add_json(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--json", action="store_true", help="print the result as JSON")
