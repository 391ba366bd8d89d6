"""A client's conversation survives a stop and start of the run, and a calibration's probe in
between, on the real CPU llama-server behind lucebox's front: the turn after each is read from
the restored slot, not again in full. Each start's warm-up request runs before the restore, so
it never displaces the conversation, and it is never counted as a client's request.

Two models: SmolLM2 (plain attention, whose cache rolls back to any prefix) and a generated
qwen35 hybrid, whose recurrent state rolls back only to an in-memory checkpoint, which a slot
file does not carry: its restored state must be an exact prefix of the next turn. The client
sends its earlier replies back as clients do (re-rendered by the template, so their tokens may
differ from those generated).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

import httpx
import pytest

from lucebox.engine.core.paths import resolve_paths
from lucebox.engine.core.prefixstore import build_of
from lucebox.engine.engines import registry
from lucebox.engine.run.calibrate.probing import WARM_UP, ask
from lucebox.engine.run.slots import SlotKey, restore_slot, save_slot
from support.agentrun import Served, agent_launch
from support.engineserver import running_server
from support.ggufgen import cached_gguf, qwen35_target
from support.realmodels import smol_model

pytestmark = pytest.mark.slow

CTX = 8192
NOTE = "Here is a long project note to keep in mind. "
MODELS: dict[str, tuple[Callable[[], Path], int]] = {
    # the generated model's tokenizer reads one byte a token; SmolLM2's about a word
    "qwen35-hybrid": (lambda: cached_gguf(qwen35_target(mtp=False, n_ctx=32768)), 60),
    "smollm2": (smol_model, 250),
}
WARM_TOKENS = 300
"""A warm turn reads its new user message and the reply sent back; a cold one all ~3,000."""


async def finished_requests(served: Served, count: int) -> int:
    """The requests the engine finished as the run counts them: once ``count`` are (or 10 s),
    and a sampling interval later, for any other the engine's log reports late."""
    for _ in range(100):
        sample = served.run.status.sample
        if sample is not None and sample.requests_finished_total >= count:
            break
        await asyncio.sleep(0.1)
    await asyncio.sleep(1.5)
    sample = served.run.status.sample
    return sample.requests_finished_total if sample is not None else 0


def warm_up_then_restore(log: Path) -> list[bool]:
    """For each engine start in ``log`` that restored the slot: whether its warm-up was
    answered before the restore."""
    starts = log.read_text(errors="replace").split("# lucebox: starting")[1:]
    return [
        "# lucebox: warm-up answered" in start.split("# lucebox: slot restored")[0]
        for start in starts
        if "# lucebox: slot restored" in start
    ]


async def turn(url: str, messages: list[dict[str, str]], question: str) -> dict[str, int]:
    """One chat turn as a client sends it: the history with the earlier replies, the reply
    appended; the reply's timings."""
    messages.append({"role": "user", "content": question})
    body = {"messages": messages, "max_tokens": 12, "temperature": 0}
    async with httpx.AsyncClient(timeout=600) as client:
        reply = await client.post(f"{url}/v1/chat/completions", json=body)
    assert reply.status_code == 200, reply.text
    answer = reply.json()
    messages.append({"role": "assistant", "content": answer["choices"][0]["message"]["content"]})
    return answer["timings"]


@pytest.mark.parametrize("name", MODELS)
async def test_the_turn_after_a_restart_and_after_a_probe_is_read_from_the_saved_slot(
    built_engine_home, tmp_path, name
):
    make_model, repeats = MODELS[name]
    launch = agent_launch(built_engine_home, make_model(), tmp_path / "slots", CTX)
    # No host-RAM prompt cache: a request that took the slot (a warm-up after the restore)
    # would park the conversation there, and a warm turn would not prove the slot kept it.
    launch = replace(launch, plan=replace(launch.plan, cache_ram_mib=0))
    (tmp_path / "slots").mkdir()
    home, log = tmp_path / "home", tmp_path / "engine.log"
    messages = [{"role": "system", "content": "You are a coding agent. " + NOTE * repeats}]

    first = Served(launch, home, log)
    try:
        await first.ready()
        url = first.run.public_url
        cold = await turn(url, messages, "What is the note about?")
        assert cold["prompt_n"] > 2000, cold
        warm = await turn(url, messages, "tool result: ok")
        assert warm["prompt_n"] < WARM_TOKENS, warm  # in memory: the engine's own checkpoints
        # Both turns are the client's; the warm-up before them is lucebox's own: neither the
        # engine's finished requests nor the front's served mix count it.
        assert await finished_requests(first, 2) == 2
        assert first.run.front is not None
        assert (first.run.front.sampling.greedy, first.run.front.sampling.sampled) == (2, 0)
    finally:
        await first.stop()

    second = Served(launch, home, log)
    try:
        await second.ready()
        url = second.run.public_url
        after_restart = await turn(url, messages, "tool result: done")
        # A calibration's probe takes the only slot, then the run restarts (a trial).
        async with httpx.AsyncClient(timeout=600) as client:
            assert await ask(client, second.run, WARM_UP) is not None
        pid = second.run.status.engine_pid
        second.run.restart()
        await second.ready(not_pid=pid)
        after_probe = await turn(url, messages, "tool result: all tests pass")
    finally:
        await second.stop()

    whole = after_restart["prompt_n"] + after_restart["cache_n"]
    assert after_restart["prompt_n"] < WARM_TOKENS < whole, after_restart
    assert after_probe["prompt_n"] < WARM_TOKENS, after_probe
    # The restart and the trial's restart each warmed the engine up, then restored the slot.
    assert warm_up_then_restore(log) == [True, True]
    said = log.read_text(errors="replace")
    assert "# lucebox: slot seated on the client's last prompt" in said
    assert "# lucebox: slot not saved: it holds lucebox's own request" in said


async def test_a_garbled_or_cut_slot_file_is_ignored_and_the_engine_serves_on(
    built_engine_home, tmp_path
):
    """A slot file garbled on disk is refused by the real engine (lucebox says why and the
    engine keeps serving); one cut short is never sent to it."""
    paths = resolve_paths({"LUCEBOX_HOME": str(built_engine_home)})
    llama = next(e for e in registry.list_engines(paths) if e.kind == "llama-server")
    model = MODELS["qwen35-hybrid"][0]()
    key = SlotKey("agent", str(model), 2048, "f16", "f16", None, build_of(llama.server_path))
    slots = tmp_path / "slots"
    slots.mkdir()
    args = ["--slot-save-path", str(slots)]
    with running_server(Path(llama.server_path), model, args) as server:
        server.complete("hello world " * 40, 4, cache_prompt=True)
        async with httpx.AsyncClient(timeout=60) as client:
            saved = await save_slot(client, server.url, {}, slots, key)
            assert saved.tokens is not None and saved.tokens > 400, saved
            whole = (slots / key.file_name).read_bytes()
            (slots / key.file_name).write_bytes(whole[:64] + bytes(len(whole) - 64))
            garbled = await restore_slot(client, server.url, {}, slots, key)
            assert garbled.tokens is None and garbled.failure is not None
            assert garbled.failure.startswith("the engine refused the restore (400:"), garbled
            (slots / key.file_name).write_bytes(whole[: len(whole) // 2])
            cut = await restore_slot(client, server.url, {}, slots, key)
            assert cut.failure is not None and cut.failure.endswith("the slot is ignored")
        assert server.complete("hello world", 4)["timings"]["predicted_n"] == 4
