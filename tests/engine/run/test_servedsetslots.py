"""The set's saved slots through the proxy, in front of a router and model processes that
answer like the real ones (scripted: a save writes the file, the calls are recorded); the
real router is in tests/e2e/test_served_set_slots.py."""

from __future__ import annotations

import asyncio
import json
import os
import time
from pathlib import Path

import httpx

from lucebox.engine.core.paths import resolve_paths
from lucebox.engine.plan.launch import ServerLaunch
from lucebox.engine.run import runstate
from lucebox.engine.run.servedset import servedsetslots
from lucebox.engine.run.servedset.admission import Placement
from lucebox.engine.run.servedset.servedsetproxy import ModelGate, ServedSetProxy
from lucebox.engine.run.servedset.servedsetrun import ServedSetRun
from lucebox.engine.run.servedset.servedsetslots import (
    ModelSlot,
    SetSlots,
    set_slot_folder,
)
from lucebox.engine.run.slots import SlotKey
from lucebox.engine.run.supervisor import Supervisor
from support.frontserver import loopback_policy
from support.ports import free_port
from tests.engine.run.test_servedsetproxy import Streamed, loading_answer
from tests.engine.run.test_supervisor import plan  # noqa: F401 (the fixture)

MIB = 2**20
PLACEMENTS = {"smollm2": Placement("ram", 563 * MIB), "smoke": Placement("ram", 891 * MIB)}
ROOM = {"ram": 960 * MIB}  # one at a time
PORTS = {"smollm2": 9001, "smoke": 9002}
JSON = {"content-type": "application/json"}
KEYS = {a: SlotKey(a, f"/models/{a}.gguf", 4096, "f16", "f16") for a in PLACEMENTS}


class FakeSet:
    """The router (``/models`` with each loaded model's port in its argv, ``/props?model=``
    loads, ``/models/unload``, a chat answered) and each model's own process (the reseat, and
    ``/slots/0`` save, which writes the file, and restore)."""

    def __init__(self, folder: Path, loaded: set[str]) -> None:
        self.folder = folder
        self.loaded = loaded
        self.calls: list[tuple[str, str]] = []
        self.transport = httpx.MockTransport(self.answer)

    def answer(self, request: httpx.Request) -> httpx.Response:
        path = request.url.path
        if request.url.port in PORTS.values():
            alias = next(a for a, p in PORTS.items() if p == request.url.port)
            return self._process(alias, request)
        if request.method == "GET" and path == "/models":
            data = [
                {
                    "id": a,
                    "status": {"value": "loaded", "args": ["llama-server", "--port", str(PORTS[a])]}
                    if a in self.loaded
                    else {"value": "unloaded"},
                }
                for a in PLACEMENTS
            ]
            return httpx.Response(200, json={"data": data})
        alias = request.url.params.get("model") or json.loads(request.content)["model"]
        self.calls.append((path, alias))
        if path == "/props":
            self.loaded.add(alias)
        elif path == "/models/unload":
            self.loaded.discard(alias)
        elif path == "/v1/chat/completions":
            self.loaded.add(alias)  # the router loads a model a request names
        # Streamed, as the proxy reads a real router's answer.
        document = json.dumps({"success": True, "model": alias}).encode()
        return httpx.Response(200, headers=JSON, stream=Streamed(document))

    def _process(self, alias: str, request: httpx.Request) -> httpx.Response:
        action = request.url.params.get("action", request.url.path)
        self.calls.append((f"{alias} {action}", alias))
        if action == "/v1/chat/completions":
            body = json.loads(request.content)
            assert body["max_tokens"] == 0 and body["add_generation_prompt"] is False
            return httpx.Response(200, json={"timings": {"prompt_n": 3}})
        if action == "save":
            (self.folder / json.loads(request.content)["filename"]).write_bytes(b"s" * 100)
            return httpx.Response(200, json={"n_saved": 40})
        return httpx.Response(200, json={"n_restored": 40})


