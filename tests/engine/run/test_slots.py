"""A slot save cut short leaves the last good slot: the engine's file is renamed over it only
once the engine said the save succeeded; a slot is restored only into the launch and build
that saved it, whole; the slot is saved as the client's next prompt's prefix, never as
lucebox's own request."""

from __future__ import annotations

import json
import os
from dataclasses import replace
from pathlib import Path

import httpx

from lucebox.engine.core import slotstore
from lucebox.engine.core.prefixstore import build_of
from lucebox.engine.core.units import GIB
from lucebox.engine.plan.savedslots import slots_reason
from lucebox.engine.run.slots import (
    ClientPrompt,
    SlotHolder,
    SlotKey,
    reseat_body,
    restore_slot,
    restore_words,
    save_slot,
)

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


async def test_a_slot_saved_by_another_engine_build_is_not_restored(tmp_path):
    """A state file's layout is its build's own: a rebuilt engine (another binary) gets none."""
    binary = tmp_path / "llama-server"
    binary.write_bytes(b"build one")
    old = SlotKey("smoke", "/m/smoke.gguf", 4096, "f16", "f16", None, build_of(str(binary)))
    folder = tmp_path / "slots"
    folder.mkdir()
    async with engine(folder, full_disk=False) as client:
        assert (await save_slot(client, "http://e", {}, folder, old)).tokens == 14
        binary.write_bytes(b"build two, longer")
        new = replace(old, engine_build=build_of(str(binary)))
        assert new != old
        nothing = await restore_slot(client, "http://e", {}, folder, new)
        assert nothing.tokens is None and nothing.failure is None
        assert restore_words(nothing) == "not restored: saved with another engine build"
        other_kv = replace(old, cache_type_k="q8_0", cache_type_v="q8_0", ctx=8192)
        missed = await restore_slot(client, "http://e", {}, folder, other_kv)
        assert restore_words(missed) == "not restored: saved with another KV type, another context"
        restored = await restore_slot(client, "http://e", {}, folder, old)
        assert restore_words(restored) == "restored the saved slot (14 tokens)"


async def test_a_cut_or_unreadable_slot_is_ignored_with_a_note(tmp_path):
    """A file shorter than the one saved (a copy cut short, a disk error) or a record that no
    longer parses is never sent to the engine: the restore says why and restores nothing."""
    async with engine(tmp_path, full_disk=False) as client:
        assert (await save_slot(client, "http://e", {}, tmp_path, KEY)).tokens == 14
        (tmp_path / KEY.file_name).write_bytes(b"whole")
        cut = await restore_slot(client, "http://e", {}, tmp_path, KEY)
        assert cut.tokens is None
        assert cut.failure == "the saved slot is 5 bytes, not the 14 saved; the slot is ignored"
        assert restore_words(cut) == f"not restored: {cut.failure}"
        (tmp_path / f"{KEY.file_name}.json").write_text("{not json")
        unreadable = await restore_slot(client, "http://e", {}, tmp_path, KEY)
        assert unreadable.tokens is None and unreadable.failure is not None
        assert "record is unreadable" in unreadable.failure


def test_the_reseat_sends_the_clients_last_request_again_for_no_token():
    """The client's last chat request, sent again so the slot holds the exact prefix of its
    next turn: no generation prompt, no token, never streamed, on the agent's slot."""
    sent = {
        "messages": [{"role": "user", "content": "Hi"}],
        "stream": True,
        "stream_options": {"include_usage": True},
        "max_completion_tokens": 512,
        "tools": [{"type": "function", "function": {"name": "ls"}}],
    }
    prompt = ClientPrompt("/v1/chat/completions", json.dumps(sent).encode(), 1.0)
    body = reseat_body(prompt)
    assert body == {
        "messages": sent["messages"],
        "tools": sent["tools"],
        "add_generation_prompt": False,
        "max_tokens": 0,
        "n_predict": 0,
        "id_slot": 0,
        "cache_prompt": True,
    }
    # The engine's Anthropic conversion drops add_generation_prompt: the prompt as it was.
    anthropic = {"messages": sent["messages"], "max_tokens": 1024, "stream": True}
    as_sent = ClientPrompt("/v1/messages", json.dumps(anthropic).encode(), 1.0)
    assert reseat_body(as_sent) == {
        "messages": sent["messages"],
        "max_tokens": 0,
        "n_predict": 0,
        "id_slot": 0,
        "cache_prompt": True,
    }
    # A Responses call keeps its other keys through the conversion, as a chat does.
    responses = {"input": "Hi", "max_output_tokens": 64}
    body = reseat_body(ClientPrompt("/responses", json.dumps(responses).encode(), 1.0))
    assert body is not None and body["add_generation_prompt"] is False
    assert body["max_output_tokens"] == 0
    assert reseat_body(ClientPrompt("/v1/chat/completions", b"{half", 1.0)) is None


