"""Each model of a served set keeps its conversation across the proxy's unloads: its slot is
saved before the proxy unloads it (idle, for another model's room, asked by name, or the set
stopping) and restored when it loads again, before the request that loads it passes.

The pieces are the single engine's (:mod:`lucebox.engine.run.slots`): the same key record
beside each file, the same reseat on the client's last prompt before a save, the same rules
for a file that does not fit the launch (ignored, with a note in the log). Each set has a
folder of slot files of its own under the slots folder; each model's preset section names it
as ``slot-save-path`` (router.py), which the router passes on to the model's process with the
rest of its section.

Where a slot action goes. The router answers ``POST /slots/:id`` by proxying it to the
process of the body's ``model`` (``routes.post_slots = proxy_post``, tools/server/server.cpp),
and first loads that model when it is not running (``is_autoload`` in ``proxy_post``,
server-models.cpp): a save on the unload path must never load a model. A model's process
listens on 127.0.0.1 at the port its argv in ``/models`` names, with no API key (the router
unsets ``LLAMA_API_KEY`` and ``--api-key-file`` for its children, ``unset_reserved_args``), and
its ``/slots/0?action=save|restore`` is the single server's own. So the reseats, saves and
restores go to the process's own port; only the load goes through the router, as
``GET /props?model=``, which waits until the model is ready (``ensure_model_ready``).

When the set stops, every loaded model saves at once, each within :data:`SAVE_WITHIN_S`: one
after the other, several models would take minutes, past the time `lucebox down` waits.
"""

from __future__ import annotations

import asyncio
import hashlib
import re
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

import httpx

from lucebox.engine.core.slotstore import SETS_FOLDER
from lucebox.engine.plan.servedset.setplan import SetPlan
from lucebox.engine.run.servedset.routerlist import LIST_WAIT_S, ModelListError, router_list
from lucebox.engine.run.servedset.servedsethang import CHILD_HOST
from lucebox.engine.run.servedsetmodels import loaded_children
from lucebox.engine.run.slots import (
    RESEAT_TIMEOUT_S,
    SAVE_TIMEOUT_S,
    ClientPrompt,
    SlotHolder,
    SlotKey,
    SlotResult,
    kept_prompt,
    reseat_slot,
    restore_slot,
    restore_words,
    save_slot,
)

LOAD_TIMEOUT_S = 600.0
"""A load before a restore waits as long as the request that asked for it would."""
SAVE_WITHIN_S = RESEAT_TIMEOUT_S + SAVE_TIMEOUT_S
"""One model's whole save on the stop path (its port asked, the reseat and the save): the
single engine's bound, so a set's stop fits the time `lucebox down` waits as a single one's."""


@dataclass(frozen=True)
class ModelSlot:
    """What a model of the set saves its slot for, and how many slots its engine serves."""

    key: SlotKey
    slots: int = 1


def set_slot_folder(slots_dir: Path, aliases: Iterable[str]) -> Path:
    """The set's folder of slot files: named by its models in any order, so the same set
    finds its files again and another set never reads them."""
    names = sorted(aliases)
    digest = hashlib.sha256("\n".join(names).encode()).hexdigest()[:12]
    readable = re.sub(r"[^A-Za-z0-9._+-]", "_", "+".join(names))[:60]
    return slots_dir / SETS_FOLDER / f"{readable}-{digest}"


def model_slots(planned: SetPlan) -> dict[str, ModelSlot]:
    """The models of the set whose plans save their slot (the agent cache), by alias."""
    return {
        launch.alias: ModelSlot(SlotKey.of(launch.server), launch.plan.parallel)
        for launch in planned.launches
        if launch.server.slot_save_path is not None
    }


