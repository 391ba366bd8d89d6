"""Warm prompts across restarts: the engine's slot saved on every planned stop, restored on the
next start of the same launch.

An agent's 30K-token prompt takes minutes to process again on a home card; a restored slot
answers its next call from the cache. The engine saves and restores through its ``/slots``
actions into ``--slot-save-path``; lucebox writes beside each file what it was saved with,
and restores only when the new launch serves the same model file at the same context and
KV types (anything else would be refused by the engine, or worse, be wrong).
"""

from __future__ import annotations

import contextlib
import json
import re
from dataclasses import asdict, dataclass, replace
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
    mmproj_path: str | None = None
    """The projector served with it: llama-server refuses to restore a slot holding an
    image's tokens into an engine without one ("Cannot restore media tokens without an
    mmproj", seen when --vision went from on to off)."""

    @property
    def file_name(self) -> str:
        return re.sub(r"[^A-Za-z0-9._-]", "_", self.alias) + ".slot"

    @classmethod
    def of(cls, server: ServerLaunch) -> SlotKey:
        """The key of what ``server`` serves: a re-planned launch gets its own."""
        plan = server.plan
        return cls(
            server.alias,
            server.model_path,
            plan.ctx,
            plan.cache_type_k,
            plan.cache_type_v,
            server.mmproj_path,
        )

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class SlotResult:
    """What one save or restore did: the tokens it moved, or why it moved none."""

    tokens: int | None
    failure: str | None


def _meta_path(folder: Path, key: SlotKey) -> Path:
    return folder / f"{key.file_name}.json"


async def save_slot(
    client: httpx.AsyncClient, url: str, headers: dict[str, str], folder: Path, key: SlotKey
) -> SlotResult:
    """Ask the engine to save its slot: the tokens saved, or why it could not.

    The engine writes the file in place: it saves to a file of its own first, renamed over the
    slot once it said the save succeeded, so a save cut short (a full disk, a kill) leaves the
    last good slot, never half of one that would be restored.
    """
    part = folder / f"{key.file_name}{PART_SUFFIX}"
    saved = await _slot_action(client, url, headers, part.name, "save", "n_saved")
    if saved.tokens is not None:
        try:
            part.replace(folder / key.file_name)
            write_text_atomic(_meta_path(folder, key), json.dumps(key.to_json()), durable=False)
        except OSError as exc:
            saved = SlotResult(None, f"lucebox could not keep the saved slot ({exc})")
        else:
            return saved
    with contextlib.suppress(OSError):  # the folder itself may be what broke
        part.unlink(missing_ok=True)
    kept = (folder / key.file_name).is_file()
    kept_words = "the slot saved before is kept" if kept else "no slot is kept"
    return replace(saved, failure=f"{saved.failure}; {kept_words}")


async def restore_slot(
    client: httpx.AsyncClient, url: str, headers: dict[str, str], folder: Path, key: SlotKey
) -> SlotResult:
    """Restore the slot saved for this same launch: the tokens restored, or why not (no
    failure when there is none to restore)."""
    try:
        saved_for = json.loads(_meta_path(folder, key).read_text("utf-8"))
    except (OSError, ValueError):
        return SlotResult(None, None)
    if saved_for != key.to_json() or not (folder / key.file_name).is_file():
        return SlotResult(None, None)
    return await _slot_action(client, url, headers, key.file_name, "restore", "n_restored")


async def _slot_action(
    client: httpx.AsyncClient,
    url: str,
    headers: dict[str, str],
    file_name: str,
    action: str,
    count_key: str,
) -> SlotResult:
    """One ``/slots`` action on the agent slot: the token count it answers, or why not."""
    try:
        reply = await client.post(
            f"{url}/slots/{SLOT_ID}",
            params={"action": action},
            json={"filename": file_name},
            headers=headers,
            timeout=SAVE_TIMEOUT_S,
        )
    except httpx.HTTPError as exc:
        return SlotResult(None, f"the engine did not answer the {action} ({type(exc).__name__})")
    return _count(reply, action, count_key)


def _count(reply: httpx.Response, action: str, key: str) -> SlotResult:
    """The token count a slot action answers with, or the engine's reason for an error."""
    try:
        data = reply.json()
    except ValueError:
        data = None
    if reply.status_code != 200:
        error = data.get("error") if isinstance(data, dict) else None
        message = error.get("message") if isinstance(error, dict) else None
        why = message if isinstance(message, str) else reply.text[:200]
        return SlotResult(None, f"the engine refused the {action} ({reply.status_code}: {why})")
    value = data.get(key) if isinstance(data, dict) else None
    if not isinstance(value, int):
        return SlotResult(None, f"the engine's {action} reply has no {key}")
    return SlotResult(value, None)
