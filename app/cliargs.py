"""What every ``lucebox`` command shares: argument types that refuse bad input in one line,
``--json`` and how JSON is printed."""

from __future__ import annotations

import argparse
import json

from lucebox.engine.core.errors import UsageError
from lucebox.engine.machine import peers
from lucebox.engine.plan.enginechoice import ENGINE_MODES
from lucebox.engine.plan.luceboxplan import PREFILL_MODES


def positive_int(text: str) -> int:
    """argparse type for counts and sizes: a whole number above zero."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number, got {text!r}") from None
    if value <= 0:
        raise argparse.ArgumentTypeError(f"expected a number above 0, got {value}")
    return value


def non_negative_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number, got {text!r}") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"expected 0 or more, got {value}")
    return value


def index_list(text: str) -> tuple[int, ...]:
    """``0,1`` -> (0, 1): GPU indices, each non-negative, none twice."""
    items = tuple(non_negative_int(item.strip()) for item in text.split(","))
    if len(set(items)) != len(items):
        raise argparse.ArgumentTypeError(f"{text!r} names a GPU twice")
    return items


def mib_list(text: str) -> tuple[int, ...]:
    """``24576,24576`` -> one positive MiB size per card."""
    return tuple(positive_int(item.strip()) for item in text.split(","))


def peer_list(text: str) -> tuple[str, ...]:
    """``h1:50052,h2:50052`` -> the peer addresses, each HOST:PORT."""
    items = tuple(item.strip() for item in text.split(",") if item.strip())
    for item in items:
        try:
            peers.split_address(item)
        except UsageError as exc:
            raise argparse.ArgumentTypeError(f"{exc.message}: {exc.hint}") from None
    return items


def port_number(text: str) -> int:
    value = positive_int(text)
    if value > 65535:
        raise argparse.ArgumentTypeError(f"a TCP port is 1..65535, got {value}")
    return value


def print_json(value: object) -> None:
    print(json.dumps(value, indent=2, sort_keys=False))


def add_json(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--json", action="store_true", help="print the result as JSON")


def add_engine_options(parser: argparse.ArgumentParser) -> None:
    """--engine and --prefill: which engine serves a planned launch (up, serve, plan)."""
    parser.add_argument(
        "--engine",
        choices=ENGINE_MODES,
        help="which engine serves: auto (default: the planner chooses and says why), "
        "llama-server, or lucebox (the Lucebox engine: DDTree, KVFlash, PFlash; CUDA only)",
    )
    parser.add_argument(
        "--prefill",
        choices=PREFILL_MODES,
        help="PFlash speculative prefill on the Lucebox engine: off (default), auto "
        "(long single prompts) or pflash (always); it keeps only a share of a long prompt",
    )