class SetSlots:
    """The set's saved slots: the client's last prompt to each model, and its save and restore
    through the model's own process."""

    def __init__(
        self,
        router: httpx.AsyncClient,
        engines: httpx.AsyncClient,
        folder: Path,
        models: Mapping[str, ModelSlot],
    ) -> None:
        self.router = router
        """The router (its base URL and the API key): loads and the models' ports."""
        self.engines = engines
        """The models' own processes, on loopback ports with no key."""
        self.folder = folder
        self.models = dict(models)
        """Each saving model's slot, by alias; a re-plan puts its new key here."""
        self.note: Callable[[str], None] = lambda _line: None
        """Writes one line into the set's log."""
        self.list_wait_s = LIST_WAIT_S
        """How long finding the loaded models waits for a router that answers no list."""
        self._prompts: dict[str, ClientPrompt] = {}
        self._holders: dict[str, SlotHolder] = {}
        self.last: dict[str, str] = {}
        """What the last save or restore of each model's slot did, in status's words."""

    def sent(self, alias: str, path: str, body: bytes) -> None:
        """A client's generation request to ``alias`` as the router got it."""
        model = self.models.get(alias)
        if model is not None:
            prompt = ClientPrompt(path, body, time.monotonic())
            self._prompts[alias] = kept_prompt(self._prompts.get(alias), prompt, model.slots)

    def saved(self, alias: str) -> bool:
        """Whether a slot file of ``alias`` is there to restore (its key is checked then)."""
        model = self.models.get(alias)
        return model is not None and (self.folder / model.key.file_name).is_file()

    async def save(self, alias: str) -> str | None:
        """Save ``alias``'s slot before its process goes, seated on the client's last prompt
        first; nothing when it holds no client conversation that no file holds yet. Why its
        conversation was not saved; None when it was, or had nothing to save."""
        model = self.models.get(alias)
        prompt = self._prompts.get(alias)
        holder = self._holders.setdefault(alias, SlotHolder())
        if model is None or prompt is None or not holder.unsaved_client(prompt.sent_s, None):
            return None
        try:
            url = await self._process_url(alias)
        except ModelListError as exc:
            why = f"could not list the set's models: {exc}"
            self._failed_save(alias, why)
            return why
        if url is None:
            self.note(f"{alias}: slot not saved: it is not loaded")
            return "it is not loaded"
        if model.key.mmproj_path is None:  # a projector turns prompt reuse off: nothing to seat
            seated = await reseat_slot(self.engines, url, {}, prompt)
            if seated.failure is not None:
                self.note(f"{alias}: slot reseat failed: {seated.failure}")
        done = await save_slot(self.engines, url, {}, self.folder, model.key)
        if done.failure is None:
            holder.saved_s = time.monotonic()
        self._said(alias, "save", done)
        return done.failure

    async def save_loaded(self) -> dict[str, str]:
        """Save the slot of every model loaded now, all at once (the set is stopping): why
        each model's save failed, by alias; one failing leaves the others' saves as they go.

        Raises:
            ModelListError: the router listed no models, so none was saved.
        """
        aliases = list(loaded_children(await router_list(self.router, self.list_wait_s)))
        outcomes = await asyncio.gather(
            *(self._save_within(alias) for alias in aliases), return_exceptions=True
        )
        failed: dict[str, str] = {}
        for alias, outcome in zip(aliases, outcomes, strict=True):
            if isinstance(outcome, BaseException):
                why = f"lucebox could not save it ({type(outcome).__name__}: {outcome})"
                self._failed_save(alias, why)
                failed[alias] = why
            elif outcome is not None:
                failed[alias] = outcome
        return failed

    async def _save_within(self, alias: str) -> str | None:
        """:meth:`save` given up after :data:`SAVE_WITHIN_S`; why it failed, or None."""
        try:
            async with asyncio.timeout(SAVE_WITHIN_S):
                return await self.save(alias)
        except TimeoutError:
            why = f"it took longer than {SAVE_WITHIN_S:.0f} s"
            self._failed_save(alias, why)
            return why

    def _failed_save(self, alias: str, why: str) -> None:
        """A save that ended with no result of the engine's, said as :meth:`_said` says one."""
        self.last[alias] = f"save failed: {why}"
        self.note(f"{alias}: slot save failed: {why}")

    async def restore(self, alias: str) -> None:
        """Load ``alias`` through the router and restore its saved slot into the new process,
        when one is saved (a file saved for another launch is not restored)."""
        if not self.saved(alias):
            return
        key = self.models[alias].key
        try:
            ready = await self.router.get(
                "/props", params={"model": alias, "autoload": "true"}, timeout=LOAD_TIMEOUT_S
            )
        except httpx.HTTPError as exc:
            self.note(f"{alias}: slot not restored: the router did not load it ({exc})")
            return
        try:
            url = await self._process_url(alias) if ready.status_code == 200 else None
        except ModelListError as exc:
            self.note(f"{alias}: slot not restored: could not list the set's models: {exc}")
            return
        if url is None:
            self.note(f"{alias}: slot not restored: it did not load ({ready.status_code})")
            return
        done = await restore_slot(self.engines, url, {}, self.folder, key)
        self._holders.setdefault(alias, SlotHolder()).engine_ready(time.monotonic())
        self._said(alias, "restore", done)

    async def _process_url(self, alias: str) -> str | None:
        """The address of ``alias``'s own process while it is loaded; None when it is not.

        Raises:
            ModelListError: the router listed no models, so whether it is loaded is unknown.
        """
        port = loaded_children(await router_list(self.router, self.list_wait_s)).get(alias)
        return None if port is None else f"http://{CHILD_HOST}:{port}"

    def _said(self, alias: str, action: str, done: SlotResult) -> None:
        """The log's lines for one save or restore, in the single engine's words, and
        status's."""
        said = restore_words(done) if action == "restore" else _save_words(done)
        if said is not None:
            self.last[alias] = said
        if done.tokens:
            self.note(f"{alias}: slot {action}d ({done.tokens} tokens)")
        if done.failure is not None:
            self.note(f"{alias}: slot {action} failed: {done.failure}")
        elif done.miss is not None:
            self.note(f"{alias}: slot not restored: {done.miss}; the slot is ignored")


def _save_words(done: SlotResult) -> str | None:
    if done.tokens is not None:
        return f"saved ({done.tokens} tokens)"
    return f"save failed: {done.failure}" if done.failure is not None else None