def proxy_of(fake: FakeSet, notes: list[str]) -> tuple[ServedSetProxy, ModelGate]:
    router = httpx.AsyncClient(base_url="http://router", transport=fake.transport)
    models = {a: ModelSlot(k) for a, k in KEYS.items()}
    slots = SetSlots(router, router, fake.folder, models)
    slots.note = notes.append
    gate = ModelGate(router, PLACEMENTS, ROOM, slots)
    return ServedSetProxy(router, gate, loopback_policy()), gate


async def chat(proxy: ServedSetProxy, model: str) -> httpx.Response:
    server = await asyncio.start_server(proxy.handle, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    body = {"model": model, "messages": [{"role": "user", "content": "Hi"}], "stream": True}
    try:
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}") as client:
            return await client.post("/v1/chat/completions", json=body)
    finally:
        server.close()


async def test_an_evicted_model_is_saved_first_and_restored_before_its_next_request(tmp_path):
    fake = FakeSet(tmp_path, {"smollm2"})
    notes: list[str] = []
    proxy, gate = proxy_of(fake, notes)
    assert (await chat(proxy, "smollm2")).status_code == 200
    assert (await chat(proxy, "smoke")).status_code == 200
    # Seated on the client's last prompt, saved from its own process, then unloaded.
    assert fake.calls[1:4] == [
        ("smollm2 /v1/chat/completions", "smollm2"),
        ("smollm2 save", "smollm2"),
        ("/models/unload", "smollm2"),
    ]
    assert fake.calls[4:] == [("/v1/chat/completions", "smoke")]  # nothing saved to restore
    fake.calls.clear()
    assert (await chat(proxy, "smollm2")).status_code == 200
    assert fake.calls == [
        ("smoke /v1/chat/completions", "smoke"),
        ("smoke save", "smoke"),
        ("/models/unload", "smoke"),
        ("/props", "smollm2"),  # the router loads it, and it is restored before the request
        ("smollm2 restore", "smollm2"),
        ("/v1/chat/completions", "smollm2"),
    ]
    assert notes == [
        "smollm2: slot saved (40 tokens)",
        "smoke: slot saved (40 tokens)",
        "smollm2: slot restored (40 tokens)",
    ]
    record = json.loads((tmp_path / "smollm2.slot.json").read_text())
    assert record == {**KEYS["smollm2"].to_json(), "bytes": 100, "tokens": 40}
    # Status says each model's last save or restore.
    assert gate.slots.last == {
        "smollm2": "restored the saved slot (40 tokens)",
        "smoke": "saved (40 tokens)",
    }


async def test_a_slot_saved_for_another_launch_or_cut_short_is_ignored_with_a_note(tmp_path):
    fake = FakeSet(tmp_path, set())
    notes: list[str] = []
    proxy, gate = proxy_of(fake, notes)
    other = {**KEYS["smollm2"].to_json(), "ctx": 8192, "bytes": 100}
    (tmp_path / "smollm2.slot").write_bytes(b"s" * 100)
    (tmp_path / "smollm2.slot.json").write_text(json.dumps(other))
    await chat(proxy, "smollm2")
    cut = {**KEYS["smoke"].to_json(), "bytes": 200}
    (tmp_path / "smoke.slot").write_bytes(b"s" * 100)
    (tmp_path / "smoke.slot.json").write_text(json.dumps(cut))
    await chat(proxy, "smoke")
    assert not [call for call in fake.calls if call[0].endswith("restore")]
    assert notes == [
        "smollm2: slot not restored: saved with another context; the slot is ignored",
        "smollm2: slot saved (40 tokens)",  # its conversation, over the file of the other
        "smoke: slot restore failed: the saved slot is 100 bytes, not the 200 saved; "
        "the slot is ignored",
    ]
    assert gate.cold == set()
    assert gate.slots.last == {
        "smollm2": "saved (40 tokens)",
        "smoke": "not restored: the saved slot is 100 bytes, not the 200 saved; the slot is "
        "ignored",
    }


