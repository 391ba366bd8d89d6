"""Warm prompts across restarts: the engine's slot saved on every planned stop, restored on the
next start of the same launch.

An agent's 30K-token prompt takes minutes to process again on a home card; a restored slot
answers its next call from the cache. The engine saves and restores through its ``/slots``
actions into ``--slot-save-path``; lucebox writes beside each file what it was saved with,
and restores only when the new launch serves the same model file at the same context and
KV types with the same engine build (anything else would be refused by the engine, or worse,
be wrong), and only a file as long as the one saved.

The saved state is the client's conversation, never lucebox's own: before a save the slot is
seated on the client's last prompt without its generation prompt (:func:`reseat_slot`), the
exact prefix of the client's next request. A hybrid or recurrent model's state cannot roll
back to a shorter prefix without a context checkpoint, and a slot file carries none: a state
that also held the last reply (which the client sends back re-rendered) would be re-read in
full after the restart. A slot that last served lucebox's own probe is not saved (the file
keeps the client's), and the client's is saved before a probe takes the slot
(:class:`SlotHolder`).
"""

from __future__ import annotations

import contextlib
import json
import os
import re
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

import httpx

from lucebox.engine.core.atomic import write_text_atomic
from lucebox.engine.core.prefixstore import build_of, model_stamp
from lucebox.engine.plan.launch import ServerLaunch

SLOT_ID = 0
"""The agent profile serves one slot."""
PART_SUFFIX = ".part"
"""The engine saves here first; the rename over the slot file is lucebox's."""
SAVE_TIMEOUT_S = 15.0
"""A save on the stop path must leave the engine time to exit before `lucebox down` and
systemd give up on the stop."""
RESEAT_TIMEOUT_S = 15.0
"""The reseat reads from the engine's in-memory checkpoint (a few hundred tokens at most);
one that takes longer is given up (the engine then stops it): with the save it fits the 45 s
`lucebox down` waits."""
DROPPED_KEYS = (
    "stream",
    "stream_options",
    "n",
    "logprobs",
    "top_logprobs",
    "max_completion_tokens",
)
"""What a reseat does not send again: it is answered whole, with no token."""
BYTES_KEY = "bytes"
"""The saved file's length, beside the key in the record: a shorter file is not restored."""
TOKENS_KEY = "tokens"
"""The tokens it holds, beside the key in the record (what ``status`` counts as kept)."""


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
    engine_build: str = ""
    """The engine binary that saved it (path, size, modification time): a state file's
    layout is the build's own, and another build may read it wrong."""
    model_bytes: int = 0
    model_mtime_ns: int = 0
    """The model file's size and modification time: an update in place is another model."""

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
            build_of(server.server_path),
            *model_stamp(server.model_path),
        )

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class SlotResult:
    """What one save or restore did: the tokens it moved, or why it moved none."""

    tokens: int | None
    failure: str | None
    miss: str | None = None
    """Why a saved slot was not restored when that is no failure (it was saved for another
    launch)."""


@dataclass(frozen=True)
class ClientPrompt:
    """A client's generation request as the engine got it (the front keeps the last one)."""

    path: str
    body: bytes
    sent_s: float
    """When the front relayed it (``time.monotonic``)."""


KEEP_LONGER_S = 3600.0
"""With several slots, a longer prompt sent within this long is kept over a shorter newer one."""


def kept_prompt(kept: ClientPrompt | None, new: ClientPrompt, slots: int) -> ClientPrompt:
    """The prompt a stop saves into the slot: the newest with one slot. With several (several
    people at once) the newest unless a longer one came within KEEP_LONGER_S: an agent's long
    conversation, costly to read again, is not displaced by someone's short chat."""
    if slots <= 1 or kept is None or len(new.body) >= len(kept.body):
        return new
    return kept if new.sent_s - kept.sent_s <= KEEP_LONGER_S else new


class SlotHolder:
    """Who holds the engine's slot: the client's conversation or lucebox's own request.

    The times are ``time.monotonic``: the client's from the front, lucebox's own from the
    run's ledger of its requests; the slot holds an unsaved conversation when a client's
    request came after this engine started, after lucebox's last own request and after the
    last save.
    """

    def __init__(self) -> None:
        self.ready_s = 0.0
        """When this engine said ready (its slot holds the restored file, or nothing)."""
        self.saved_s = 0.0
        """When the conversation was last saved from this engine."""

    def engine_ready(self, now_s: float) -> None:
        self.ready_s, self.saved_s = now_s, 0.0

    def unsaved_client(self, client_s: float | None, own_s: float | None) -> bool:
        """Whether the slot holds a client's conversation that no file holds yet."""
        if client_s is None:
            return False
        return client_s > max(self.ready_s, self.saved_s, own_s or 0.0)

    def lucebox_last(self, client_s: float | None, own_s: float | None) -> bool:
        """Whether lucebox's own request used the slot after the client's last one and the
        last save (the reseat before a save is one of lucebox's own)."""
        return own_s is not None and own_s > max(self.ready_s, self.saved_s, client_s or 0.0)