def test_the_slot_holder_saves_a_clients_turn_once_and_never_lucebox_own():
    holder = SlotHolder()
    holder.engine_ready(10.0)
    assert not holder.unsaved_client(5.0, None)  # before this engine: the restored file
    assert holder.unsaved_client(11.0, None)
    holder.saved_s = 12.0
    assert not holder.unsaved_client(11.0, 12.0)  # saved, then the reseat's own request
    assert not holder.lucebox_last(11.0, 11.5)  # the reseat before that save
    assert holder.lucebox_last(11.0, 13.0)  # a probe after the save
    assert not holder.unsaved_client(11.0, 13.0)
    assert holder.unsaved_client(14.0, 13.0)  # the client came back after the probe


async def test_a_slot_saved_for_an_older_version_of_the_model_file_is_not_restored(tmp_path):
    """An update in place keeps the path: the file's size and time tell the versions apart."""
    old = replace(KEY, model_bytes=1000, model_mtime_ns=1)
    async with engine(tmp_path, full_disk=False) as client:
        assert (await save_slot(client, "http://e", {}, tmp_path, old)).tokens == 14
        updated = replace(old, model_bytes=1200, model_mtime_ns=2)
        missed = await restore_slot(client, "http://e", {}, tmp_path, updated)
    assert restore_words(missed) == "not restored: saved with another version of the model file"


def _saved(folder: Path, alias: str, model: str, size: int, tokens: int, at_s: int) -> Path:
    """A slot as save_slot leaves it: the file, and its record with the key, bytes, tokens."""
    key = SlotKey(alias, model, 4096, "f16", "f16")
    folder.mkdir(parents=True, exist_ok=True)
    slot = folder / key.file_name
    slot.write_bytes(b"s" * size)
    record = {**key.to_json(), "bytes": size, "tokens": tokens}
    (folder / f"{key.file_name}.json").write_text(json.dumps(record))
    os.utime(slot, (at_s, at_s))
    return slot


def test_the_slots_folder_is_trimmed_least_recently_saved_first_never_the_launch_s_own(tmp_path):
    oldest = _saved(tmp_path, "a", "/m/a.gguf", 400, 40, 100)
    own = _saved(tmp_path, "b", "/m/b.gguf", 300, 30, 50)
    in_a_set = _saved(tmp_path / "sets" / "a-b-123", "c", "/m/c.gguf", 200, 20, 200)
    newest = _saved(tmp_path, "d", "/m/d.gguf", 100, 10, 300)
    kept = slotstore.usage(tmp_path)
    assert (kept.conversations, kept.bytes, kept.tokens) == (4, 1000, 100)
    removed = slotstore.trim(tmp_path, own, budget_bytes=500)
    assert removed == [oldest, in_a_set]
    assert not (tmp_path / "a.slot.json").exists()
    assert sorted(slotstore.saved_slots(tmp_path)) == sorted([own, newest])
    assert slotstore.trim(tmp_path, own, budget_bytes=500) == []


def test_a_removed_model_s_slots_go_with_it_the_others_stay(tmp_path):
    gone = _saved(tmp_path, "a", str(tmp_path / "a.gguf"), 10, 1, 1)
    in_a_set = _saved(tmp_path / "sets" / "s-1", "a", str(tmp_path / "a.gguf"), 10, 1, 1)
    other = _saved(tmp_path, "b", str(tmp_path / "b.gguf"), 10, 1, 1)
    assert sorted(slotstore.forget_model(tmp_path, tmp_path / "a.gguf")) == sorted([gone, in_a_set])
    assert slotstore.saved_slots(tmp_path) == [other]


def test_plan_says_where_the_slots_are_kept_their_budget_and_what_they_hold(tmp_path):
    _saved(tmp_path, "a", "/m/a.gguf", 10, 2048, 1)
    reason = slots_reason(tmp_path, 12 * GIB, slotstore.usage(tmp_path))
    assert reason.startswith(f"{tmp_path}: the agent's conversation saved on every stop")
    assert "up to 12 GiB (a quarter of the free disk, at most 64 GiB)" in reason
    assert reason.endswith("1 conversations saved now (2048 tokens, 0.0 GiB)")


def test_status_counts_the_saved_slots_and_sees_a_new_save(tmp_path):
    from lucebox.engine.run.prefixdisk import with_disk
    from lucebox.engine.run.sample import CacheStatus
    from tests.engine.run.test_luceboxserve import lucebox_spec

    folder = tmp_path / "slots"
    launch = replace(lucebox_spec(tmp_path), lucebox=None, slot_save_path=str(folder))
    _saved(folder, "a", "/m/a.gguf", 10, 2048, 1)
    first = with_disk(CacheStatus(None, 0), launch)
    assert (first.disk_store, first.disk_entries, first.disk_tokens) == ("slots", 1, 2048)
    _saved(folder, "b", "/m/b.gguf", 10, 100, 2)
    os.utime(folder, ns=(5, 5))  # the folder's change, apart from the first read's clock tick
    again = with_disk(CacheStatus(None, 0), launch)
    assert (again.disk_entries, again.disk_tokens, again.disk_bytes) == (2, 2148, 20)