async def test_an_idle_model_is_saved_and_unloaded_by_the_proxy_a_busy_one_stays(tmp_path):
    fake = FakeSet(tmp_path, {"smollm2"})
    notes: list[str] = []
    proxy, gate = proxy_of(fake, notes)
    await chat(proxy, "smollm2")
    fake.loaded.add("smoke")  # past the gate (the dashboard's key), and answering now
    gate.busy["smoke"] += 1
    idling = asyncio.create_task(gate.unload_idle(0.2))
    try:
        for _ in range(100):
            if "smollm2" not in fake.loaded:
                break
            await asyncio.sleep(0.05)
    finally:
        idling.cancel()
    assert fake.loaded == {"smoke"}
    assert fake.calls[-2:] == [("smollm2 save", "smollm2"), ("/models/unload", "smollm2")]
    assert notes == ["smollm2: slot saved (40 tokens)"]


def test_each_set_has_its_own_folder_whatever_order_it_is_named_in(tmp_path):
    one = set_slot_folder(tmp_path, ["smoke", "smollm2"])
    assert one == set_slot_folder(tmp_path, ["smollm2", "smoke"])
    assert one.parent == tmp_path / "sets" and one.name.startswith("smoke+smollm2-")
    assert one != set_slot_folder(tmp_path, ["smollm2", "smoke", "tiny"])


class SavingSet(FakeSet):
    """The set with both models loaded and each holding a client's conversation; each save
    waits until the other's has begun (saves one after the other never get there: the first
    one gives up after 5 s), then answers as ``saves`` says: ``"saved"``, ``"refused"`` (the
    engine's error), or ``"hung"`` (no answer)."""

    def __init__(self, folder: Path, saves: dict[str, str]) -> None:
        super().__init__(folder, set(PLACEMENTS))
        self.saves = saves
        self.saving = 0
        self.most_saving = 0
        self.both_saving = asyncio.Event()

    async def answer(self, request: httpx.Request) -> httpx.Response:  # type: ignore[override]
        alias = next((a for a, p in PORTS.items() if p == request.url.port), None)
        if alias is None or request.url.params.get("action") != "save":
            return super().answer(request)
        self.saving += 1
        self.most_saving = max(self.most_saving, self.saving)
        if self.saving == len(PLACEMENTS):
            self.both_saving.set()
        try:
            await asyncio.wait_for(self.both_saving.wait(), 5)
            if self.saves[alias] == "hung":
                await asyncio.sleep(60)
        finally:
            self.saving -= 1
        if self.saves[alias] == "refused":
            error = {"error": {"code": 500, "message": "failed to save slot"}}
            return httpx.Response(500, json=error)
        return super().answer(request)

    def slots(self, notes: list[str]) -> SetSlots:
        router = httpx.AsyncClient(base_url="http://router", transport=self.transport)
        slots = SetSlots(router, router, self.folder, {a: ModelSlot(k) for a, k in KEYS.items()})
        slots.note = notes.append
        body = json.dumps({"messages": [{"role": "user", "content": "Hi"}]}).encode()
        for alias in PLACEMENTS:
            slots.sent(alias, "/v1/chat/completions", body)
        return slots


async def test_a_stopping_set_saves_its_models_at_once_and_one_refused_keeps_the_other(
    tmp_path,
):
    fake = SavingSet(tmp_path, {"smollm2": "refused", "smoke": "saved"})
    notes: list[str] = []
    failed = await fake.slots(notes).save_loaded()
    assert fake.most_saving == 2  # both saves were under way together
    why = "the engine refused the save (500: failed to save slot); no slot is kept"
    assert failed == {"smollm2": why}
    assert (tmp_path / KEYS["smoke"].file_name).is_file()
    assert not (tmp_path / KEYS["smollm2"].file_name).exists()
    assert sorted(notes) == ["smoke: slot saved (40 tokens)", f"smollm2: slot save failed: {why}"]