def reseat_body(prompt: ClientPrompt) -> dict[str, Any] | None:
    """The client's last request sent again and answered with no token, so the slot's state
    is a prefix the client's next request extends: a chat (or a Responses call, which the
    engine renders as one and whose other keys it keeps) rendered without its generation
    prompt; an Anthropic message (whose conversion drops that key) or a raw prompt as it was.
    None for a body that is not a JSON object."""
    try:
        body = json.loads(prompt.body)
    except (ValueError, UnicodeDecodeError, RecursionError):
        return None
    if not isinstance(body, dict):
        return None
    for streamed_or_sampled in DROPPED_KEYS:
        body.pop(streamed_or_sampled, None)
    no_token: dict[str, Any] = {"max_tokens": 0, "n_predict": 0, "id_slot": SLOT_ID}
    endpoint = prompt.path if prompt.path.startswith("/v1/") else "/v1" + prompt.path
    if endpoint in ("/v1/chat/completions", "/v1/responses"):
        no_token["add_generation_prompt"] = False
    if endpoint == "/v1/responses":
        no_token["max_output_tokens"] = 0
    return {**body, **no_token, "cache_prompt": True}


async def reseat_slot(
    client: httpx.AsyncClient, url: str, headers: dict[str, str], prompt: ClientPrompt
) -> SlotResult:
    """Seat the slot on the client's last prompt without its generation prompt (see
    :func:`reseat_body`): the tokens the engine evaluated for it, or why not."""
    body = reseat_body(prompt)
    if body is None:
        return SlotResult(None, f"the client's last request ({prompt.path}) is not JSON")
    try:
        reply = await client.post(
            f"{url}{prompt.path}", json=body, headers=headers, timeout=RESEAT_TIMEOUT_S
        )
    except httpx.HTTPError as exc:
        return SlotResult(None, f"the engine did not answer the reseat ({type(exc).__name__})")
    if reply.status_code != 200:
        return _count(reply, "reseat", "timings")
    try:
        timings = reply.json().get("timings")
    except (ValueError, AttributeError):
        timings = None
    # The Anthropic and Responses shapes carry no timings: the tokens read go unsaid.
    evaluated = timings.get("prompt_n") if isinstance(timings, dict) else None
    return SlotResult(evaluated if isinstance(evaluated, int) else None, None)


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
            record = {**key.to_json(), BYTES_KEY: part.stat().st_size, TOKENS_KEY: saved.tokens}
            part.replace(folder / key.file_name)
            write_text_atomic(_meta_path(folder, key), json.dumps(record), durable=False)
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
    failure when there is none to restore, or it was saved for another launch)."""
    slot = folder / key.file_name
    try:
        text = _meta_path(folder, key).read_text("utf-8")
    except OSError:
        return SlotResult(None, None)
    try:
        saved_for = json.loads(text)
        saved_bytes = saved_for.pop(BYTES_KEY, None)
        saved_for.pop(TOKENS_KEY, None)
    except (ValueError, AttributeError, TypeError):
        return SlotResult(None, "the saved slot's record is unreadable; the slot is ignored")
    if saved_for != key.to_json() or not slot.is_file():
        return SlotResult(None, None, _miss(saved_for, key) if slot.is_file() else None)
    with contextlib.suppress(OSError):
        found_bytes = os.stat(slot).st_size
        if isinstance(saved_bytes, int) and found_bytes != saved_bytes:
            why = f"the saved slot is {found_bytes} bytes, not the {saved_bytes} saved"
            return SlotResult(None, f"{why}; the slot is ignored")
    return await _slot_action(client, url, headers, key.file_name, "restore", "n_restored")


MISS_WORDS = {
    "engine_build": "another engine build",
    "cache_type_k": "another KV type",
    "cache_type_v": "another KV type",
    "ctx": "another context",
    "model_path": "another model file",
    "model_bytes": "another version of the model file",
    "model_mtime_ns": "another version of the model file",
    "mmproj_path": "another projector",
}


def _miss(saved_for: Any, key: SlotKey) -> str:
    """Why the slot saved for ``saved_for`` does not fit the launch of ``key``."""
    wanted = key.to_json()
    found = saved_for if isinstance(saved_for, dict) else {}
    what = [words for name, words in MISS_WORDS.items() if found.get(name) != wanted[name]]
    return f"saved with {', '.join(dict.fromkeys(what)) or 'another launch'}"


def restore_words(result: SlotResult) -> str | None:
    """What a restore did, for ``status``; None when there was nothing to restore."""
    if result.tokens is not None:
        return f"restored the saved slot ({result.tokens} tokens)"
    why = result.failure or result.miss
    return f"not restored: {why}" if why else None


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
