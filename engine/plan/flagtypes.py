"""Argument types of lucebox's flags: each refuses bad input with one line saying what it wants.

argparse shows an ``ArgumentTypeError`` as a usage error (exit 2) naming the flag.
"""

from __future__ import annotations

import argparse

from lucebox.engine.core.errors import UsageError
from lucebox.engine.machine import peers


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


def id_list(text: str) -> tuple[str, ...]:
    """``a,b`` -> the ids, none empty."""
    items = tuple(item.strip() for item in text.split(","))
    if not all(items):
        raise argparse.ArgumentTypeError(f"{text!r} has an empty id")
    return items


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