async def test_a_save_that_never_ends_is_given_up_alone(tmp_path, monkeypatch):
    monkeypatch.setattr(servedsetslots, "SAVE_WITHIN_S", 0.5)
    fake = SavingSet(tmp_path, {"smollm2": "hung", "smoke": "saved"})
    notes: list[str] = []
    slots = fake.slots(notes)
    started_s = time.monotonic()
    failed = await slots.save_loaded()
    assert time.monotonic() - started_s < 5
    assert failed == {"smollm2": "it took longer than 0 s"}
    assert (tmp_path / KEYS["smoke"].file_name).is_file()
    assert slots.last == {
        "smollm2": "save failed: it took longer than 0 s",
        "smoke": "saved (40 tokens)",
    }
    assert "smollm2: slot save failed: it took longer than 0 s" in notes


async def test_a_set_stop_records_its_failed_saves_for_lucebox_down(
    plan,  # noqa: F811 (the fixture)
    tmp_path,
):
    paths = resolve_paths()
    spec = ServerLaunch(str(tmp_path / "llama-server"), "m.gguf", plan, "t", port=free_port())
    supervisor = Supervisor(spec, tmp_path / "engine.log", ready_timeout_s=10)
    failures = {"smollm2": "it took longer than 30 s", "smoke": "it is not loaded"}

    async def save_slots() -> dict[str, str]:
        return failures

    run = ServedSetRun(
        paths, supervisor, planned=(), public_url="http://127.0.0.1:1", save_slots=save_slots
    )
    try:
        run._engine_ready = True
        await run._engine_stopping()
        said = runstate.slot_save_failure(paths, os.getpid())
        assert said == "smollm2: it took longer than 30 s; smoke: it is not loaded"
        failures.clear()  # a later stop that saved them all says nothing
        await run._engine_stopping()
        assert runstate.slot_save_failure(paths, os.getpid()) is None
    finally:
        supervisor.log.close()


class StartingSet(SavingSet):
    """The set with both models holding a conversation, its router answering ``/models`` with
    503 "Loading model" (starting, restarting) to every look."""

    async def answer(self, request: httpx.Request) -> httpx.Response:  # type: ignore[override]
        if request.url.path == "/models":
            return loading_answer()
        return await super().answer(request)


async def test_a_set_stop_whose_router_lists_no_models_says_it_saved_nothing(
    plan,  # noqa: F811 (the fixture)
    tmp_path,
):
    fake = StartingSet(tmp_path, {"smollm2": "saved", "smoke": "saved"})
    notes: list[str] = []
    slots = fake.slots(notes)
    slots.list_wait_s = 0.3
    # An eviction's save says why, not that the model is not loaded.
    why = await slots.save("smollm2")
    assert why == "could not list the set's models: the router answered 503 (Loading model)"
    assert notes == [f"smollm2: slot save failed: {why}"]
    paths = resolve_paths()
    spec = ServerLaunch(str(tmp_path / "llama-server"), "m.gguf", plan, "t", port=free_port())
    supervisor = Supervisor(spec, tmp_path / "engine.log", ready_timeout_s=10)
    run = ServedSetRun(
        paths, supervisor, planned=(), public_url="http://127.0.0.1:1", save_slots=slots.save_loaded
    )
    try:
        run._engine_ready = True
        await run._engine_stopping()
    finally:
        supervisor.log.close()
    said = runstate.slot_save_failure(paths, os.getpid())
    assert said == (
        "could not list the set's models: the router answered 503 (Loading model); "
        "conversations not saved"
    )
    assert f"# lucebox: {said}" in (tmp_path / "engine.log").read_text()
    assert not [call for call in fake.calls if call[0].endswith("save")]
