"""Warm prompts across restarts: the engine's slot saved on every planned stop, restored on the
next start of the same launch.

An agent's 30K-token prompt takes minutes to process again on a home card; a restored slot
answers its next call from the cache. The engine saves and restores through its ``/slots``
actions into ``--slot-save-path``; lucebox writes beside each file what it was saved with,
and restores only when the new launch serves the same model file at the same context and
KV types (anything else would be refused by the engine, or worse, be wrong).
"""

from __future__ import annotations

import json
import re
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import httpx

from lucebox.engine.core.atomic import write_text_atomic
from lucebox.engine.plan.launch import ServerLaunch

SLOT_ID = 0
"""The agent profile serves one slot."""
PART_SUFFIX = ".part"
"""The engine saves here first; the rename over the slot file is lucebox's."""
SAVE_TIMEOUT_S = 15.0
"""A save on the stop path must leave the engine time to exit before `lucebox down` and
systemd give up on the stop."""


@dataclass(frozen=True)
class SlotKey:
    """What a saved slot is valid for."""

    alias: str
    model_path: str
    ctx: int
    cache_type_k: str
    cache_type_v: str

    @property
    def file_name(self) -> str:
        return re.sub(r"[^A-Za-z0-9._-]", "_", self.alias) + ".slot"

    @classmethod
    def of(cls, server: ServerLaunch) -> SlotKey:
        """The key of what ``server`` serves: a re-planned launch gets its own."""
        plan = server.plan
        return cls(server.alias, server.model_path, plan.ctx, plan.cache_type_k, plan.cache_type_v)

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def _meta_path(folder: Path, key: SlotKey) -> Path:
    return folder / f"{key.file_name}.json"


async def save_slot(
    client: httpx.AsyncClient, url: str, headers: dict[str, str], folder: Path, key: SlotKey
) -> int | None:
    """Ask the engine to save its slot; returns the tokens saved, or None when it could not.

    The engine writes the file in place: it saves to a file of its own first, renamed over the
    slot once it said the save succeeded, so a save cut short (a full disk, a kill) leaves the
    last good slot, never half of one that would be restored.
    """
    part = folder / f"{key.file_name}{PART_SUFFIX}"
    saved = await _slot_action(client, url, headers, part.name, "save", "n_saved")
    if saved is None:
        part.unlink(missing_ok=True)
        return None
    part.replace(folder / key.file_name)
    write_text_atomic(_meta_path(folder, key), json.dumps(key.to_json()), durable=False)
    return saved


async def restore_slot(
    client: httpx.AsyncClient, url: str, headers: dict[str, str], folder: Path, key: SlotKey
) -> int | None:
    """Restore the slot saved for this same launch; returns the tokens restored, or None."""
    try:
        saved_for = json.loads(_meta_path(folder, key).read_text("utf-8"))
    except (OSError, ValueError):
        return None
    if saved_for != key.to_json() or not (folder / key.file_name).is_file():
        return None
    return await _slot_action(client, url, headers, key.file_name, "restore", "n_restored")


async def _slot_action(
    client: httpx.AsyncClient,
    url: str,
    headers: dict[str, str],
    file_name: str,
    action: str,
    count_key: str,
) -> int | None:
    """One ``/slots`` action on the agent slot; the token count it answers, or None."""
    try:
        reply = await client.post(
            f"{url}/slots/{SLOT_ID}",
            params={"action": action},
            json={"filename": file_name},
            headers=headers,
            timeout=SAVE_TIMEOUT_S,
        )
    except httpx.HTTPError:
        return None
    return _count(reply, count_key)


def _count(reply: httpx.Response, key: str) -> int | None:
    """The token count a slot action answers with; None for an error or an odd reply."""
    if reply.status_code != 200:
        return None
    try:
        value = reply.json().get(key)
    except (ValueError, AttributeError):
        return None
    return value if isinstance(value, int) else None
