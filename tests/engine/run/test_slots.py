"""A slot save cut short leaves the last good slot: the engine's file is renamed over it only
once the engine said the save succeeded."""

from __future__ import annotations

import json
from pathlib import Path

import httpx

from lucebox.engine.run.slots import SlotKey, restore_slot, save_slot

KEY = SlotKey("smoke", "/m/smoke.gguf", 4096, "f16", "f16")


def engine(folder: Path, *, full_disk: bool) -> httpx.AsyncClient:
    """The engine's /slots save as llama-server does it: the named file written in place, cut
    short with an error reply when the disk is full."""

    def answer(request: httpx.Request) -> httpx.Response:
        name = json.loads(request.content)["filename"]
        if request.url.params["action"] == "restore":
            return httpx.Response(200, json={"n_restored": len((folder / name).read_bytes())})
        (folder / name).write_bytes(b"half" if full_disk else b"whole new slot")
        if full_disk:
            return httpx.Response(500, json={"error": {"message": "failed to save slot"}})
        return httpx.Response(200, json={"n_saved": 14})

    return httpx.AsyncClient(transport=httpx.MockTransport(answer))


async def test_a_failed_save_keeps_the_last_good_slot_and_a_good_one_replaces_it(tmp_path):
    (tmp_path / KEY.file_name).write_bytes(b"old good slot")
    (tmp_path / f"{KEY.file_name}.json").write_text(json.dumps(KEY.to_json()))
    async with engine(tmp_path, full_disk=True) as client:
        failed = await save_slot(client, "http://e", {}, tmp_path, KEY)
        assert failed.tokens is None
        assert failed.failure == (
            "the engine refused the save (500: failed to save slot); the slot saved before is kept"
        )
        restored = await restore_slot(client, "http://e", {}, tmp_path, KEY)
        assert restored.tokens == len(b"old good slot") and restored.failure is None
    assert (tmp_path / KEY.file_name).read_bytes() == b"old good slot"
    assert sorted(p.name for p in tmp_path.iterdir()) == [KEY.file_name, f"{KEY.file_name}.json"]
    async with engine(tmp_path, full_disk=False) as client:
        assert (await save_slot(client, "http://e", {}, tmp_path, KEY)).tokens == 14
    assert (tmp_path / KEY.file_name).read_bytes() == b"whole new slot"
    assert sorted(p.name for p in tmp_path.iterdir()) == [KEY.file_name, f"{KEY.file_name}.json"]


async def test_a_first_save_that_fails_says_no_slot_is_kept_and_no_slot_restores_quietly(tmp_path):
    async with engine(tmp_path, full_disk=True) as client:
        failed = await save_slot(client, "http://e", {}, tmp_path, KEY)
        assert failed.failure is not None and failed.failure.endswith("no slot is kept")
        nothing = await restore_slot(client, "http://e", {}, tmp_path, KEY)
    assert nothing.tokens is None and nothing.failure is None
    assert list(tmp_path.iterdir()) == []


async def test_a_slot_saved_with_a_projector_is_not_restored_without_it(tmp_path):
    """--vision on, then off: the slot may hold an image's tokens, which llama-server refuses
    to restore without the projector; lucebox does not ask."""
    with_vision = SlotKey("smoke", "/m/smoke.gguf", 4096, "f16", "f16", "/m/mmproj-smoke.gguf")
    async with engine(tmp_path, full_disk=False) as client:
        assert (await save_slot(client, "http://e", {}, tmp_path, with_vision)).tokens == 14
        nothing = await restore_slot(client, "http://e", {}, tmp_path, KEY)
        assert nothing.tokens is None and nothing.failure is None
        again = await restore_slot(client, "http://e", {}, tmp_path, with_vision)
        assert again.tokens == len(b"whole new slot")
