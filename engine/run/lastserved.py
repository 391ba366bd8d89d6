"""The last served address and model: a small record that outlives the run.

The state file (``runstate``) is deleted when a run ends, yet ``lucebox connect`` with the server
down must still point a client at the address the server will come back on, not guess the
default port. This record is written each time a server becomes ready and is never deleted.
It imports nothing heavy: ``lucebox status`` and ``connect`` read it.
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from lucebox.engine.core.atomic import write_text_atomic
from lucebox.engine.core.paths import Paths

RECORD_NAME = "last-served.json"


@dataclass(frozen=True)
class LastServed:
    """What a client needs to know about the server that ran last."""

    url: str
    """The server root, e.g. ``http://127.0.0.1:8080``."""
    aliases: tuple[str, ...]
    """The model names the server answers to (one per model of a served set)."""
    ctx: int
    """The context the engine served, in tokens."""
    api_key_file: str | None
    """The key file the engine checked requests against; None when it took any request."""
    on_gpu: bool
    weights_bytes: int
    """The served model's weights (a CPU's prefill rate scales with their size)."""
    cpu_cores: int
    at_s: float
    """Unix time the server became ready."""
    embed_model: str | None = None
    """The embedding model served beside the chat model (its alias); None: none."""

    @property
    def model(self) -> str:
        return self.aliases[0]

    def to_json(self) -> dict[str, Any]:
        return {
            "url": self.url,
            "aliases": list(self.aliases),
            "ctx": self.ctx,
            "api_key_file": self.api_key_file,
            "on_gpu": self.on_gpu,
            "weights_bytes": self.weights_bytes,
            "cpu_cores": self.cpu_cores,
            "at_s": self.at_s,
            "embed_model": self.embed_model,
        }

    @classmethod
    def from_json(cls, data: Any) -> LastServed | None:
        """The record ``data`` holds; None when it is not one (an old or foreign file)."""
        if not isinstance(data, dict):
            return None
        try:
            aliases = tuple(str(alias) for alias in data["aliases"])
            key_file = data.get("api_key_file")
            record = cls(
                url=str(data["url"]),
                aliases=aliases,
                ctx=int(data["ctx"]),
                api_key_file=None if key_file is None else str(key_file),
                on_gpu=bool(data["on_gpu"]),
                weights_bytes=int(data["weights_bytes"]),
                cpu_cores=int(data["cpu_cores"]),
                at_s=float(data["at_s"]),
                embed_model=str(data["embed_model"]) if data.get("embed_model") else None,
            )
        except (KeyError, TypeError, ValueError):
            return None
        return record if aliases else None


def record_file(paths: Paths) -> Path:
    return paths.state_dir / RECORD_NAME


def served_now(
    url: str,
    aliases: tuple[str, ...],
    ctx: int,
    *,
    api_key_file: str | None,
    on_gpu: bool,
    weights_bytes: int,
    embed_model: str | None = None,
) -> LastServed:
    """The record of a server that became ready just now on this machine."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return LastServed(
        url,
        aliases,
        ctx,
        api_key_file,
        on_gpu,
        weights_bytes,
        cores or 1,
        round(time.time(), 1),
        embed_model,
    )


def write_last_served(paths: Paths, record: LastServed) -> None:
    paths.ensure(paths.state_dir)
    write_text_atomic(record_file(paths), json.dumps(record.to_json(), indent=2) + "\n")


def read_last_served(paths: Paths) -> LastServed | None:
    """The last served server; None when no server has become ready with this home."""
    try:
        data = json.loads(record_file(paths).read_text("utf-8"))
    except (OSError, ValueError):
        return None
    return LastServed.from_json(data)
