"""A client's conversation kept in llama-server's slot across the engine's restarts: the slot is
saved before every stop lucebox asks for (and before lucebox's own requests take it), seated
first on the client's last prompt, and restored once the next engine is ready (slots.py holds
the requests and the rules of the key)."""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Literal

import httpx

from lucebox.engine.core.api import auth_headers
from lucebox.engine.core.paths import Paths
from lucebox.engine.engines import kinds
from lucebox.engine.run.front.front import Front
from lucebox.engine.run.runstate import write_slot_save
from lucebox.engine.run.sample import CacheStatus
from lucebox.engine.run.slots import (
    SlotHolder,
    SlotKey,
    reseat_slot,
    restore_slot,
    restore_words,
    save_slot,
)
from lucebox.engine.run.supervisor import Supervisor


@dataclass
class SlotKeeper:
    """The slot's saves and restores for one run, and what `status` says of them."""

    paths: Paths
    supervisor: Supervisor
    url: str
    """The engine itself (its private port behind the front)."""
    holder: SlotHolder = field(default_factory=SlotHolder)
    """Whether the engine's slot holds a client's conversation no file holds yet."""
    save_failure: str | None = None
    """Why the last save failed; None once one succeeded."""
    last_restore: str | None = None

    def with_save_failure(self, cache: CacheStatus | None) -> CacheStatus:
        """``cache`` (an empty one when None) saying why the last save failed, if it did."""
        return replace(cache or CacheStatus(None, 0), slot_save_failure=self.save_failure)

    async def act(
        self,
        action: Literal["save", "restore"],
        front: Front | None,
        api_key: str | None,
        *,
        stopping: bool = True,
        now_s: float,
    ) -> bool:
        """Saves or restores the slot; whether a save was tried (its failure is kept in
        :attr:`save_failure` and in the file `lucebox down` reads)."""
        spec = self.supervisor.launch
        if spec.slot_save_path is None:
            return False
        headers = auth_headers(api_key)
        act = save_slot if action == "save" else restore_slot
        async with httpx.AsyncClient() as client:
            if action == "restore":
                self.holder.engine_ready(now_s)
            elif not await self._seat(client, headers, front, stopping=stopping):
                return False
            done = await act(client, self.url, headers, Path(spec.slot_save_path), SlotKey.of(spec))
            if action == "save" and done.failure is None:
                self.holder.saved_s = now_s
            if action == "restore":
                self.last_restore = restore_words(done)
        log = self.supervisor.log
        if done.tokens:
            log.write(f"# lucebox: slot {action}d ({done.tokens} tokens)")
        if done.failure is not None:
            log.write(f"# lucebox: slot {action} failed: {done.failure}")
        if action != "save":
            return False
        # The next start computes the prompt again: status says why it is slow, until a later
        # save succeeds.
        self.save_failure = done.failure
        write_slot_save(self.paths, done.failure)
        return True

    def cache_status(self, cache: CacheStatus) -> CacheStatus:
        """The sampler's cache status with the last save's failure and restore."""
        restored = self.last_restore or cache.last_restore
        return replace(cache, slot_save_failure=self.save_failure, last_restore=restored)

    async def _seat(
        self,
        client: httpx.AsyncClient,
        headers: dict[str, str],
        front: Front | None,
        *,
        stopping: bool,
    ) -> bool:
        """Whether the slot is saved now: it holds a client's conversation no file holds yet,
        seated on the client's last prompt first (slots.py says why); a slot that last served
        lucebox's own request is not (the file keeps the conversation saved before it)."""
        launch, log = self.supervisor.launch, self.supervisor.log
        if front is None or not kinds.kind(launch.kind).seats_saved_slot:
            return stopping  # no front to say whose the slot is, or no llama-server: as before
        prompt = front.client_prompt
        client_s = prompt.sent_s if prompt is not None else None
        own = self.supervisor.own_requests
        if self.holder.lucebox_last(client_s, own.last_sent_s):
            if stopping:
                log.write(
                    "# lucebox: slot not saved: it holds lucebox's own request;"
                    " the conversation saved before is kept"
                )
            return False
        if prompt is None or not self.holder.unsaved_client(client_s, own.last_sent_s):
            return False  # the slot holds the file restored, or nothing
        if launch.mmproj_path is not None:
            return True  # a projector turns the engine's prompt reuse off: nothing to seat
        with own.sending() as answered:
            seated = await reseat_slot(client, self.url, headers, prompt)
            if seated.failure is None:
                answered.append(True)
        if seated.failure is not None:
            log.write(f"# lucebox: slot reseat failed: {seated.failure}")
        else:
            read = "" if seated.tokens is None else f" ({seated.tokens} tokens read)"
            log.write(f"# lucebox: slot seated on the client's last prompt{read}")
        return True
